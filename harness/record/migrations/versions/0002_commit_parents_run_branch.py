"""commit parents and run branch

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 10:00:00.000000

``commit.parents`` (JSON list of full shas, first parent first; NULL: unknown) and ``run.branch`` (the branch the
run was made for). Existing commits keep NULL parents: git is not at hand here. The store fills them in the next
time a run is recorded for their repository (``harness.record.links.record_ancestry``); until then they are ordered
by time, as before.
"""

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('commit', schema=None) as batch_op:
        batch_op.add_column(sa.Column('parents', sa.JSON(none_as_null=True), nullable=True))
    with op.batch_alter_table('run', schema=None) as batch_op:
        batch_op.add_column(sa.Column('branch', sa.String(length=255), nullable=False, server_default=''))


def downgrade() -> None:
    with op.batch_alter_table('run', schema=None) as batch_op:
        batch_op.drop_column('branch')
    with op.batch_alter_table('commit', schema=None) as batch_op:
        batch_op.drop_column('parents')
