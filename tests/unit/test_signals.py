"""Signals held across a window: a SIGTERM or SIGINT that arrives inside ``deferred_signals``
acts right after it, also when other threads are running (the kernel may hand the signal to any
of them; Python runs the handler in the main thread). And signals not lost: one whose exception a
ctypes callback swallowed (as numba's compiler's callbacks through llvmlite do) acts again when
``interrupts_not_lost`` ends. And a server's stop request: ``StopRequest`` wakes its serving loop on
SIGINT or SIGTERM, whenever the signal lands, with handlers that take no lock. And a ``python -m``
program that caught a Ctrl-C raised inside a string's ``exec`` exits with its own status once
``forget_caught_interrupts`` ran, not by SIGINT."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from hogwild.errors import Terminated
from hogwild.signals import (
    StopRequest,
    deferred_signals,
    interrupts_not_lost,
    process_exists,
    terminate_as_interrupt,
)


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


@contextlib.contextmanager
def swallowed():
    """What ctypes dropped, instead of printed (and warned about by pytest). Set inside the test
    body: pytest before 8.4 puts its own hook in place for each phase of a test."""
    dropped: list[type] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda info: dropped.append(info.exc_type)
    try:
        yield dropped
    finally:
        sys.unraisablehook = previous


def test_a_callback_swallows_a_ctrl_c():
    """Why the guard exists: without it, the interrupt is gone."""
    with swallowed() as dropped:
        signal_inside_a_callback(signal.SIGINT)
    assert dropped == [KeyboardInterrupt]


@pytest.mark.parametrize(
    "signum, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)]
)
def test_a_swallowed_signal_acts_again_when_the_guard_ends(signum, raised):
    steps = []
    with swallowed() as dropped, terminate_as_interrupt(), pytest.raises(raised):
        with interrupts_not_lost():
            signal_inside_a_callback(signum)
            steps.append("after the callback")
    # the callback's report of the exception it dropped is kept off stderr: it acts instead
    assert dropped == [] and steps == ["after the callback"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_guard_puts_the_unraisable_hook_back():
    with swallowed():
        before = sys.unraisablehook
        with interrupts_not_lost():
            assert sys.unraisablehook is not before
        assert sys.unraisablehook is before


def test_other_errors_a_callback_drops_inside_the_guard_are_still_reported():
    def compare(a, b) -> int:
        raise ValueError("a comparison that fails")

    values = (ctypes.c_int * 2)(2, 1)
    with swallowed() as dropped, interrupts_not_lost():
        ctypes.CDLL(None).qsort(values, 2, ctypes.sizeof(ctypes.c_int), COMPARE(compare))
    assert dropped == [ValueError]


def test_a_swallowed_signal_wins_over_the_error_it_caused():
    """A compiler whose callback lost the interrupt may fail next: the interrupt comes out,
    with that failure as its context."""
    with swallowed(), pytest.raises(KeyboardInterrupt) as caught:
        with interrupts_not_lost():
            signal_inside_a_callback(signal.SIGINT)
            raise RuntimeError("the compiler failed")
    assert isinstance(caught.value.__context__, RuntimeError)


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


def test_a_handler_that_raises_nothing_is_called_once_per_signal():
    calls = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with interrupts_not_lost():
            signal_inside_a_callback(signal.SIGINT)
        assert calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with swallowed() as dropped, interrupts_not_lost():
            signal_inside_a_callback(signal.SIGINT)
        assert dropped == [] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_stop_signal_wakes_the_waiting_loop():
    sender = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
    with StopRequest() as stop:
        assert not stop.wait(0.01)
        sender.start()
        started = time.monotonic()
        try:
            woke = stop.wait(60.0)
        finally:
            sender.join(5)
    assert woke and stop.received == [signal.SIGTERM]
    assert time.monotonic() - started < 30.0  # the signal woke it, not the timeout


def test_a_signal_another_thread_receives_wakes_the_main_threads_wait():
    # The kernel may give a process's signal to any thread that does not block it; then no
    # system call of the main thread is interrupted, and only the wakeup fd can wake its wait.
    sender = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
    sender.start()  # before the mask: this thread (and its kill) may take SIGTERM
    with StopRequest() as stop:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        started = time.monotonic()
        try:
            woke = stop.wait(60.0)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            sender.join(5)
    assert woke and stop.received == [signal.SIGTERM]
    assert time.monotonic() - started < 30.0  # the signal woke it, not the timeout


def test_a_signal_between_two_waits_is_seen_by_the_next_one():
    with StopRequest() as stop:
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt: the request records it
        assert stop.received == [signal.SIGINT]
        assert stop.wait(0.0) and stop.wait(0.0)  # and it stays requested


def test_more_signals_than_the_pipe_holds_are_all_recorded():
    with StopRequest() as stop:
        for _ in range(70_000):  # a byte each into a 64 KiB pipe: the rest are dropped there
            signal.raise_signal(signal.SIGTERM)
        assert stop.wait(0.0)
    assert stop.received == [signal.SIGTERM] * 70_000


def test_the_previous_handlers_wakeup_fd_and_pipe_are_given_back_when_the_body_raises():
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    interrupt = signal.getsignal(signal.SIGINT)
    try:
        request = StopRequest()
        with pytest.raises(RuntimeError), request:
            fds = (request._read, request._write)
            assert signal.getsignal(signal.SIGTERM) == request._handle
            raise RuntimeError("the serving failed")
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is interrupt
        assert signal.set_wakeup_fd(-1) == -1  # none before, none after
        for fd in fds:
            with pytest.raises(OSError):
                os.fstat(fd)
    finally:
        signal.signal(signal.SIGTERM, previous)


CAUGHT_IN_EXEC = """
import os, signal, sys
from hogwild.signals import forget_caught_interrupts
signal.signal(signal.SIGINT, signal.default_int_handler)
try:  # as scipy's import does: exec("from numpy import *"), here interrupted
    exec("os.kill(os.getpid(), signal.SIGINT)\\nfor _ in range(10**6): pass")
except KeyboardInterrupt:
    print("caught", file=sys.stderr)
if sys.argv[1:] == ["forget"]:
    forget_caught_interrupts()
sys.exit(130)
"""


@pytest.mark.parametrize("forget, status", [(False, -signal.SIGINT), (True, 130)])
def test_a_ctrl_c_caught_after_a_string_exec_exits_with_the_programs_status(
    tmp_path, repo_root, forget, status
):
    """Without the guard, CPython ends a ``-m`` program by SIGINT after it caught the interrupt
    (the cause of a Ctrl-C'd ``python -m hogwild.cli train`` ending -2 after its own line)."""
    (tmp_path / "caught_in_exec.py").write_text(CAUGHT_IN_EXEC)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo_root)])}
    done = subprocess.run(
        [sys.executable, "-m", "caught_in_exec", *(["forget"] if forget else [])],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert "caught" in done.stderr
    assert done.returncode == status, done.stderr


def test_process_exists_tells_a_running_process_from_one_that_ended_and_was_reaped():
    assert process_exists(os.getpid()) and process_exists(1)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not process_exists(child.pid)  # reaped: the pid names nothing (until reused)
