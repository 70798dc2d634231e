"""users: identities with API keys and roles; a series belongs to the user who made it

Revision ID: 0011
Revises: 0010
"""
import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'users',
        sa.Column('name', sa.String(40), primary_key=True),
        sa.Column('role', sa.String(16), nullable=False),
        sa.Column('password_hash', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_table(
        'api_keys',
        sa.Column('key_id', sa.String(16), primary_key=True),
        sa.Column('user_name', sa.String(40), sa.ForeignKey('users.name', ondelete='CASCADE'), nullable=False),
        sa.Column('secret_hash', sa.String(64), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index('ix_api_keys_user_name', 'api_keys', ['user_name'])
    op.add_column('series', sa.Column('user_name', sa.String(40), nullable=False, server_default='default'))
    op.create_index('ix_series_user_name', 'series', ['user_name'])
    op.drop_constraint('series_name_key', 'series', type_='unique')
    op.create_unique_constraint('series_user_name_name_key', 'series', ['user_name', 'name'])


def downgrade() -> None:
    op.drop_constraint('series_user_name_name_key', 'series', type_='unique')
    op.create_unique_constraint('series_name_key', 'series', ['name'])
    op.drop_index('ix_series_user_name', 'series')
    op.drop_column('series', 'user_name')
    op.drop_index('ix_api_keys_user_name', 'api_keys')
    op.drop_table('api_keys')
    op.drop_table('users')
