"""Shared fixtures: the resource-leak check every test runs under, and paths to shared data.

``_no_leaks`` (autouse) fails a test that leaves behind, once it is over:

- a new ``/dev/shm/hogwild*`` segment owned (per its name) by this process or one of its live
  descendants;
- a live child process (anywhere below this one, a forkserver's children included), other than
  multiprocessing's own long-lived helpers of this process, told by their pid (its forkserver,
  which the trainers started here share, and its resource tracker: they serve the whole session),
  the role server the parameter servers it starts are forked from (``ServeProcess``'s), and the
  command server the ``hogwild`` commands and benchmarks it starts are forked from
  (:mod:`tests.fork_launch`; a command it forked and left running is a leak like any other);
- a new listening TCP socket of this process or its descendants.

Before failing it cleans up (kills the processes, unlinks the segments, shuts the sockets), so
one leak does not fail every later test. Other test sessions may run on this machine at the same
time, so segments are attributed by the owner recorded in their names, never by "appeared during
the test": a segment whose owner is another live process is someone else's. New segments whose
owner is already dead cannot be attributed; they are swept quietly (they are garbage by
definition, as the trainer's start-up sweep would).

The suite runs serially or over two workers (``pytest -n 2``, pytest-xdist, tests dealt out by
``xdist_group``); when each test starts is :mod:`tests.schedule`'s: tests that need nothing
from the kernel warm-up first (the unit tier and modules marked ``kernel_free``), then those that
need the parameter servers' kernels (``ps_kernels``), then the rest, in each the ``alone`` tests
first, then the groups, then the tiers from the last (hosts) to the first (unit); a test waits
for the warm-up stage it needs; a test marked ``alone`` runs while no other does.
:mod:`tests.warm_kernels` compiles the kernels in the background, started once per run (by the
session, or by the workers' controller): the session owns that process (it is not a test's leak)
and stops it at the end. Where ``PYTHONDONTWRITEBYTECODE`` is set, the session (the
controller) writes the project's bytecode once for the processes it starts and removes it at the
end (:mod:`tests.bytecode`).

Each pytest process (not the workers' controller) forks the ``hogwild`` commands and benchmarks
its tests start from a preloaded command server instead of exec'ing a fresh interpreter for each
(:func:`tests.fork_launch.install`; ``HOGWILD_TEST_FORK=0`` turns it off); a test that checks
what a fresh interpreter does starts its commands inside :func:`tests.fork_launch.exec_only`.

The session also undoes an inherited ``SIGINT`` ignore (a non-interactive shell starts a
background command, ``pytest ... &``, with SIGINT ignored, and exec passes that on): the tests
send SIGINT to the jobs they start and expect Ctrl-C's behaviour, which an ignored SIGINT never
has.
"""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hogwild.shm import sweeper
from hogwild.shm.naming import owner_alive, parse_segment_name
from tests import fork_launch, schedule

_CHILD_GRACE_S = 1.0
_warming: subprocess.Popen | None = None
_warming_log = None
_suite_dir: Path | None = None  # the warm-up's stage files and the room's locks (tests/schedule.py)
_room: schedule.Room | None = None  # with workers: the lock that lets ``alone`` tests run alone
_bytecode: list[Path] = []  # .pyc files this session wrote (see tests/bytecode.py)
_LOADGROUP = "hogwild_loadgroup"  # the workers' input that says the tests go out by group


def _shm_entries() -> set[str]:
    try:
        return {e for e in os.listdir(sweeper.SHM_DIR) if e.startswith("hogwild")}
    except FileNotFoundError:
        return set()


def _is_mp_helper(proc: psutil.Process) -> bool:
    """multiprocessing's forkserver or resource tracker of this process, or the role server its
    parameter servers are forked from (hogwild_plugins.ps.serving.launch), by pid: the ones it
    started and serve the whole session (their children are workers or servers, never
    helpers)."""
    helpers = {
        multiprocessing.forkserver._forkserver._forkserver_pid,
        multiprocessing.resource_tracker._resource_tracker._pid,
    }
    launch = sys.modules.get("hogwild_plugins.ps.serving.launch")
    if launch is not None:
        helpers.add(launch.role_server_pid())
    helpers.add(fork_launch.server_pid())
    return proc.pid in helpers - {None}


def _descendants() -> list[psutil.Process]:
    """Live descendants of this process, multiprocessing's helpers left out."""
    me = os.getpid()
    procs = []
    warming = _warming.pid if _warming is not None else None
    for proc in psutil.Process(me).children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE or _is_mp_helper(proc):
                continue
            if proc.pid == warming:
                continue
        except psutil.Error:
            continue
        procs.append(proc)
    return procs


def _listening(pids: list[int]) -> set[tuple[int, int, str, int]]:
    """(pid, fd, ip, port) of every listening TCP socket of the given processes."""
    found = set()
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN:
                found.add((pid, conn.fd, conn.laddr.ip, conn.laddr.port))
    return found


def _our_pids() -> list[int]:
    return [os.getpid()] + [p.pid for p in psutil.Process().children(recursive=True)]


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _is_controller(config) -> bool:
    """Whether this process hands the tests to pytest-xdist's workers (``-n N``, N >= 1)."""
    return not _is_worker(config) and config.getoption("dist", "no") != "no"


def pytest_sessionstart(session) -> None:
    """Write the project's bytecode once when this environment writes none (tests/bytecode.py);
    in a worker, open the room's locks."""
    global _bytecode, _room
    from tests.bytecode import compile_sources, needed

    if _is_worker(session.config):
        folder, _ = schedule.inherited()
        if folder is not None:
            _room = schedule.Room(folder)
        return
    if needed():
        _bytecode = compile_sources(Path(__file__).resolve().parents[1])


def pytest_collection_modifyitems(session, config, items) -> None:
    """The suite's order (:func:`tests.schedule.order`, a stable sort)."""
    items.sort(key=schedule.order)


def _make_suite_dir() -> None:
    """The run's folder for the warm-up's stage files and the room's locks, passed on to the
    workers (they start after this)."""
    global _suite_dir
    _suite_dir = Path(tempfile.mkdtemp(prefix="hogwild-suite-"))
    os.environ[schedule.FOLDER_VARIABLE] = str(_suite_dir)


def _start_warming() -> None:
    global _warming, _warming_log
    _warming_log = tempfile.TemporaryFile()
    _warming = subprocess.Popen(
        [sys.executable, "-m", "tests.warm_kernels", str(os.getpid()), str(_suite_dir)],
        cwd=Path(__file__).resolve().parents[1],
        stdin=subprocess.DEVNULL,
        stdout=_warming_log,
        stderr=subprocess.STDOUT,
    )
    os.environ[schedule.PID_VARIABLE] = str(_warming.pid)


def _runs_several_tiers(config) -> bool:
    """Whether the controller's arguments name a folder of tests (the suite or a tier: worth a
    warm-up) rather than files or single tests."""
    paths = [Path(arg.split("::")[0]) for arg in config.args] or [Path("tests")]
    return any(path.is_dir() for path in paths)


def pytest_collection_finish(session) -> None:
    """Serially, start compiling the kernels in the background when unit tests run first and
    tests of other tiers after them, some needing the kernels (otherwise there is no idle core
    to compile on, or nothing to compile for)."""
    config = session.config
    if _is_worker(config) or _is_controller(config) or config.option.collectonly:
        return
    tiers = {schedule.tier(item) for item in session.items}
    if 0 not in tiers or tiers == {0}:  # a unit file alone (as a test reruns one): no warm-up
        return
    needs = {schedule.stage_needed(item) for item in session.items}
    if schedule.NONE in needs and len(needs) > 1:
        _make_suite_dir()
        _start_warming()


def pytest_sessionfinish(session, exitstatus) -> None:
    """Stop the kernel warm-up (it is done by now, unless the session was cut short); remove
    the bytecode the session wrote and the session's folder."""
    _clean_up()


def pytest_unconfigure(config) -> None:
    """The same, where the session never finished (the workers could not start, say)."""
    _clean_up()


def _clean_up() -> None:
    global _bytecode, _room, _suite_dir
    from tests.bytecode import remove

    _stop_warming()
    fork_launch.stop()
    remove(_bytecode)
    _bytecode = []
    if _room is not None:
        _room.close()
        _room = None
    if _suite_dir is not None:
        shutil.rmtree(_suite_dir, ignore_errors=True)
        _suite_dir = None


def _stop_warming() -> None:
    global _warming
    if _warming is None:
        return
    if _warming.poll() is None:
        _warming.kill()
    _warming.wait()
    if _warming.returncode not in (0, -signal.SIGKILL, -signal.SIGINT):  # Ctrl-C reached it too
        _warming_log.seek(0)
        tail = _warming_log.read()[-2000:].decode(errors="replace")
        print(f"\ntests.warm_kernels exited {_warming.returncode}: {tail}", file=sys.stderr)
    _warming_log.close()
    _warming = None


def _stop_listening(fd: int) -> None:
    """Make one of this process's listening sockets stop listening, without closing its fd.

    Closing the descriptor behind its owner's back could close an unrelated file later (fd
    reuse); shutting it down releases the port and leaves the owner a dead but valid socket.
    """
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def pytest_configure(config) -> None:
    """Let the jobs the tests start receive SIGINT even when this session was started ignoring it.

    A Python handler here is reset to the default in every child at exec, where an ignored
    signal would stay ignored.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not _is_controller(config):
        fork_launch.install()
    if _is_worker(config) and config.workerinput.get(_LOADGROUP):
        config.option.loadgroup = True  # xdist names the groups from this: see below
    if _is_controller(config):
        _make_suite_dir()  # the room's locks, whatever runs
        if config.option.dist == "load":  # -n N alone: the Ray tests' group needs loadgroup
            config.option.dist = "loadgroup"
        # loadgroup deals the work out by scope, by default the scopes with most tests first:
        # the groups (which need the whole warm-up) would go out before the unit tests and both
        # workers would wait out the warm-up idle; the suite's own order (tests/schedule.py) holds
        config.option.loadscopereorder = False
        if _runs_several_tiers(config) and not config.option.collectonly:
            _start_warming()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """Tell each worker that the tests are distributed by group. A worker parses the command
    line again (``-n 2``: ``load``), not the controller's switch to ``loadgroup``; without this
    it would not suffix the nodeids of an ``xdist_group``'s tests with the group, and the
    controller, seeing no group, would spread them over both workers."""
    if node.config.option.dist == "loadgroup":
        node.workerinput[_LOADGROUP] = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Start the test (its fixtures too) once the warm-up has compiled the stage it needs, and,
    with workers, inside the room: alone where it is marked ``alone``, else shared."""
    if _warming is not None:
        schedule.wait_for(schedule.stage_needed(item), _suite_dir, _warming.pid)
    else:
        schedule.wait_for(schedule.stage_needed(item), *schedule.inherited())
    if _room is None:
        yield
        return
    with _room.enter(alone=item.get_closest_marker("alone") is not None):
        yield


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    """Fail the test if it leaks a segment, a child process or a listening socket."""
    me = os.getpid()
    shm_before = _shm_entries()
    listen_before = _listening(_our_pids())
    yield
    problems = []

    children = _descendants()
    if children:
        _, children = psutil.wait_procs(children, timeout=_CHILD_GRACE_S)
    child_pids = {p.pid for p in children}

    leaked_shm, dead_shm = [], []
    for entry in sorted(_shm_entries() - shm_before):
        owner = parse_segment_name(entry)
        if owner is None:
            continue  # not named by hogwild.shm.naming: cannot tell whose it is
        if owner.pid == me or owner.pid in child_pids:
            leaked_shm.append("/" + entry)
        elif not owner_alive(owner):
            dead_shm.append("/" + entry)

    leaked_listen = _listening([me, *child_pids]) - listen_before

    if children:
        described = []
        for proc in children:
            try:
                described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]!r}")
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        psutil.wait_procs(children, timeout=5)
        problems.append(f"{len(children)} child process(es) still alive: {described}")
    for name in leaked_shm + dead_shm:
        sweeper.unlink_segment(name)
    if leaked_shm:
        problems.append(f"shared-memory segment(s) not removed: {leaked_shm}")
    for pid, fd, _ip, _port in sorted(leaked_listen):
        if pid == me and fd >= 0:
            _stop_listening(fd)
    if leaked_listen:
        listed = [f"{ip}:{port} (pid {pid})" for pid, _, ip, port in sorted(leaked_listen)]
        problems.append(f"listening socket(s) left open: {listed}")
    if problems:
        pytest.fail("resource leak: " + "; ".join(problems), pytrace=False)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository's root directory (the one holding ``pyproject.toml``)."""
    return Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def published_mnist_dir() -> Path:
    """The MNIST idx files as published (gzipped): ``$HOGWILD_TEST_DATA``, the shared data set,
    or downloaded."""
    from tests.mnist_files import mnist_dir as find

    return find()


@pytest.fixture(scope="session")
def mnist_dir(published_mnist_dir, tmp_path_factory) -> Path:
    """The same MNIST files, plain (not gzipped), written once per session (per worker): what
    the tests' jobs read, so that none of their processes decompresses them again."""
    from tests.mnist_files import plain_copy

    return plain_copy(published_mnist_dir, tmp_path_factory.getbasetemp() / "plain-mnist")
