"""taste per user: the user of batches, A/B tests, picks and adapters; pairwise taste models; expectations

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

DEFAULT_USER = 'default'


def upgrade() -> None:
    for table in ('batches', 'ab_tests', 'ab_selections', 'trained_adapters'):
        op.add_column(table, sa.Column('user_name', sa.String(length=40), nullable=False, server_default=DEFAULT_USER))
        op.create_index(f'ix_{table}_user_name', table, ['user_name'])
    op.add_column('ab_tests', sa.Column('expected_label', sa.String(length=8), nullable=True))
    op.add_column('ab_tests', sa.Column('expected_probability', sa.Float(), nullable=True))
    op.add_column('ab_tests', sa.Column('expected_by', sa.Text(), nullable=True))
    op.add_column('ab_selections', sa.Column('chosen_scores', postgresql.JSONB(), nullable=False, server_default='{}'))
    op.add_column('ab_selections', sa.Column('rejected_scores', postgresql.JSONB(), nullable=False, server_default='[]'))
    op.create_table('taste_models',
    sa.Column('id', sa.Integer(), primary_key=True),
    sa.Column('user_name', sa.String(length=40), nullable=False, index=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('pairs_used', sa.Integer(), nullable=False),
    sa.Column('heldout_pairs', sa.Integer(), nullable=False),
    sa.Column('heldout_accuracy', sa.Float(), nullable=True),
    sa.Column('promoted', sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column('reason', sa.Text(), nullable=False, server_default=''),
    sa.Column('model', postgresql.JSONB(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.UniqueConstraint('user_name', 'version'),
    )


def downgrade() -> None:
    op.drop_table('taste_models')
    op.drop_column('ab_selections', 'rejected_scores')
    op.drop_column('ab_selections', 'chosen_scores')
    for column in ('expected_by', 'expected_probability', 'expected_label'):
        op.drop_column('ab_tests', column)
    for table in ('batches', 'ab_tests', 'ab_selections', 'trained_adapters'):
        op.drop_index(f'ix_{table}_user_name', table)
        op.drop_column(table, 'user_name')
