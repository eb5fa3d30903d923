"""Workers forked from the preloaded forkserver (:mod:`hogwild.training.zygote`).

Proves that a worker forked from the server trains exactly as a spawned one (the same weights
from a seeded one-worker run), that a process keeps one server while its environment stays and
gets a fresh one when a variable changed (a forked child sees the value set since, never the
server's stale one), that a server whose children live is never replaced under them (that start
uses spawn), that one that died is started again, that a plain-forked child of the process
holding the server's "alive" pipe delays neither its replacement nor its stop, that a gang
whose server died names it and still ends its workers, and that a process watching another (as
a forked worker watches its trainer) gets its signal when that one ends. A server forked from its
trainer starts a worker (one thread in both, the trainer's OpenBLAS pool notwithstanding, and the
locks held around the fork free in the worker), and multiprocessing internals other than the
ones such a fork fills in (Python 3.14's authenticated server) refuse it. The signal tests of
``hogwild train`` (tests/proc/test_cli_signals.py) prove that Ctrl-C, SIGTERM and SIGKILL of the
trainer leave neither its workers nor its forkserver behind.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

import hogwild
from hogwild.data.mnist import load_mnist
from hogwild.errors import WorkerDiedError
from hogwild.training import zygote
from hogwild.training.gang import WorkerGang
from hogwild.training.metrics import read_metrics
from tests.bench_runs import small_slice
from tests.proc.zygote_probe import (
    PROBE,
    REPLY_TIMEOUT_S,
    pinned_then_sleeping,
    report_environment,
)


@pytest.fixture(scope="module")
def small(mnist_dir):
    return small_slice(load_mnist(mnist_dir))


def _start_probe(context, hold=None):
    replies = context.Queue()
    child = context.Process(target=report_environment, args=(replies, hold), daemon=True)
    child.start()
    reply = replies.get(timeout=REPLY_TIMEOUT_S)
    return child, reply


def test_a_forked_worker_trains_exactly_as_a_spawned_one(small, tmp_path):
    weights = {}
    for method in ("spawn", "forkserver"):
        metrics = tmp_path / f"{method}.jsonl"
        result = hogwild.train(
            data=small,
            workers=1,
            epochs=1,
            subset=300,
            seed=3,
            progress=False,
            overrides={"train.start_method": method, "output.metrics": str(metrics)},
        )
        assert result.history[0]["examples"] == 300
        start = next(r for r in read_metrics(metrics) if r["event"] == "start")
        assert start["start_method"] == method, "the workers did not start as asked"
        weights[method] = result.weights
    assert zygote.server_pid() is not None  # the server the forked worker came from
    assert weights["spawn"].keys() == weights["forkserver"].keys()
    for name, value in weights["spawn"].items():
        np.testing.assert_array_equal(weights["forkserver"][name], value, err_msg=name)


def test_a_changed_variable_starts_a_fresh_server_and_the_child_sees_it(monkeypatch):
    monkeypatch.setenv(PROBE, "first")
    with zygote.starting("forkserver") as context:
        child, (seen, parent, _) = _start_probe(context)
    child.join(REPLY_TIMEOUT_S)
    first_server = zygote.server_pid()
    assert seen == "first" and parent == first_server

    with zygote.starting("forkserver") as context:  # nothing changed: the same server
        child, (seen, parent, _) = _start_probe(context)
    child.join(REPLY_TIMEOUT_S)
    assert zygote.server_pid() == first_server and parent == first_server

    monkeypatch.setenv(PROBE, "second")
    with zygote.starting("forkserver") as context:
        child, (seen, parent, _) = _start_probe(context)
    child.join(REPLY_TIMEOUT_S)
    assert seen == "second", "a forked child saw the environment of a server started before"
    assert parent == zygote.server_pid() != first_server
    assert not psutil.pid_exists(first_server), "the replaced server was left running"


def test_a_server_with_live_children_is_not_replaced_under_them(monkeypatch):
    monkeypatch.setenv(PROBE, "before")
    with zygote.starting("forkserver") as context:
        hold = context.Event()
        held, (seen, server, _) = _start_probe(context, hold)
    try:
        assert seen == "before"
        monkeypatch.setenv(PROBE, "after")
        with zygote.starting("forkserver") as context:
            assert context.get_start_method() == "spawn"  # correct, if slower, this once
            child, (seen, parent, _) = _start_probe(context)
        child.join(REPLY_TIMEOUT_S)
        assert seen == "after" and parent == os.getpid()
        assert zygote.server_pid() == server and held.is_alive()
    finally:
        hold.set()
        held.join(REPLY_TIMEOUT_S)


def test_a_server_that_died_is_started_again():
    with zygote.starting("forkserver") as context:
        child, _ = _start_probe(context)
    child.join(REPLY_TIMEOUT_S)
    dead = psutil.Process(zygote.server_pid())
    dead.kill()  # not reaped here: multiprocessing waits for the pid it recorded
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while zygote.server_pid() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert zygote.server_pid() is None
    with zygote.starting("forkserver") as context:
        assert context.get_start_method() == "forkserver"
        child, (_, parent, _) = _start_probe(context)
    child.join(REPLY_TIMEOUT_S)
    assert parent == zygote.server_pid() != dead.pid


def test_the_server_takes_the_limit_on_blas_threads_and_the_caller_gets_its_own_back(
    monkeypatch,
):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    with zygote.starting("forkserver") as context:
        child, (_, _, blas) = _start_probe(context)
    child.join(REPLY_TIMEOUT_S)
    assert blas == "1"
    assert os.environ["OMP_NUM_THREADS"] == "4"


def test_spawn_is_multiprocessing_own():
    with zygote.starting("spawn") as context:
        assert context is mp.get_context("spawn")


WATCHER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    from hogwild.signals import die_with_process
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    die_with_process(owner.pid, signal.SIGTERM)
    print(owner.pid, flush=True)
    time.sleep(60)
    """
)


def test_a_process_watching_another_gets_the_signal_when_it_ends():
    """The watcher is the owner's parent here only so that the test can end the owner: the
    signal comes from the owner's end, whoever its parent is (a forkserver's child's case)."""
    watcher = subprocess.Popen([sys.executable, "-c", WATCHER], stdout=subprocess.PIPE, text=True)
    owner = None
    try:
        owner = psutil.Process(int(watcher.stdout.readline()))
        owner.kill()
        assert watcher.wait(REPLY_TIMEOUT_S) == -signal.SIGTERM
    finally:
        watcher.kill()
        watcher.communicate()
        if owner is not None and owner.is_running():
            owner.kill()


def _fork_holding_every_fd(seconds: float) -> int:
    """A plain fork() of this process (as a user's fork Pool makes), holding a copy of every fd
    it has, the forkserver's "alive" pipe included, for ``seconds``."""
    pid = os.fork()
    if pid == 0:  # the child: no Python beyond a sleep, then out without cleanup
        try:
            time.sleep(seconds)
        finally:
            os._exit(0)
    return pid


def test_a_plain_forked_child_holding_the_alive_pipe_delays_neither_replacement_nor_stop(
    monkeypatch,
):
    hold_s = 30.0
    monkeypatch.setenv(PROBE, "before")
    with zygote.starting("forkserver") as context:
        assert context.get_start_method() == "forkserver"
    first = zygote.server_pid()
    holder = _fork_holding_every_fd(hold_s)
    try:
        monkeypatch.setenv(PROBE, "after")
        began = time.monotonic()
        with zygote.starting("forkserver") as context:
            assert context.get_start_method() == "forkserver"
            child, (seen, parent, _) = _start_probe(context)
        child.join(REPLY_TIMEOUT_S)
        assert seen == "after" and parent == zygote.server_pid() != first
        assert zygote.stop_server() and zygote.server_pid() is None
        assert time.monotonic() - began < hold_s / 2, "waited for the holder of the pipe"
        assert not psutil.pid_exists(first)
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)


def test_a_gang_whose_forkserver_died_names_it_and_stop_ends_the_workers_still_running():
    with zygote.starting("forkserver") as context:
        gang = WorkerGang(context)
        try:
            gang.start(1, pinned_then_sleeping, lambda worker: worker)
        except BaseException:
            gang.stop()
            raise
    (process,) = gang.processes
    worker = psutil.Process(process.pid)
    try:
        assert worker.ppid() == zygote.server_pid()
        os.kill(zygote.server_pid(), signal.SIGKILL)
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while process.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process.exitcode == 255 and worker.is_running()  # reported ended, still running
        with pytest.raises(WorkerDiedError, match="forkserver"):
            gang.poll("training", 0.01)
    finally:
        gang.stop()
        zygote.stop_server()  # reaps the dead server
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE


SHADOWED = textwrap.dedent(
    """
    import sys
    from hogwild.training import zygote

    def report():  # the hogwild this forked child has: the server's, imported by its preload
        print(sys.modules["hogwild"].__file__, flush=True)

    if __name__ == "__main__":
        with zygote.starting("forkserver") as context:
            assert context.get_start_method() == "forkserver"
            child = context.Process(target=report)
            child.start()
        child.join(60)
        assert child.exitcode == 0, child.exitcode
        zygote.stop_server()
    """
)


def test_the_server_imports_hogwild_from_the_trainers_path_not_a_folder_in_its_cwd(tmp_path):
    shadow = tmp_path / "cwd" / "hogwild"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")  # a package named hogwild, without the engine
    script = tmp_path / "script" / "start.py"
    script.parent.mkdir()
    script.write_text(SHADOWED)
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=shadow.parent,
        capture_output=True,
        text=True,
        timeout=REPLY_TIMEOUT_S * 2,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == hogwild.__file__, run.stderr


FORKED = textwrap.dedent(
    """
    import json, os, sys
    import numpy  # loads OpenBLAS, which starts its pool: one thread a core but one
    import psutil
    from hogwild.training import zygote

    def report(conn):  # a worker forked from the forked server
        # the locks held around the fork are free in it: it could start processes of its own
        free = zygote._lock.acquire(timeout=5) and zygote._forkserver()._lock.acquire(timeout=5)
        conn.send((os.getppid(), psutil.Process().num_threads(), free))

    if __name__ == "__main__":
        before = psutil.Process().num_threads()  # this one, with OpenBLAS's pool
        cores = len(os.sched_getaffinity(0))
        reason = zygote.import_and_fork_server("a test of the forked server")
        assert reason is None, reason
        server = zygote.server_pid()
        with zygote.starting("forkserver") as context:
            assert context.get_start_method() == "forkserver"
            parent, child = context.Pipe()
            worker = context.Process(target=report, args=(child,))
            worker.start()
            assert parent.poll(60), "the worker never answered"
            ppid, worker_threads, free = parent.recv()
        worker.join(60)
        assert worker.exitcode == 0, worker.exitcode
        json.dump({
            "server": server, "reused": zygote.server_pid(), "ppid": ppid,
            "title": " ".join(psutil.Process(server).cmdline()),
            "server_threads": psutil.Process(server).num_threads(),
            "worker_threads": worker_threads, "before": before, "cores": cores, "free": free,
            "after": psutil.Process().num_threads(),
        }, sys.stdout)
        assert zygote.stop_server()
    """
)


def test_a_worker_starts_through_a_server_forked_from_its_trainer(tmp_path):
    # the trainer loads OpenBLAS with its pool (no limit in its environment); a newer Python's
    # forkserver, which a fork cannot fill in, refuses and fails the first assert with why
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    blas_limits = {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"}
    env = {name: value for name, value in os.environ.items() if name not in blas_limits}
    run = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert found["ppid"] == found["server"] == found["reused"]  # the forked one, used
    assert found["free"], found
    assert f"{zygote.FORKED_TITLE}, for a test of the forked server" in found["title"]
    # one thread, though its trainer ran a BLAS pool: limited before the fork, not after it
    assert found["server_threads"] == 1 and found["worker_threads"] == 1, found
    if found["cores"] > 1:  # the pool the count had to see ended, and back in the trainer
        assert found["before"] > 1 and found["after"] >= found["before"], found


def test_a_forkserver_unlike_the_one_a_fork_fills_in_is_started_afresh(monkeypatch):
    server = multiprocessing.forkserver._forkserver
    monkeypatch.setattr(server, "_forkserver_authkey", None, raising=False)  # Python 3.14's
    assert "authenticates" in zygote.fork_server("a test")
    monkeypatch.delattr(server, "_forkserver_authkey")
    monkeypatch.delattr(server, "_preload_modules")
    assert "_preload_modules" in zygote.fork_server("a test")
    monkeypatch.undo()

    def main(listener_fd, alive_r, preload, main_path=None, sys_path=None, *, authkey_r=None):
        raise AssertionError("never called")

    monkeypatch.setattr(multiprocessing.forkserver, "main", main)
    assert "authkey_r" in zygote.fork_server("a test")
