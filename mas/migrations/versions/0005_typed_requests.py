"""typed requests: batches and schedules store the request as JSON (spec) and their priority as a column;
schedules name their user

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

DEFAULT_USER = 'default'
# what options held; anything else (none was ever written) runs at normal
PRIORITY = "CASE WHEN options->>'priority' = 'high' THEN 'high' ELSE 'normal' END"


def upgrade() -> None:
    for table in ('batches', 'schedules'):
        op.add_column(table, sa.Column('spec', postgresql.JSONB(), nullable=True))
        op.add_column(table, sa.Column('priority', sa.String(length=8), nullable=False, server_default='normal'))
        op.execute(f'UPDATE {table} SET priority = {PRIORITY}')
    op.execute("""
        UPDATE batches SET spec = jsonb_build_object(
            'kind', kind, 'count', total, 'theme', theme,
            'series_name', CASE WHEN kind = 'series' THEN coalesce(options->>'series_name', theme) END,
            'text', request)
    """)
    op.add_column('schedules', sa.Column('user_name', sa.String(length=40), nullable=False, server_default=DEFAULT_USER))
    op.create_index('ix_schedules_user_name', 'schedules', ['user_name'])
    op.execute(f"UPDATE schedules SET user_name = coalesce(options->>'user', '{DEFAULT_USER}')")
    # a schedule's spec stays NULL: its text is read by the request parser when it runs, as before


def downgrade() -> None:
    # the older code reads the priority, the series name and the user from options
    op.execute("""
        UPDATE batches SET options = options || jsonb_build_object('priority', priority, 'series_name', spec->>'series_name')
    """)
    op.execute("UPDATE schedules SET options = options || jsonb_build_object('priority', priority, 'user', user_name)")
    op.drop_index('ix_schedules_user_name', 'schedules')
    op.drop_column('schedules', 'user_name')
    for table in ('batches', 'schedules'):
        op.drop_column(table, 'priority')
        op.drop_column(table, 'spec')
