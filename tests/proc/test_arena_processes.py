"""The arena across processes: attaching by name, and cleanup after normal and killed owners.

Children are started with ``spawn`` and ``forkserver`` (never bare ``fork``, see CONVENTIONS.md).
Other test sessions and trainers on this machine may sweep dead-owner segments at any moment, so
after a kill the tests check that the segment is gone after :func:`sweep`, not what it returned.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import pytest

from hogwild.shm import sweeper
from hogwild.shm.arena import Arena, ArenaLayout
from hogwild.shm.naming import owner_alive, parse_segment_name

pytestmark = pytest.mark.kernel_free

START_METHODS = ["spawn", "forkserver"]
TIMEOUT_S = 30.0


def _exists(name: str) -> bool:
    return (Path("/dev/shm") / name.lstrip("/")).exists()


def _layout() -> ArenaLayout:
    layout = ArenaLayout()
    layout.add("weights", np.float32, (4, 8))
    layout.add("counter", np.int64, (8,))
    return layout


def _attach_and_write(name: str, layout_json: str, worker: int) -> None:
    """Child: check what the parent wrote, then write our own mark."""
    with Arena.attach(name, ArenaLayout.from_json(layout_json)) as arena:
        assert not arena.is_owner
        weights = arena.array("weights")
        assert weights[0, 0] == 1.5, "the child sees the parent's write"
        weights[worker, :] += worker + 10
        arena.array("counter")[worker] = os.getpid()
        del weights


def _create_and_report(conn: Connection, job: str, linger: bool) -> None:
    """Child: create an arena, send its name, then either exit normally or wait to be killed."""
    arena = Arena.create(job, _layout())
    arena.array("counter")[0] = 7
    conn.send(arena.name)
    conn.close()
    if linger:
        time.sleep(TIMEOUT_S)
    # Exit without close() or unlink(): the exit hook must remove the segment.


def _run(
    ctx: mp.context.BaseContext, target: Callable[..., None], *args: object
) -> mp.process.BaseProcess:
    proc = ctx.Process(target=target, args=args)
    proc.start()
    return proc


@pytest.mark.parametrize("method", START_METHODS)
def test_children_attach_by_name_and_write(method):
    ctx = mp.get_context(method)
    layout = _layout()
    with Arena.create("proc_attach", layout) as arena:
        weights = arena.array("weights")
        weights[0, 0] = 1.5
        procs = [_run(ctx, _attach_and_write, arena.name, layout.to_json(), w) for w in (1, 2)]
        for proc in procs:
            proc.join(TIMEOUT_S)
            assert proc.exitcode == 0, f"{method} child failed with exit code {proc.exitcode}"
        np.testing.assert_array_equal(weights[1], np.full(8, 11, np.float32))
        np.testing.assert_array_equal(weights[2], np.full(8, 12, np.float32))
        assert weights[3].sum() == 0
        counters = arena.array("counter")
        assert list(counters[1:3]) == [p.pid for p in procs]
        del weights, counters


@pytest.mark.parametrize("method", START_METHODS)
def test_normal_exit_without_unlink_is_cleaned_by_exit_hook(method):
    ctx = mp.get_context(method)
    recv, send = ctx.Pipe(duplex=False)
    proc = _run(ctx, _create_and_report, send, "proc_exit", False)
    send.close()
    assert recv.poll(TIMEOUT_S), "the child never reported its segment"
    name = recv.recv()
    recv.close()
    proc.join(TIMEOUT_S)
    assert proc.exitcode == 0
    owner = parse_segment_name(name)
    assert owner is not None and owner.pid == proc.pid
    assert not _exists(name), f"{method} child exited normally but left {name}"


def test_killed_owner_leaves_a_segment_that_sweep_removes():
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = _run(ctx, _create_and_report, send, "proc_kill", True)
    send.close()
    try:
        assert recv.poll(TIMEOUT_S), "the child never reported its segment"
        name = recv.recv()
        owner = parse_segment_name(name)
        assert owner is not None and owner.pid == proc.pid
        assert _exists(name) and owner_alive(owner)
        assert name not in sweeper.sweep(), "the sweeper must not touch a live owner's segment"
        assert _exists(name)
        attached = Arena.attach(name, _layout())
        assert attached.array("counter")[0] == 7
        attached.close()
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(TIMEOUT_S)
        assert proc.exitcode == -signal.SIGKILL
        assert not owner_alive(owner)
        sweeper.sweep()
        assert not _exists(name), "sweep() left the segment of a killed owner"
    finally:
        recv.close()
        if proc.is_alive():
            proc.kill()
            proc.join(TIMEOUT_S)
