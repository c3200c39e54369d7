"""pipelined backlog

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 00:30:00.000000

``job.backlog_calls``: for a pipelined benchmark job, the calls the device still had queued when the host had
issued a sample's last call (the smallest over the job's trials); under ``harness.stats.pacing.HOST_PACED_BACKLOG``
the series was paced by its host, not its device. Rows written before read as not recorded (NULL).
"""

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.add_column(sa.Column('backlog_calls', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_column('backlog_calls')
