"""A worker gang's answer queue can be woken by another thread of the parent (a replica's
network thread with a command from its driver): the poll under way returns a ``Wake`` at once
instead of waiting out its timeout, and waiting for the workers' own answers passes over it."""

from __future__ import annotations

import multiprocessing
import threading

import pytest

from hogwild.training.gang import WorkerGang
from hogwild.training.messages import Pinned, Wake

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
