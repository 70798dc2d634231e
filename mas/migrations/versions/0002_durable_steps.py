"""durable steps: step leases, render ids, batch failure reasons, paused / failed batches, cancelled videos

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('step_leases',
    sa.Column('video_id', sa.Integer(), sa.ForeignKey('videos.id', ondelete='CASCADE'), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('step', sa.String(length=16), nullable=False),
    sa.Column('token', sa.String(length=32), nullable=True),
    sa.Column('worker', sa.Text(), nullable=False, server_default=''),
    sa.Column('claims', sa.Integer(), nullable=False, server_default='1'),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('video_id', 'attempt', 'step')
    )
    op.add_column('attempts', sa.Column('render_id', sa.String(length=36), nullable=True))
    op.add_column('batches', sa.Column('failure_reason', sa.Text(), nullable=True))
    # new enum values are usable once this transaction commits (nothing here uses them)
    op.execute("ALTER TYPE batch_status ADD VALUE IF NOT EXISTS 'paused' AFTER 'running'")
    op.execute("ALTER TYPE batch_status ADD VALUE IF NOT EXISTS 'failed' AFTER 'done'")
    op.execute("ALTER TYPE video_state ADD VALUE IF NOT EXISTS 'cancelled'")


def downgrade() -> None:
    # PostgreSQL cannot drop enum values; rows using them are moved to the nearest older value first
    op.execute("UPDATE videos SET state = 'failed' WHERE state = 'cancelled'")
    op.execute("UPDATE batches SET status = 'cancelled' WHERE status = 'failed'")
    op.execute("UPDATE batches SET status = 'running' WHERE status = 'paused'")
    op.drop_column('batches', 'failure_reason')
    op.drop_column('attempts', 'render_id')
    op.drop_table('step_leases')
