"""style items: each item of a user's style with where it came from and its history; feedback as it was read;
the style a batch's plan applies

Revision ID: 0014
Revises: 0013
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'style_items',
        sa.Column('id', sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column('user_name', sa.String(40), nullable=False, server_default='default'),
        sa.Column('aspect', sa.String(16), nullable=False),
        sa.Column('words', sa.Text(), nullable=False),
        sa.Column('polarity', sa.String(16), nullable=False),
        sa.Column('source', sa.String(16), nullable=False),
        sa.Column('feedback', sa.Text(), nullable=False),
        sa.Column('history', postgresql.JSONB(), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index('ix_style_items_user_name', 'style_items', ['user_name'])
    op.create_table(
        'style_feedback',
        sa.Column('id', sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column('user_name', sa.String(40), nullable=False, server_default='default'),
        sa.Column('feedback', sa.Text(), nullable=False),
        sa.Column('reader', sa.String(16), nullable=False),
        sa.Column('not_understood', postgresql.JSONB(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index('ix_style_feedback_user_name', 'style_feedback', ['user_name'])
    op.add_column('batches', sa.Column('style', postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column('batches', 'style')
    op.drop_table('style_feedback')
    op.drop_table('style_items')
