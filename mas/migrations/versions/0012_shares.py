"""shares and quotas: each user's share of the GPU, their quotas and webhook secret; the fair queue's passes

Revision ID: 0012
Revises: 0011
"""
import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

QUOTAS = ('videos_per_day', 'videos_waiting', 'batches_at_once')


def upgrade() -> None:
    op.add_column('users', sa.Column('gpu_share', sa.Float(), nullable=False, server_default='1'))
    for column in QUOTAS:
        op.add_column('users', sa.Column(column, sa.Integer(), nullable=True))
    op.add_column('users', sa.Column('webhook_secret', sa.Text(), nullable=True))
    op.create_table(
        'fair_passes',
        sa.Column('user_name', sa.String(40), primary_key=True),
        sa.Column('pass_value', sa.Float(), nullable=False, server_default='0'),
    )


def downgrade() -> None:
    op.drop_table('fair_passes')
    for column in ('webhook_secret', *QUOTAS, 'gpu_share'):
        op.drop_column('users', column)
