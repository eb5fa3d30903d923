"""The suite's schedule (``tests/schedule.py``, used by ``tests/conftest.py``): tests that need
nothing from the kernel warm-up run first, then those that need the parameter servers' kernels,
then the rest, in each the ``alone`` tests first, the tests of an ``xdist_group`` next, then the
tiers from the last to the first; the workers deal an ``xdist_group`` to one of them; and the
room's lock lets an ``alone`` test run with no other.

The order is checked on real files, collected by pytest in one child process that the order's
tests share (files, not folders: no warm-up starts); each test reads the ids of the files it
names, as their own collection would order them (the sort is stable and its key is each test's
own, so only the files' order on the command line, kept consistent with every test's, can tell
the two apart); the lock with real processes holding it.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time
from functools import partial

import pytest

from tests.schedule import Room

MARKED = "tests/unit/test_cluster_records.py"  # marked warmed_kernels: needs the whole warm-up
UNMARKED = "tests/unit/test_schedule.py"  # a unit test: needs nothing
KERNEL_FREE = "tests/proc/test_gang_wake.py"  # marked kernel_free: needs nothing
PS_ONLY = "tests/cluster/test_ps_many_clients.py"  # marked ps_kernels
TRAINS = "tests/proc/test_adam_resume.py"  # a process test that trains: needs the whole warm-up
ALONE = "tests/proc/test_cli_signals.py"  # trains: needs the whole warm-up; one of its tests alone
ALONE_TESTS = {"test_two_jobs_started_at_once_pin_their_workers_to_different_cores"}
GROUPED = "tests/proc/test_training.py"  # some of its tests share a trained run: one xdist_group
ON_THE_TRAINED_RUN = {  # GROUPED's tests in that group
    "test_two_workers_on_5000_examples_reach_95_percent",
    "test_metrics_file_has_epochs_and_final_figures",
    "test_checkpoint_predicts_like_the_equivalent_torch_model",
    "test_evaluate_matches_the_training_run",
}


# Every file the order's tests name, in an order that keeps each test's own order of its files
# (a stable sort: where two tests' files share a key, the order named decides).
NAMED = (TRAINS, MARKED, ALONE, GROUPED, PS_ONLY, KERNEL_FREE, UNMARKED)


def collected(repo_root, *files: str) -> list[str]:
    """The node ids pytest collects from ``files``, in the order it would run them."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*command, *files], cwd=repo_root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


@pytest.fixture(scope="module")
def collection(repo_root) -> list[str]:
    """The node ids collected from every file in ``NAMED``: one child for the module's tests
    (each pays a pytest start and a collection)."""
    return collected(repo_root, *NAMED)


def of_files(collection: list[str], *files: str) -> list[str]:
    """The ids of ``collection`` from ``files`` (each named in ``NAMED`` in the order given
    here), in the collection's order: the order pytest runs those files in by themselves."""
    assert [f for f in NAMED if f in files] == list(files), files
    return [i for i in collection if i.split("::")[0] in files]


def test_unit_tests_calling_the_jobs_kernels_run_after_the_other_unit_tests(collection):
    ids = of_files(collection, MARKED, UNMARKED)  # named first, marked first
    marked = [i for i in ids if i.startswith(MARKED)]
    unmarked = [i for i in ids if i.startswith(UNMARKED)]
    assert marked and unmarked, ids
    assert ids == unmarked + marked


def test_what_needs_less_of_the_warm_up_runs_first_whatever_its_tier(collection):
    files = (TRAINS, MARKED, PS_ONLY, KERNEL_FREE, UNMARKED)  # named last first
    ids = of_files(collection, *files)
    firsts = []
    for i in ids:
        name = i.split("::")[0]
        if name not in firsts:
            firsts.append(name)
    # needs nothing (proc tier, then unit), the servers' kernels, everything (proc, then unit)
    assert firsts == [KERNEL_FREE, UNMARKED, PS_ONLY, TRAINS, MARKED], firsts


def test_within_a_stage_the_alone_tests_run_first_then_a_group_then_the_last_tier_first(
    collection,
):
    ids = of_files(collection, MARKED, ALONE, GROUPED)  # every one needs the whole warm-up
    alone = [i for i in ids if i.split("::")[-1] in ALONE_TESTS]
    grouped = [i for i in ids if i.split("::")[-1] in ON_THE_TRAINED_RUN]
    assert len(alone) == len(ALONE_TESTS) and len(grouped) == len(ON_THE_TRAINED_RUN), ids
    assert ids[: len(alone)] == alone
    assert ids[len(alone) : len(alone) + len(grouped)] == grouped
    files = []
    for i in ids[len(alone) + len(grouped) :]:
        if i.split("::")[0] not in files:
            files.append(i.split("::")[0])
    # the proc tier (its files in the order named), the unit tier last
    assert files == [ALONE, GROUPED, MARKED], files


WAIT_S = 60.0  # a bound for a hang: a spawned process starts in well under a second when idle


def _hold(folder, name: str, alone: bool) -> None:
    """Enter the room, say so (``NAME.in``), stay until the test lets go (``NAME.go``), and
    write when it held the room."""
    room = Room(folder)
    with room.enter(alone=alone):
        began = time.monotonic()
        (folder / f"{name}.in").touch()
        _until(lambda: (folder / f"{name}.go").exists(), f"{name} let go")
        ended = time.monotonic()
    room.close()
    (folder / f"{name}.held").write_text(f"{began} {ended}")


def _until(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S:g} s"
        time.sleep(0.01)


def _waits_on_a_lock(pid: int) -> bool:
    """Whether ``pid`` is blocked on a file lock (a ``->`` line of ``/proc/locks``)."""
    with open("/proc/locks") as locks:
        return any("->" in line and f" {pid} " in line for line in locks)


def _stop(processes) -> None:
    """Kill the holders still there (a failed test's) and reap them all."""
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join(WAIT_S)


def _asking(folder, name: str, pid: int) -> bool:
    return (folder / f"{name}.in").exists() or _waits_on_a_lock(pid)


def _in_turn(folder, holders: dict[str, bool]) -> dict[str, tuple[float, float]]:
    """Start the holders one by one, each once the one before it holds the room or waits for
    it (so they ask in this order whatever the machine's load), then let them all go; when each
    held the room."""
    folder.mkdir()
    context = multiprocessing.get_context("spawn")
    processes = []
    try:
        for name, alone in holders.items():
            processes.append(context.Process(target=_hold, args=(folder, name, alone)))
            processes[-1].start()
            _until(partial(_asking, folder, name, processes[-1].pid), f"{name} asking")
        _let_go(folder, holders, processes)
    finally:
        _stop(processes)
    held = {}
    for name in holders:
        began, ended = (folder / f"{name}.held").read_text().split()
        held[name] = (float(began), float(ended))
    return held


def _let_go(folder, names, processes) -> None:
    """Tell every holder named to leave the room, and wait for each to end well."""
    for name in names:
        (folder / f"{name}.go").touch()
    for process in processes:
        process.join(WAIT_S)
        assert process.exitcode == 0


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_shared_holders_hold_the_room_together(tmp_path):
    """The second enters while the first holds (each stays until both are in): were the room
    exclusive, the first would wait out ``WAIT_S`` and the test fail."""
    folder = tmp_path / "a"
    folder.mkdir()
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_hold, args=(folder, n, False)) for n in ("w1", "w2")]
    try:
        for process in processes:
            process.start()
        _until(lambda: all((folder / f"{n}.in").exists() for n in ("w1", "w2")), "two holders in")
        _let_go(folder, ("w1", "w2"), processes)
    finally:
        _stop(processes)


def test_an_alone_holder_holds_the_room_by_itself_and_is_not_starved(tmp_path):
    held = _in_turn(tmp_path / "b", {"w1": False, "solo": True, "w2": False, "w3": False})
    for name in ("w1", "w2", "w3"):
        assert not _overlap(held["solo"], held[name]), held
    assert held["solo"][0] >= held["w1"][1]  # it waited for the test before it
    assert held["solo"][1] <= held["w2"][0]  # and the one after it waited: no starving
