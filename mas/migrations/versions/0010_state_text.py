"""state as text: a video's state is a name from the step table, so a new step needs no migration

The values are still only VideoState's: every write goes through the guarded moves (`mas.pipeline.states`).

Revision ID: 0010
Revises: 0009
"""
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

LABELS = ('waiting', 'writing', 'rendering', 'grading', 'reviewing', 'accepted', 'failed', 'cancelled')


def upgrade() -> None:
    op.execute('ALTER TABLE videos ALTER COLUMN state TYPE varchar(32) USING state::text')
    op.execute('DROP TYPE video_state')


def downgrade() -> None:
    op.execute(f"CREATE TYPE video_state AS ENUM ({', '.join(repr(label) for label in LABELS)})")
    op.execute('ALTER TABLE videos ALTER COLUMN state TYPE video_state USING state::video_state')
