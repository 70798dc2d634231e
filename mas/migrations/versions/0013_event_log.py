"""the studio's event log: one row per event, read by the API's event streams

Revision ID: 0013
Revises: 0012
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'studio_events',
        sa.Column('id', sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column('type', sa.String(40), nullable=False),
        sa.Column('batch_id', sa.Integer(), nullable=True),
        sa.Column('user_name', sa.String(40), nullable=False),
        sa.Column('payload', postgresql.JSONB(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index('ix_studio_events_user_id', 'studio_events', ['user_name', 'id'])
    op.create_index('ix_studio_events_batch_id', 'studio_events', ['batch_id', 'id'])
    op.create_index('ix_studio_events_created_at', 'studio_events', ['created_at'])


def downgrade() -> None:
    op.drop_table('studio_events')
