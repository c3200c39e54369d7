"""analysis cache stamps

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 20:00:00.000000

``analysis_stamp``: the raised watermark of an ``analysis_cache`` row (the sample id up to which a report found the
row's runs untouched), kept apart from the row. Raised in place, SQLite wrote the row's whole payload again: a
chip's analysis is one row of 16 MB at 1,000 commits, so each report after a run on another chip wrote 16 MB per
reused chip (40 ms each on the benchmark database). Nothing else reads it; dropping it (downgrade) loses only time.
"""

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'analysis_stamp',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('chip', sa.String(length=64), nullable=False),
        sa.Column('kind', sa.String(length=32), nullable=False),
        sa.Column('name', sa.String(length=400), nullable=False),
        sa.Column('key', sa.String(length=128), nullable=False),
        sa.Column('watermark', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('chip', 'kind', 'name'),
    )


def downgrade() -> None:
    op.drop_table('analysis_stamp')
