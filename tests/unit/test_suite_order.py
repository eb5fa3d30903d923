"""The suite's schedule (``tests/schedule.py``, used by ``tests/conftest.py``): tests that need
nothing from the kernel warm-up run first, then those that need the parameter servers' kernels,
then the rest, each tier in order; and the room's lock lets an ``alone`` test run with no other.

The order is checked on real files, collected by pytest in a child process (files, not folders:
no warm-up starts); the lock with real processes holding it.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time

from tests.schedule import Room

MARKED = "tests/unit/test_cluster_records.py"  # marked warmed_kernels: needs the whole warm-up
UNMARKED = "tests/unit/test_schedule.py"  # a unit test: needs nothing
KERNEL_FREE = "tests/proc/test_gang_wake.py"  # marked kernel_free: needs nothing
PS_ONLY = "tests/cluster/test_ps_many_clients.py"  # marked ps_kernels
TRAINS = "tests/proc/test_adam_resume.py"  # a process test that trains: needs the whole warm-up


def collected(repo_root, *files: str) -> list[str]:
    """The node ids pytest collects from ``files``, in the order it would run them."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*command, *files], cwd=repo_root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_unit_tests_calling_the_jobs_kernels_run_after_the_other_unit_tests(repo_root):
    ids = collected(repo_root, MARKED, UNMARKED)  # named first, marked first
    marked = [i for i in ids if i.startswith(MARKED)]
    unmarked = [i for i in ids if i.startswith(UNMARKED)]
    assert marked and unmarked, ids
    assert ids == unmarked + marked


def test_what_needs_less_of_the_warm_up_runs_first_whatever_its_tier(repo_root):
    files = (TRAINS, MARKED, PS_ONLY, KERNEL_FREE, UNMARKED)  # named last first
    ids = collected(repo_root, *files)
    firsts = []
    for i in ids:
        name = i.split("::")[0]
        if name not in firsts:
            firsts.append(name)
    # needs nothing (unit tier, then proc), the servers' kernels, everything (unit, then proc)
    assert firsts == [UNMARKED, KERNEL_FREE, PS_ONLY, MARKED, TRAINS], firsts


def _hold(folder, name: str, alone: bool, seconds: float) -> None:
    room = Room(folder)
    with room.enter(alone=alone):
        began = time.monotonic()
        time.sleep(seconds)
        ended = time.monotonic()
    room.close()
    (folder / f"{name}.held").write_text(f"{began} {ended}")


def _intervals(folder, holders: dict[str, bool]) -> dict[str, tuple[float, float]]:
    folder.mkdir()
    context = multiprocessing.get_context("spawn")
    processes = []
    for name, alone in holders.items():
        processes.append(context.Process(target=_hold, args=(folder, name, alone, 0.4)))
        processes[-1].start()
        time.sleep(0.1)  # in this order; each asks while the ones before it hold the room
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    held = {}
    for name in holders:
        began, ended = (folder / f"{name}.held").read_text().split()
        held[name] = (float(began), float(ended))
    return held


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_the_room_holds_shared_holders_together_and_an_alone_one_by_itself(tmp_path):
    held = _intervals(tmp_path / "a", {"w1": False, "w2": False})
    assert _overlap(held["w1"], held["w2"])  # two workers' tests run at once

    held = _intervals(tmp_path / "b", {"w1": False, "solo": True, "w2": False, "w3": False})
    for name in ("w1", "w2", "w3"):
        assert not _overlap(held["solo"], held[name]), held
    assert held["solo"][0] >= held["w1"][1]  # it waited for the test before it
    assert held["solo"][1] <= held["w2"][0]  # and the one after it waited: no starving
