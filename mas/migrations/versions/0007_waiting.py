"""waiting: a planned video waits for its write until the GPUs need another prompt (write-ahead)

Revision ID: 0007
Revises: 0006
"""
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a value added to an enum may not be used in the transaction that adds it; nothing here uses it
    op.execute("ALTER TYPE video_state ADD VALUE IF NOT EXISTS 'waiting' BEFORE 'writing'")


def downgrade() -> None:
    # older code starts every planned video at once; the enum keeps the unused label
    op.execute("UPDATE videos SET state = 'writing' WHERE state = 'waiting'")
