"""settling runs

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 23:45:00.000000

``run.settling``: the run was measured by ``harness compare --settle`` (the undecided series of a comparison only,
interleaved with the other commit's). Such runs are read only by the comparison that made them (by run id): never
a chip page's tip, a point of a history, a history floor's run or the previous run of a later one. Rows written
before are ordinary runs (false).
"""

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN (SQLite and PostgreSQL both): a batch copy of ``run`` on SQLite drops the old table, and its
    # ON DELETE CASCADE would take every job and sample with it.
    op.add_column('run', sa.Column('settling', sa.Boolean(), nullable=False, server_default=sa.text('false')))


def downgrade() -> None:
    op.drop_column('run', 'settling')  # plain DROP COLUMN (SQLite >= 3.35): no batch copy, as above
