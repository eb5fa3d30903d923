"""Killing a role's process group (``hogwild.cluster.roles.kill_process_group``) leaves none of
multiprocessing's named semaphores behind.

A process that made a spawn-context lock and a child holding it is paused whole (SIGSTOP to its
group, as a test pauses a replica) and then killed as the local launcher kills a role. The
group's resource tracker, spared and woken, removes the lock's ``/dev/shm/sem.mp-*`` once the
others are gone. Killed whole with the tracker (``killpg`` SIGKILL, as before), the group leaves
it: the test shows that too, then removes it itself.
"""

from __future__ import annotations

import _multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hogwild.cluster.roles import kill_process_group

pytestmark = pytest.mark.kernel_free

GONE_WITHIN_S = 30.0  # the tracker sees its pipe close and removes what was left: well under 1 s

HOLDER = """
import multiprocessing, sys, time

def hold(lock):
    time.sleep(600)

if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    lock = context.Lock()
    child = context.Process(target=hold, args=(lock,))
    child.start()
    print(lock._semlock.name, flush=True)
    time.sleep(600)
"""


def _start_paused_holder(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """The holder in a group of its own, paused whole once its lock exists; the lock's file."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    holder = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    name = holder.stdout.readline().strip()
    assert name.startswith("/mp-"), name
    semaphore = Path("/dev/shm") / f"sem.{name[1:]}"
    assert semaphore.exists()
    os.killpg(holder.pid, signal.SIGSTOP)
    return holder, semaphore


def _group_gone(pgid: int) -> bool:
    """No live process (zombies aside: the killed child's may wait for init) in group ``pgid``."""
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return False
        except (OSError, psutil.Error):
            continue
    return True


def _until(check, what: str) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while not check():
        assert time.monotonic() < deadline, f"{what} within {GONE_WITHIN_S:g} s"
        time.sleep(0.05)


def test_a_paused_group_killed_but_its_tracker_leaves_no_semaphore(tmp_path):
    holder, semaphore = _start_paused_holder(tmp_path)
    try:
        assert kill_process_group(holder.pid)
        holder.wait(GONE_WITHIN_S)
        _until(lambda: not semaphore.exists(), "the lock's semaphore not removed")
        _until(lambda: _group_gone(holder.pid), "the tracker did not leave")
    finally:
        if not _group_gone(holder.pid):
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        holder.stdout.close()


def test_a_paused_group_killed_whole_leaves_its_semaphore(tmp_path):
    holder, semaphore = _start_paused_holder(tmp_path)
    try:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(GONE_WITHIN_S)
        _until(lambda: _group_gone(holder.pid), "the killed group is still there")
        time.sleep(0.5)  # were anyone left to remove it, it would be gone by now
        assert semaphore.exists()
    finally:
        if not _group_gone(holder.pid):
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
        if semaphore.exists():
            _multiprocessing.sem_unlink("/" + semaphore.name.removeprefix("sem."))
