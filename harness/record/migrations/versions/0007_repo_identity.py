"""commits keyed by repository identity

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 23:30:00.000000

A commit row is unique per (repository, sha), and the repository is now its identity (``harness.spec.git.identity``:
normalised remote ``host/owner/name``, or ``root:<sha>`` of its root commit), not the spelling of one checkout's
remote or its folder. Rows that the old keys split are merged into one, their runs re-pointed, by the rule of
``harness.record.identity`` computed from what the rows store (their keys and shas; git is not at hand here):
remote URLs are normalised; a row keyed by a path or folder name goes to the one remote identity its repository's
shas are stored under (by sha alone where its shas meet several); keys without any remote that share a sha are one
repository. No schema change; nothing is lost (every run keeps its commit sha; details a merged row lacked are
taken from its duplicates). Not reversible: the downgrade leaves the merged rows as they are.
"""

from alembic import op

from harness.record.identity import unify

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    unify(op.get_bind())


def downgrade() -> None:
    pass
