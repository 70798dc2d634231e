"""step states: a video's state names the step that is due or running (writing, rendering, grading,
reviewing), so states, steps and leases share one set of names

Revision ID: 0004
Revises: 0003
"""
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

NEW = ('writing', 'rendering', 'grading', 'reviewing', 'accepted', 'failed', 'cancelled')
OLD = ('pending', 'writing', 'generating', 'evaluating', 'refining', 'accepted', 'failed', 'cancelled')


def _retype(labels: tuple[str, ...], *updates: str) -> None:
    """Through text: the rows are rewritten between the old enum and a new one (a value added to an enum
    cannot be used in the transaction that adds it, and a column's USING takes no subquery)."""
    op.execute('ALTER TABLE videos ALTER COLUMN state DROP DEFAULT')
    op.execute('ALTER TABLE videos ALTER COLUMN state TYPE text USING state::text')
    op.execute('DROP TYPE video_state')
    for update in updates:
        op.execute(update)
    op.execute(f"CREATE TYPE video_state AS ENUM ({', '.join(repr(label) for label in labels)})")
    op.execute('ALTER TABLE videos ALTER COLUMN state TYPE video_state USING state::video_state')


def upgrade() -> None:
    # writing with its attempt written (the old write committed the prompt and kept `writing` until the
    # render began): the render is due; pending: its first write is due; refining: the next attempt's write is
    # due; evaluating: grading is due, or review when the attempt already has its grade
    _retype(
        NEW,
        """UPDATE videos SET state = 'rendering' WHERE state = 'writing' AND EXISTS (
               SELECT 1 FROM attempts a WHERE a.video_id = videos.id AND a.number = videos.attempt_count)""",
        "UPDATE videos SET attempt_count = 1, state = 'writing' WHERE state = 'pending'",
        "UPDATE videos SET attempt_count = attempt_count + 1, state = 'writing' WHERE state = 'refining'",
        "UPDATE videos SET state = 'rendering' WHERE state = 'generating'",
        """UPDATE videos SET state = CASE WHEN EXISTS (
               SELECT 1 FROM attempts a WHERE a.video_id = videos.id AND a.number = videos.attempt_count
               AND a.grade IS NOT NULL) THEN 'reviewing' ELSE 'grading' END
           WHERE state = 'evaluating'""",
    )


def downgrade() -> None:
    _retype(
        OLD,
        "UPDATE videos SET state = 'generating' WHERE state = 'rendering'",
        "UPDATE videos SET state = 'evaluating' WHERE state IN ('grading', 'reviewing')",
    )
