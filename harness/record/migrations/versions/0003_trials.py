"""benchmark trials and timing mode

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 15:40:00.000000

``sample.trial``: which independent trial (fresh process) of its job a sample came from; ``job.trials``: how many
trials a job's stored samples span; ``job.timing_mode`` ("pipelined" / "per-call") and ``job.round_trip_s`` (the
host round trip measured apart). Rows written before read as one trial (trial 0) timed in an unrecorded mode.
"""

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sample', schema=None) as batch_op:
        batch_op.add_column(sa.Column('trial', sa.Integer(), nullable=False, server_default='0'))
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.add_column(sa.Column('trials', sa.Integer(), nullable=False, server_default='1'))
        batch_op.add_column(sa.Column('timing_mode', sa.String(length=16), nullable=False, server_default=''))
        batch_op.add_column(sa.Column('round_trip_s', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_column('round_trip_s')
        batch_op.drop_column('timing_mode')
        batch_op.drop_column('trials')
    with op.batch_alter_table('sample', schema=None) as batch_op:
        batch_op.drop_column('trial')
