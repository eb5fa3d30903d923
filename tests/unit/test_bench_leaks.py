"""What :class:`bench.support.leaks.LeakCheck` counts as a run's own: segments named for its jobs
or owned by its processes (the very processes, not a later one with the same pid), and listening
sockets of its live processes; not what a test or benchmark beside it owns.

The segments are files in a folder of the test's own (``sweeper.SHM_DIR`` pointed there): in
``/dev/shm`` any other process's sweep may remove a dead owner's segment at any moment.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import psutil
import pytest

from bench.support import leaks
from hogwild.shm import sweeper
from hogwild.shm.naming import _base36, pid_namespace, segment_name


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(sweeper, "SHM_DIR", str(tmp_path))
    return tmp_path


def _make(folder, name: str) -> str:
    (folder / name.lstrip("/")).write_bytes(b"x")
    return name.lstrip("/")


def test_segments_are_counted_by_the_jobs_name_or_by_the_very_owner(shm_dir):
    before = _make(shm_dir, segment_name("bench_run_before"))  # there before: never counted
    check = leaks.LeakCheck()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = psutil.Process(child.pid)  # seen while it ran: its start time is kept
        named = _make(shm_dir, segment_name("bench_run_1"))  # this process's, the job's name
        by_owner = _make(shm_dir, segment_name("another", owner_pid=child.pid))
        wrong_start = round(owner.create_time() * 100) - 500  # the same pid, 5 s earlier
        reused = f"hogwild-another-{child.pid}-{_base36(wrong_start)}-n{pid_namespace()}-0000000a"
        _make(shm_dir, reused)  # a process beside the run that had the pid before
        neighbour = _make(shm_dir, segment_name("bench_run_2"))  # another job's, this process's
    finally:
        child.kill()
        child.wait()

    counted = check.count([owner], set(), jobs=("bench_run_1",))
    assert set(counted["detail"]["segments"]) == {named, by_owner}  # the dead owner's counts
    assert counted["segments"] == 2 and counted["processes"] == 0
    assert before not in counted["detail"]["segments"]
    assert neighbour not in check.count([], set(), jobs=("bench_run_1",))["detail"]["segments"]
    assert check.count([], set())["segments"] == 0  # no job, no process: nothing is the run's


def test_ports_are_the_live_processes_own(shm_dir, monkeypatch):
    monkeypatch.setattr(leaks, "EXIT_WAIT_S", 0.2)  # this process stays alive: do not wait
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        check = leaks.LeakCheck()
        me = psutil.Process()
        # the run's port, held by a process that is not the run's (this one): not the run's
        assert check.count([], {port})["ports"] == 0
        mine = check.count([me], set())  # held by a live process of the run: a leak
        assert mine["processes"] == 1
        assert f"127.0.0.1:{port} (pid {me.pid})" in mine["detail"]["ports"]
