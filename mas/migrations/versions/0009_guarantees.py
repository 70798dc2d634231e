"""guarantees: who wrote each attempt's prompt and verdict, and how its prompt stood against the user's style

Revision ID: 0009
Revises: 0008
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('attempts', sa.Column('prompt_source', sa.String(16), nullable=False, server_default='model'))
    op.add_column('attempts', sa.Column('review_source', sa.String(16), nullable=True))
    op.add_column('attempts', sa.Column('studio_notes', JSONB(), nullable=False, server_default='[]'))
    op.add_column('attempts', sa.Column('style_check', JSONB(), nullable=True))


def downgrade() -> None:
    for column in ('style_check', 'studio_notes', 'review_source', 'prompt_source'):
        op.drop_column('attempts', column)
