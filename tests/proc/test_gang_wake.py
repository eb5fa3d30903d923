"""A worker gang's answer queue can be woken by another thread of the parent (a replica's
network thread with a command from its driver): the poll under way returns a ``Wake`` at once
instead of waiting out its timeout, and waiting for the workers' own answers passes over it.
A gang stopping while a worker is inside a command terminates that worker at once (it would
read its Stop only after the command) and asks an idle one to leave."""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
import time

import pytest

from hogwild.training.gang import STOP_TIMEOUT_S, WorkerGang
from hogwild.training.messages import Pinned, Stop, Train, Wake

pytestmark = pytest.mark.kernel_free


def _no_worker(setup, commands, results) -> None:  # pragma: no cover - never started
    raise AssertionError("a gang of none starts no process")


def test_wake_ends_a_poll_under_way_in_another_thread():
    gang = WorkerGang(multiprocessing.get_context("spawn"))
    gang.start(0, _no_worker, lambda worker: None)
    try:
        polled: list = []
        poller = threading.Thread(target=lambda: polled.append(gang.poll("waiting", 60.0)))
        poller.start()
        gang.wake()
        poller.join(60.0)
        assert not poller.is_alive()
        assert isinstance(polled[0], Wake)  # not None: the 60 s timeout did not run out
    finally:
        gang.stop()


def test_waiting_for_the_workers_passes_over_a_wake_and_a_stopped_gang_takes_none():
    gang = WorkerGang(multiprocessing.get_context("spawn"))
    gang.wake()  # not started: nothing to wake, no error
    gang.start(0, _no_worker, lambda worker: None)
    try:
        gang.wake()
        gang.results.put(Pinned(0))  # as a worker's answer comes
        assert gang.next_message("waiting", deadline=None) == Pinned(0)
    finally:
        gang.stop()
    gang.wake()  # stopped: its queue is closed, nothing to wake, no error


def _stuck_worker(setup, commands, results) -> None:
    """Pins itself, then takes commands: Stop leaves; a Train never ends (a shard whose
    exchange waits on a server that died), and SIGTERM leaves with 0, as a worker's does."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    results.put(Pinned(setup))
    while True:
        command = commands.get()
        if isinstance(command, Stop):
            return
        time.sleep(600)


def test_a_stopping_gang_terminates_a_busy_worker_at_once_and_asks_an_idle_one_to_leave():
    gang = WorkerGang(multiprocessing.get_context("spawn"))
    gang.start(2, _stuck_worker, lambda worker: worker)
    try:
        gang.send(0, Train(0, 0.1, 0, 10, 1))  # worker 0 busy; worker 1 idle
        assert gang.busy() == [0]
    finally:
        began = time.monotonic()
        gang.stop()
        took = time.monotonic() - began
    assert took < STOP_TIMEOUT_S, f"the stop waited {took:.1f} s for a worker inside a command"
    assert [p.exitcode for p in gang.processes] == [0, 0]  # each left by itself, none killed
    assert gang.busy() == []
