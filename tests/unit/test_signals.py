"""Signals held across a window: a SIGTERM or SIGINT that arrives inside ``deferred_signals``
acts right after it, also when other threads are running (the kernel may hand the signal to any
of them; Python runs the handler in the main thread). And signals not lost: one whose exception a
ctypes callback swallowed (as numba's compiler's callbacks through llvmlite do) acts again when
``interrupts_not_lost`` ends."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

import pytest

from hogwild.errors import Terminated
from hogwild.signals import deferred_signals, interrupts_not_lost, terminate_as_interrupt


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


COMPARE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def signal_inside_a_callback(signum: int) -> None:
    """Deliver ``signum`` while Python runs a ctypes callback (libc's qsort calling a Python
    comparison): its handler runs there, and ctypes drops what it raises."""

    def compare(a, b) -> int:
        os.kill(os.getpid(), signum)
        for _ in range(1000):  # the handler runs here, inside the callback
            sum(range(100))
        return 0

    values = (ctypes.c_int * 2)(2, 1)
    ctypes.CDLL(None).qsort(values, 2, ctypes.sizeof(ctypes.c_int), COMPARE(compare))


@pytest.fixture
def swallowed(monkeypatch):
    """What ctypes dropped (instead of printing it, and pytest warning about it)."""
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: dropped.append(info.exc_type))
    return dropped


def test_a_callback_swallows_a_ctrl_c(swallowed):
    """Why the guard exists: without it, the interrupt is gone."""
    signal_inside_a_callback(signal.SIGINT)
    assert swallowed == [KeyboardInterrupt]


@pytest.mark.parametrize(
    "signum, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)]
)
def test_a_swallowed_signal_acts_again_when_the_guard_ends(swallowed, signum, raised):
    steps = []
    with terminate_as_interrupt(), pytest.raises(raised):
        with interrupts_not_lost():
            signal_inside_a_callback(signum)
            steps.append("after the callback")
    assert swallowed == [raised] and steps == ["after the callback"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_that_came_out_acts_once():
    caught = []
    try:
        with interrupts_not_lost():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                sum(range(100))
    except KeyboardInterrupt as exc:
        caught.append(exc)
    assert len(caught) == 1 and caught[0].__context__ is None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_signal_stays_ignored(swallowed):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts_not_lost():
            signal_inside_a_callback(signal.SIGINT)
        assert swallowed == [] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
