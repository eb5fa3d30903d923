"""When each test may start: the warm-up's stages, the order of the tiers, tests that run alone.

The suite runs on two cores, serially (``pytest tests``) or over two workers
(``pytest -n 2 tests``, pytest-xdist; the session then distributes by ``loadgroup``, so that the
Ray tests, one ``xdist_group``, share one worker). Three rules decide when a test starts, the
same in both:

- **The warm-up's stages.** :mod:`tests.warm_kernels` compiles, in the background, first the
  parameter servers' kernels (stage ``ps``), then every kernel the jobs and the unit tests'
  kernel checks call (stage ``all``); it touches ``<folder>/<stage>.done`` after each. A test
  needs one of three stages: none (it starts at once: the unit tier, and modules marked
  ``kernel_free``, which start no process that compiles the engine's or the servers' kernels),
  ``ps`` (modules marked ``ps_kernels``: they start parameter servers and nothing that trains),
  or ``all`` (every other test outside the unit tier, and unit tests marked ``warmed_kernels``).
  A test waits for its stage before it starts (bounded): it then loads the compiled kernels
  instead of compiling them beside the warm-up, and no bound on a job's time counts a compile.
- **The order.** Tests that need no stage come first, then those that need ``ps``, then those
  that need ``all``, so that while the warm-up compiles the workers run what needs nothing from
  it. Within each, a stable sort: the ``alone`` tests (both workers take them one after the
  other, so that none waits for a long test the other worker holds), then the tests of an
  ``xdist_group`` (one worker runs the whole group, which is long: it must not be the last thing
  left), then the tiers from the last to the first (hosts, adversarial, cluster, proc, unit): the
  long tests first, the short unit tests last, to even out the workers' ends.
- **Alone.** A test marked ``alone`` runs while no other test does (with two workers, the other
  waits): it bounds a job's time, counts on every core of the machine, or owns the machine's Ray.
  Every other test holds a shared lock while it runs; an ``alone`` test takes it exclusively.
  A turnstile lock in front keeps a stream of shared holders from starving it (``flock`` gives
  an exclusive waiter no priority by itself). What this costs: the other worker waits out the
  whole test, so an ``alone`` test adds its full duration to the suite's wall time where a shared
  one adds about half of it (the two workers otherwise stay busy from the end of collection to
  the end, the warm-up's stages hardly waited for); and no order of the alone tests hides them,
  since nothing else may run beside them. Mark a test ``alone`` only where a bound or a count
  needs the whole machine.

The folder is the session's (serial) or the controller's (workers), passed to the workers in
``HOGWILD_SUITE_DIR`` with the warm-up's pid in ``HOGWILD_SUITE_WARM_PID``: a warm-up that died
before its stage was done is not waited for (the test compiles what it needs).
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path

import psutil

TIERS = ("unit", "proc", "cluster", "adversarial", "hosts")
STAGES = ("ps", "all")  # in the order the warm-up finishes them
NONE, PS, ALL = 0, 1, 2
WAIT_WITHIN_S = 600.0  # a bound for a hang: a cold warm-up takes minutes on a slow host
_POLL_S = 0.1
FOLDER_VARIABLE = "HOGWILD_SUITE_DIR"
PID_VARIABLE = "HOGWILD_SUITE_WARM_PID"


def tier(item) -> int:
    """0 to 4 for a test under ``tests/unit``, ``proc``, ``cluster``, ``adversarial`` or
    ``hosts``; else 0."""
    try:
        folder = Path(str(item.path)).resolve().relative_to(Path(__file__).resolve().parent)
    except ValueError:
        return 0
    return TIERS.index(folder.parts[0]) if folder.parts[0] in TIERS else 0


def stage_needed(item) -> int:
    """``NONE``, ``PS`` or ``ALL``: how much of the warm-up ``item`` waits for."""
    if item.get_closest_marker("warmed_kernels") is not None:
        return ALL
    if tier(item) == 0 or item.get_closest_marker("kernel_free") is not None:
        return NONE
    if item.get_closest_marker("ps_kernels") is not None:
        return PS
    return ALL


def order(item) -> tuple[int, bool, bool, int]:
    """The sort key of the suite's order: the stage needed; ``alone`` first, in a group next;
    then the tier, the last first."""
    alone = item.get_closest_marker("alone") is not None
    grouped = item.get_closest_marker("xdist_group") is not None
    return stage_needed(item), not alone, not grouped, -tier(item)


def done_file(folder: Path, stage: int) -> Path:
    """The file the warm-up touches once ``stage`` (``PS`` or ``ALL``) is compiled."""
    return folder / f"{STAGES[stage - 1]}.done"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_for(stage: int, folder: Path | None, pid: int | None) -> None:
    """Return once the warm-up has compiled ``stage``, has ended, or ``WAIT_WITHIN_S`` passed."""
    if stage == NONE or folder is None or pid is None:
        return
    deadline = time.monotonic() + WAIT_WITHIN_S
    target = done_file(folder, stage)
    while not target.exists() and _running(pid) and time.monotonic() < deadline:
        time.sleep(_POLL_S)


class Room:
    """The suite's readers-writer lock over two files in ``folder`` (see the module's text)."""

    def __init__(self, folder: Path) -> None:
        self._turnstile = open(folder / "turnstile.lock", "a+")  # noqa: SIM115 (held for the session)
        self._room = open(folder / "room.lock", "a+")  # noqa: SIM115

    @contextmanager
    def enter(self, alone: bool):
        """Hold the room shared, or alone, for the body."""
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._room, fcntl.LOCK_UN)

    def close(self) -> None:
        self._turnstile.close()
        self._room.close()


def inherited() -> tuple[Path | None, int | None]:
    """The folder and warm-up pid a worker's controller passed on, if any."""
    folder = os.environ.get(FOLDER_VARIABLE)
    pid = os.environ.get(PID_VARIABLE)
    return (Path(folder) if folder else None), (int(pid) if pid else None)
