"""Process helpers: the output tail, killing a whole process group, the machine-wide lock."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from harness.core.proc import exclusive_lock, file_tail, kill_group


def test_file_tail_keeps_the_end_and_tolerates_a_missing_file(tmp_path):
    log = tmp_path / "out.log"
    log.write_bytes(b"a" * 10 + b"last words")
    assert file_tail(log, chars=10) == "last words"
    assert file_tail(tmp_path / "missing.log") == ""


def test_kill_group_ends_the_child_and_its_children(tmp_path):
    marker = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time; "
              f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.time() + 30
    while not marker.exists() or not marker.read_text():
        assert time.time() < deadline
        time.sleep(0.05)
    grandchild = int(marker.read_text())
    assert kill_group(proc) < 0
    for _ in range(100):
        try:
            with open(f"/proc/{grandchild}/stat") as stat:
                if stat.read().split()[2] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the grandchild survived")


def test_exclusive_lock_serialises_holders(tmp_path):
    lock, order = tmp_path / "x.lock", []

    def hold(name: str) -> None:
        with exclusive_lock(lock):
            order.append(f"{name}+")
            time.sleep(0.2)
            order.append(f"{name}-")

    threads = [threading.Thread(target=hold, args=(n,)) for n in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert order in (["a+", "a-", "b+", "b-"], ["b+", "b-", "a+", "a-"])


def test_a_holder_is_gone_only_when_its_process_on_this_machine_has_ended():
    import subprocess
    import sys

    from harness.core.proc import holder_is_gone, process_identity

    assert not holder_is_gone(process_identity())  # this process
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = process_identity(child.pid)
    assert holder_is_gone({**gone, "start": None})  # no such process any more
    assert not holder_is_gone({**gone, "host": "another-machine"})  # cannot tell: never declared gone
    assert not holder_is_gone({})
    mine = process_identity()
    if mine["start"] is not None:  # /proc: a recycled pid is told apart by its start time
        assert holder_is_gone({**mine, "start": int(mine["start"]) - 1})
