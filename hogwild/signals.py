"""Process signals: SIGTERM stops a job as Ctrl-C does, and short windows in which signals wait.

``kill``, systemd, Slurm and Kubernetes stop a process with SIGTERM, whose default action ends
it at once: no ``finally``, no ``atexit``, so a job's shared memory and workers would be left
behind. :func:`terminate_as_interrupt` makes SIGTERM raise :class:`~hogwild.errors.Terminated`
(a ``KeyboardInterrupt``) in the main thread instead, so it takes the same cleanup path as
Ctrl-C; the CLI exits with 143 (128 + SIGTERM) after it.

A resource must be recorded by its owner in the same instant it comes to exist, or a signal
arriving in between leaks it. :func:`deferred_signals` holds SIGINT and SIGTERM across such a
window (their handlers only record them); the first to arrive acts, and raises, right after it.

Python drops an exception raised in a ctypes callback (it prints "Exception ignored on calling
ctypes callback function" and returns), and numba's compiler and cache call back into Python
through llvmlite all the time: a Ctrl-C that lands in one is lost, and the job trains on as if
nothing had been pressed. :func:`interrupts_not_lost` raises such a signal again once the code
inside returns (and keeps the dropped exception's traceback off stderr).

:func:`die_with_parent` asks Linux to signal a helper process when its parent exits, however it
exits: workers, pool helpers and the like end with their owner even after a SIGKILL.
:func:`die_with_process` does the same for an owner that is not the parent (a helper forked by
a forkserver), and :func:`die_with_pidfd` for an owner known by a pidfd already.

:func:`process_exists` sends signal 0, which only asks whether a pid names a process: the owners
of buffers, work directories and login sessions are told dead or alive by it.

A Ctrl-C the program caught can still end a ``python -m`` process by SIGINT (status -2, not the
program's own): CPython records a ``KeyboardInterrupt`` that leaves code run by ``exec`` or
``eval`` of a string, and a caught one stays recorded. Third-party imports run such strings
(scipy's ``exec("from numpy import *")`` imports ``numpy.f2py``), so a Ctrl-C landing there is
recorded. :func:`forget_caught_interrupts` clears that record once the program has answered.

A server's main thread waits for its stop signal in a loop that also watches its threads.
:class:`StopRequest` is that wait: its handler only records the signal, and the wait polls the
interpreter's wakeup fd, a pipe the signal writes into at C level. A handler that sets a
``threading.Event`` instead can hang the server for good: it runs in the main thread, between two
bytecodes, and when that is inside the same Event's ``wait`` (which holds the Event's lock for a
moment after each timeout) ``set`` waits forever for a lock its own thread holds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading

from hogwild.errors import Terminated

DEFERRED = (signal.SIGINT, signal.SIGTERM)
PR_SET_PDEATHSIG = 1  # prctl(2)


def _raise_terminated(signum, frame) -> None:
    raise Terminated(f"terminated by {signal.Signals(signum).name}")


def die_with_parent(signum: int) -> None:
    """Ask Linux to send this process ``signum`` when its parent exits (``PR_SET_PDEATHSIG``).

    A parent killed with SIGKILL runs no cleanup, so this is how its helpers still end. Where
    there is no ``prctl`` (not Linux) it does nothing: the caller must also notice a dead parent
    some other way (a poll, a closed pipe).
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def die_with_process(pid: int, signum: int) -> None:
    """Send this process ``signum`` when process ``pid`` (not necessarily its parent) ends.

    A process forked by multiprocessing's forkserver has the server as its parent, so
    :func:`die_with_parent` follows the server, not the process that asked for it. This watches
    ``pid`` itself: a daemon thread waits on a pidfd (Linux 5.3 and later), which becomes
    readable when that process ends, costing nothing until then. The caller checks afterwards that
    ``pid`` is still the process it means (a pid can be reused); one already gone gets the signal
    at once. Where there is no pidfd it does nothing: the caller must also notice the death some
    other way (a poll).
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        os.kill(os.getpid(), signum)
        return
    except (AttributeError, OSError):
        return
    die_with_pidfd(pidfd, signum)


def die_with_pidfd(pidfd: int, signum: int) -> None:
    """Send this process ``signum`` when the process ``pidfd`` refers to ends (at once if it
    has): a daemon thread waits on the pidfd, and closes it after."""

    def watch() -> None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.poll()  # retried after a signal's handler (PEP 475); returns when pid has ended
        os.close(pidfd)
        os.kill(os.getpid(), signum)

    threading.Thread(target=watch, name=f"die-with-pidfd-{pidfd}", daemon=True).start()


def process_exists(pid: int) -> bool:
    """Whether ``pid`` names a process, this user's or another's (a zombie not yet reaped
    included): signal 0 is checked for, never sent."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def install_terminate_handler() -> None:
    """Make SIGTERM raise :class:`~hogwild.errors.Terminated` in this (main) thread from now on."""
    signal.signal(signal.SIGTERM, _raise_terminated)


@contextlib.contextmanager
def terminate_as_interrupt():
    """While inside, SIGTERM raises :class:`~hogwild.errors.Terminated` (main thread only).

    A handler the program installed itself is left alone; the previous one is restored on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        yield
        return
    install_terminate_handler()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def deferred_signals():
    """Hold SIGINT and SIGTERM while inside; the first that arrived is acted on right after.

    Python runs signal handlers in the main thread whichever thread the kernel delivered the
    signal to, so blocking the signals in the main thread alone would not hold them once the
    process has other threads (a launcher's readers, ZeroMQ's, an HTTP endpoint's). Inside, the
    main thread's handlers only record the signal; on the way out the previous handlers are back
    and the recorded signal goes to its handler (raising ``KeyboardInterrupt`` or
    ``Terminated``). In another thread, the signals are blocked for that thread instead.
    """
    if threading.current_thread() is not threading.main_thread():
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return
    pending: list[int] = []

    def record(signum, frame) -> None:
        pending.append(signum)

    # signal.signal() first runs a Python handler already pending, which may raise: every swap is
    # retried until it took, and the first exception is raised once every handler is back.
    handlers = {s: signal.getsignal(s) for s in DEFERRED}
    raised: list[BaseException] = []
    try:
        for s in DEFERRED:
            _swap(s, record, raised)
        if not raised:
            yield
    finally:
        for s, handler in handlers.items():
            _swap(s, signal.SIG_DFL if handler is None else handler, raised)
        if raised:
            raise raised[0]
        if pending:
            handler = handlers[pending[0]]
            if callable(handler):
                handler(pending[0], None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(pending[0])


def _swap(signum: int, handler, raised: list[BaseException]) -> None:
    """Install ``handler``, whatever a pending signal's handler raises meanwhile (recorded)."""
    for _ in range(100):  # each raise consumes one pending signal: this ends
        try:
            signal.signal(signum, handler)
            return
        except BaseException as exc:  # noqa: BLE001 - Terminated, KeyboardInterrupt
            raised.append(exc)


@contextlib.contextmanager
def interrupts_not_lost():
    """While inside, SIGINT and SIGTERM act at once as before; one whose exception did not come
    out of the code inside (a callback swallowed it) acts again on the way out, also when
    another error came out instead (a compiler the callback failed): the interrupt is what the
    user asked for, and that error is its context.

    Only signals with a Python handler are watched (in the main thread; elsewhere this does
    nothing): an ignored signal stays ignored, a default one still ends the process, and a
    handler that raises nothing (one that sets a flag) is called once per signal.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers = {s: signal.getsignal(s) for s in DEFERRED}
    watched = {s: handler for s, handler in handlers.items() if callable(handler)}
    arrived: list[tuple[int, type]] = []  # signals whose handler raised, and what it raised

    def remember(signum, frame) -> None:
        try:
            watched[signum](signum, frame)
        except BaseException as exc:
            arrived.append((signum, type(exc)))
            raise  # where nothing swallows it, it comes out of the code inside

    previous_hook = sys.unraisablehook

    def quiet(unraisable) -> None:
        # A callback that swallowed the signal's exception reports it as unraisable (a ctypes
        # traceback on stderr); it acts again on the way out: say nothing of it here.
        if not any(unraisable.exc_value.__class__ is kind for _, kind in arrived):
            previous_hook(unraisable)

    raised: list[BaseException] = []
    for s in watched:
        _swap(s, remember, raised)
    sys.unraisablehook = quiet
    try:
        if raised:
            raise raised[0]
        yield
    except BaseException as exc:
        if any(isinstance(exc, kind) for _, kind in arrived):
            arrived.clear()  # the signal's exception came out: it acted
        raise
    finally:
        sys.unraisablehook = previous_hook
        restored: list[BaseException] = []
        for s, handler in watched.items():
            _swap(s, handler, restored)
        if restored:  # a signal that arrived while the handlers went back
            raise restored[0]
        if arrived:
            signum = arrived[0][0]
            watched[signum](signum, None)


def forget_caught_interrupts() -> None:
    """Let a program that caught every ``KeyboardInterrupt`` exit with the status it chose.

    CPython marks an interrupt "unhandled" when it propagates out of code that ``exec`` or
    ``eval`` ran from a string (``run_eval_code_obj``), even when a caller then catches it; an
    interpreter started with ``-m`` checks that mark after its last exit handler and, if set,
    ends itself by SIGINT, whatever ``sys.exit`` said. Running a string clears the mark before
    its code runs, so an empty one clears it. Call it only once the program's own handling is
    done: an interrupt it did not catch is marked again as it leaves the main module.
    """
    exec("")  # clears the interpreter's "unhandled KeyboardInterrupt" mark


class StopRequest:
    """SIGINT and SIGTERM as a request to stop that a serving loop waits on (main thread only).

    Use it as a context manager around the serving: the handlers are installed on entry and the
    previous ones (and the previous wakeup fd) restored on exit, also when the body raised.
    :meth:`wait` returns ``True`` once a signal arrived, ``False`` after ``timeout_s`` without
    one; :attr:`received` lists the signals in order. The handler only records: the pipe the
    wait polls is the interpreter's wakeup fd (``signal.set_wakeup_fd``), which the C-level
    handler writes from whichever thread the kernel gave the signal to, so the wait wakes then
    too, not only at its timeout. No lock anywhere (see the module docstring).
    """

    def __init__(self, signals: tuple[int, ...] = DEFERRED) -> None:
        self.signals = signals
        self.received: list[int] = []
        self._previous: dict[int, object] = {}
        self._previous_wakeup: int | None = None
        self._read = self._write = -1
        self._poll = select.poll()

    def __enter__(self) -> StopRequest:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._poll.register(self._read, select.POLLIN)
        try:
            self._previous_wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        raised: list[BaseException] = []
        try:  # a pending signal's handler may raise while one is swapped back: every one is
            for signum, handler in self._previous.items():
                _swap(signum, signal.SIG_DFL if handler is None else handler, raised)
            if self._previous_wakeup is not None:
                signal.set_wakeup_fd(self._previous_wakeup)
        finally:
            self._previous, self._previous_wakeup = {}, None
            for fd in (self._read, self._write):
                if fd >= 0:
                    os.close(fd)
            self._read = self._write = -1
        if raised:
            raise raised[0]

    def _handle(self, signum, frame) -> None:
        self.received.append(signum)

    def wait(self, timeout_s: float) -> bool:
        """Whether a stop signal arrived, waiting up to ``timeout_s`` seconds for one."""
        if not self.received:
            self._poll.poll(max(0, int(timeout_s * 1000)))  # retried after a handler (PEP 475)
            with contextlib.suppress(BlockingIOError):
                os.read(self._read, 4096)
        return bool(self.received)
