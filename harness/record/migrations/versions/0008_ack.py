"""regression acknowledgements

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 23:30:00.000000

``regression_ack``: a regression of the report's list marked as seen (``harness ack ID --note TEXT``), by the id the
regressions page shows (``reports.regressions.regression_id``: a digest of the regression's chip, series or check and
commits, so it is the same in every build). The report shows it acknowledged, with its note, and can hide it.
"""

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'regression_ack',
        sa.Column('ack_id', sa.String(length=32), primary_key=True),
        sa.Column('note', sa.Text(), nullable=False, server_default=''),
        sa.Column('acked_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('acked_by', sa.String(length=200), nullable=False, server_default=''),
    )


def downgrade() -> None:
    op.drop_table('regression_ack')
