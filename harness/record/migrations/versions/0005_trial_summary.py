"""trial summaries

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 06:00:00.000000

``trial_summary``: per benchmark job the samples it summarises and, packed, per trial its valid sample count and
median, written with the samples (``harness.record.trial_summary.sample_writer``) so that a history is analysed without
reading every sample.  The upgrade fills it from the stored samples, a bounded number of jobs at a time; a job
without a summary (or whose ``n`` is not its ``n_samples``) is still read from its samples.  Dropping it (downgrade)
loses only time.
"""

import logging

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

_JOBS_PER_READ = 20_000
_SAY_ABOVE = 1_000_000
log = logging.getLogger(__name__)


def upgrade() -> None:
    op.create_table(
        'trial_summary',
        sa.Column('job_id', sa.Integer(), nullable=False),
        sa.Column('n', sa.Integer(), nullable=False),
        sa.Column('trials', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['job_id'], ['job.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('job_id'),
    )
    _fill(op.get_bind())


def _fill(connection: sa.Connection) -> None:
    from harness.record.trial_summary import packed_summaries, trial_summaries  # the one rule for a trial's summary

    total = connection.execute(sa.text('SELECT count(*) FROM sample')).scalar() or 0
    if total > _SAY_ABOVE:  # minutes on tens of millions of samples: say why the command waits
        log.warning("summarising the trials of %d stored samples (once, for the schema's revision 0005)", total)
    sample = sa.table('sample', sa.column('job_id'), sa.column('idx'), sa.column('seconds'), sa.column('trial'))
    summary = sa.table('trial_summary', sa.column('job_id'), sa.column('n'), sa.column('trials'))
    after = -1
    while True:
        jobs = (sa.select(sample.c.job_id).distinct().where(sample.c.job_id > after).order_by(sample.c.job_id)
                .limit(_JOBS_PER_READ).subquery())
        last = connection.execute(sa.select(sa.func.max(jobs.c.job_id))).scalar()
        if last is None:
            return
        rows = connection.execute(sa.select(sample.c.job_id, sample.c.idx, sample.c.seconds, sample.c.trial)
                                  .where(sample.c.job_id > after, sample.c.job_id <= last)).all()
        packed = packed_summaries(trial_summaries(rows))
        connection.execute(summary.insert(), [{"job_id": job_id, "n": n, "trials": records.tobytes()}
                                              for job_id, (n, records) in packed.items()])
        after = last


def downgrade() -> None:
    op.drop_table('trial_summary')
