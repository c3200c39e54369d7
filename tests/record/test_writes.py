"""The one get-or-create of chips, machines and commits, shared by recording a run and importing a bundle."""

from __future__ import annotations

from harness.core.chip import ChipIdentity
from harness.record import writes
from harness.record.models import Commit

SHA, PARENT = "a" * 40, "b" * 40
CHIP = ChipIdentity(key="test-chip", backend="cpu", device_name="Test", architecture="x86_64")


def test_a_commit_stored_as_a_link_gets_the_details_a_run_brings_and_keeps_what_it_knows(db):
    with db.session() as session:
        link = {"repo": "github.com/o/r", "sha": SHA, "message": "", "author": "", "committed_at": None,
                "branch": "", "parents": [PARENT]}
        link_id, added = writes.find_or_insert_commit(session, link)
        assert added
        commit = writes.get_or_create_commit(session, SHA, repo="https://github.com/o/r.git", message="fix",
                                             author="me", branch="main", parents=None)
        assert (commit.id, commit.message, commit.author, commit.branch, commit.parents) == (
            link_id, "fix", "me", "main", [PARENT])  # the URL found the row under the identity; parents kept
        again, added = writes.find_or_insert_commit(session, {**link, "message": "other", "parents": ["c" * 40]})
        assert (again, added) == (link_id, False)
    with db.session() as session:
        stored = session.get(Commit, link_id)
        assert (stored.message, stored.parents) == ("fix", [PARENT])  # a bundle's values never overwrite


def test_chips_and_machines_are_found_by_their_natural_keys(db):
    with db.session() as session:
        chip = writes.get_or_create_chip(session, CHIP)
        assert writes.find_or_insert_chip(session, {"key": CHIP.key}) == (chip.id, False)
        machine = writes.get_or_create_machine(session, chip, {"hostname": "host-a"})
        assert writes.find_or_insert_machine(session, {"hostname": "host-a", "chip_id": chip.id}) == (
            machine.id, False)
        other, added = writes.find_or_insert_machine(session, {"hostname": "host-b", "chip_id": chip.id, "facts": {}})
        assert added and other != machine.id
