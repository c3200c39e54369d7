"""analysis cache

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-08 12:00:00.000000

``analysis_cache``: derived per-chip analysis results (a commit's cell summaries, a series' change points, a chip's
regression families) keyed by a digest of their inputs, so that ``harness report`` recomputes only what changed
(``harness.analysis.cache``). Nothing else reads it; dropping it (downgrade) loses only time.
"""

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'analysis_cache',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('chip', sa.String(length=64), nullable=False),
        sa.Column('kind', sa.String(length=32), nullable=False),
        sa.Column('name', sa.String(length=400), nullable=False),
        sa.Column('key', sa.String(length=128), nullable=False),
        sa.Column('watermark', sa.BigInteger(), nullable=True),
        sa.Column('payload', sa.LargeBinary(), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('chip', 'kind', 'name'),
    )


def downgrade() -> None:
    op.drop_table('analysis_cache')
