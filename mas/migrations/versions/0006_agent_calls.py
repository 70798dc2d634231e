"""agent calls: what each role call to a model cost, and about which video or batch

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'agent_calls',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('agent', sa.String(length=64), nullable=False),
        sa.Column('task', sa.String(length=32), nullable=False),
        sa.Column('video_id', sa.Integer(), nullable=True),
        sa.Column('batch_id', sa.Integer(), nullable=True),
        sa.Column('tries', sa.Integer(), nullable=False),
        sa.Column('valid', sa.Boolean(), nullable=False),
        sa.Column('seconds', sa.Float(), nullable=False),
        sa.Column('prompt_tokens', sa.Integer(), nullable=False),
        sa.Column('cached_tokens', sa.Integer(), nullable=False),
        sa.Column('completion_tokens', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index('ix_agent_calls_video_id', 'agent_calls', ['video_id'])
    op.create_index('ix_agent_calls_batch_id', 'agent_calls', ['batch_id'])


def downgrade() -> None:
    op.drop_table('agent_calls')
