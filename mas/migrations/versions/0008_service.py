"""service: webhook outbox, idempotency keys, a request's own webhook URL

Revision ID: 0008
Revises: 0007
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('batches', sa.Column('notify_url', sa.Text(), nullable=True))
    op.add_column('schedules', sa.Column('notify_url', sa.Text(), nullable=True))
    op.create_table(
        'webhook_events',
        sa.Column('seq', sa.BigInteger(), primary_key=True),
        sa.Column('id', sa.String(40), nullable=False, unique=True),
        sa.Column('type', sa.String(40), nullable=False),
        sa.Column('url', sa.Text(), nullable=False),
        sa.Column('batch_id', sa.Integer(), nullable=True),
        sa.Column('payload', JSONB(), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('failed_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index('ix_webhook_events_batch_id', 'webhook_events', ['batch_id'])
    # what the deliverer looks for: events neither delivered nor given up
    op.create_index('ix_webhook_events_pending', 'webhook_events', ['next_attempt_at'],
                    postgresql_where=sa.text('delivered_at IS NULL AND failed_at IS NULL'))
    op.create_table(
        'idempotency_keys',
        sa.Column('user_name', sa.String(40), primary_key=True),
        sa.Column('key', sa.String(200), primary_key=True),
        sa.Column('request_hash', sa.String(64), nullable=False),
        sa.Column('batch_id', sa.Integer(), nullable=True),
        sa.Column('schedule_id', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    op.drop_table('idempotency_keys')
    op.drop_index('ix_webhook_events_pending', table_name='webhook_events')
    op.drop_index('ix_webhook_events_batch_id', table_name='webhook_events')
    op.drop_table('webhook_events')
    op.drop_column('schedules', 'notify_url')
    op.drop_column('batches', 'notify_url')
