"""curated datasets: versions, items, exports, feedback references, content retention

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 03:15:59.753001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('content_retention',
    sa.Column('experiment_id', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('ttl_days', sa.Integer(), nullable=False),
    sa.Column('updated_by', sa.String(length=128), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('ttl_days > 0', name=op.f('ck_content_retention_ttl_days')),
    sa.PrimaryKeyConstraint('experiment_id', name=op.f('pk_content_retention'))
    )
    op.create_table('datasets',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('description', sa.Text(), nullable=True),
    sa.Column('created_by', sa.String(length=128), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_datasets')),
    sa.UniqueConstraint('name', name=op.f('uq_datasets_name'))
    )
    op.create_table('feedback_references',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('request_id', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('text', sa.Text(), nullable=True),
    sa.Column('check', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('value', sa.Double(), nullable=True),
    sa.Column('actor', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("kind IN ('edit', 'task_success', 'rating')", name=op.f('ck_feedback_references_kind')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_feedback_references'))
    )
    op.create_index(op.f('ix_feedback_references_request_id'), 'feedback_references', ['request_id'], unique=False)
    op.create_table('dataset_versions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('dataset_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('parent_version', sa.Integer(), nullable=True),
    sa.Column('content_hash', sa.String(length=64), nullable=False),
    sa.Column('item_count', sa.Integer(), nullable=False),
    sa.Column('spec', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('stats', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('created_by', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['dataset_id'], ['datasets.id'], name=op.f('fk_dataset_versions_dataset_id_datasets'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_dataset_versions')),
    sa.UniqueConstraint('dataset_id', 'version', name=op.f('uq_dataset_versions_dataset_id'))
    )
    op.create_index(op.f('ix_dataset_versions_dataset_id'), 'dataset_versions', ['dataset_id'], unique=False)
    op.create_table('dataset_exports',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('format', sa.String(length=16), nullable=False),
    sa.Column('split', sa.String(length=8), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('item_count', sa.Integer(), server_default='0', nullable=False),
    sa.Column('skipped', sa.Integer(), server_default='0', nullable=False),
    sa.Column('content_hash', sa.String(length=64), nullable=True),
    sa.Column('detail', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('actor', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['version_id'], ['dataset_versions.id'], name=op.f('fk_dataset_exports_version_id_dataset_versions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_dataset_exports'))
    )
    op.create_index(op.f('ix_dataset_exports_version_id'), 'dataset_exports', ['version_id'], unique=False)
    op.create_table('dataset_items',
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('item_id', sa.String(length=128), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('category', sa.String(length=64), nullable=False),
    sa.Column('split', sa.String(length=8), server_default='none', nullable=False),
    sa.Column('text_hash', sa.String(length=64), nullable=False),
    sa.Column('minhash', sa.LargeBinary(), nullable=False),
    sa.Column('prompt', sa.Text(), nullable=False),
    sa.Column('response', sa.Text(), nullable=True),
    sa.Column('reference', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('pair', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('provenance', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.CheckConstraint("split IN ('none', 'eval', 'holdout')", name=op.f('ck_dataset_items_split')),
    sa.ForeignKeyConstraint(['version_id'], ['dataset_versions.id'], name=op.f('fk_dataset_items_version_id_dataset_versions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('version_id', 'item_id', name=op.f('pk_dataset_items'))
    )
    op.create_index('ix_dataset_items_holdout_hash', 'dataset_items', ['text_hash'], unique=False, postgresql_where="split = 'holdout'")


def downgrade() -> None:
    op.drop_index('ix_dataset_items_holdout_hash', table_name='dataset_items', postgresql_where="split = 'holdout'")
    op.drop_table('dataset_items')
    op.drop_index(op.f('ix_dataset_exports_version_id'), table_name='dataset_exports')
    op.drop_table('dataset_exports')
    op.drop_index(op.f('ix_dataset_versions_dataset_id'), table_name='dataset_versions')
    op.drop_table('dataset_versions')
    op.drop_index(op.f('ix_feedback_references_request_id'), table_name='feedback_references')
    op.drop_table('feedback_references')
    op.drop_table('datasets')
    op.drop_table('content_retention')
