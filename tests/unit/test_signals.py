"""Signals held across a window: a SIGTERM or SIGINT that arrives inside ``deferred_signals``
acts right after it, also when other threads are running (the kernel may hand the signal to any
of them; Python runs the handler in the main thread)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from hogwild.errors import Terminated
from hogwild.signals import deferred_signals, terminate_as_interrupt


@pytest.fixture
def busy_thread():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, args=(30,), daemon=True)
    thread.start()
    yield thread
    stop.set()
    thread.join(5)


@pytest.mark.parametrize(
    "signum, raised", [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)]
)
def test_a_signal_inside_the_window_acts_after_it(busy_thread, signum, raised):
    finished = []
    with terminate_as_interrupt(), pytest.raises(raised):
        with deferred_signals():
            os.kill(os.getpid(), signum)
            for _ in range(1000):  # give the interpreter every chance to run a handler here
                sum(range(100))
            finished.append(True)
    assert finished == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_nested_windows_hold_until_the_outer_one_ends(busy_thread):
    steps = []
    with terminate_as_interrupt(), pytest.raises(Terminated):
        with deferred_signals():
            with deferred_signals():
                os.kill(os.getpid(), signal.SIGTERM)
            steps.append("inner done")
            sum(range(10000))
            steps.append("outer done")
    assert steps == ["inner done", "outer done"]
