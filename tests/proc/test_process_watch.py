"""The benchmarks' process watcher records every descendant of its root, and nothing else.

The descendants are ``sh`` and ``sleep`` processes: a child of the root that starts a grandchild
and exits (the grandchild, orphaned, is re-parented out of the tree and must still have been
recorded), and the root's own sleep. A process started beside the root (a sibling) is not its
descendant and must not be recorded.
"""

from __future__ import annotations

import subprocess
import time

import psutil

from bench.support.process_watch import Watcher

ORPHAN_PID_WITHIN_S = 10.0


def test_the_watcher_records_an_orphaned_grandchild_and_not_a_sibling(tmp_path):
    orphan_pid = tmp_path / "orphan.pid"
    sibling = subprocess.Popen(["sleep", "30"])
    # the subshell ( ... ) starts the grandchild, then exits after 0.5 s; the root lives on
    root = subprocess.Popen(
        ["sh", "-c", f"(sleep 30 & echo $! > {orphan_pid}; sleep 0.5); sleep 0.5"]
    )
    watcher = Watcher(psutil.Process(root.pid))
    orphan = None
    try:
        deadline = time.monotonic() + ORPHAN_PID_WITHIN_S
        while not (orphan_pid.is_file() and orphan_pid.read_text().strip()):
            assert time.monotonic() < deadline, "the grandchild never started"
            time.sleep(0.05)
        orphan = psutil.Process(int(orphan_pid.read_text()))
        subshell = orphan.ppid()
        walked = {p.pid for p in psutil.Process(root.pid).children(recursive=True)}
        assert root.wait(30) == 0
        seen = {p.pid for p in watcher.stop()}
        assert orphan.ppid() != subshell  # re-parented out of the tree: its parent exited
        assert {orphan.pid, subshell} <= seen, (orphan.pid, subshell, seen)
        assert walked <= seen  # everything a walk of the tree found at one moment
        assert len(seen) >= 3  # the subshell, its grandchild, the root's sleep
        assert sibling.pid not in seen and root.pid not in seen
    finally:
        watcher.stop()
        for proc in (root, sibling):
            proc.kill()
            proc.wait()
        if orphan is not None:
            try:
                orphan.kill()
                orphan.wait(10)
            except psutil.Error:
                pass
