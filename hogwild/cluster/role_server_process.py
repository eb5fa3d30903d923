"""The role server's own process: preloads what roles import, then forks one child per request
of its driver and makes each child the role (:mod:`hogwild.cluster.role_server` is the driver's
side and says what a forked role gets: its session, its stdio, its environment, its death with the
driver, its exit status, its title).

The server is single-threaded, so that a child's ``PR_SET_PDEATHSIG`` follows the server and no
lock a child needs is held by another thread at a fork. It reads requests and reaps children in
one loop over a socket pair inherited from the driver (never a path), the children's pidfds and
the driver's pidfd; it stops taking requests when the driver closes its end or dies, and exits
once its last child has ended. A SIGTERM (noted by a handler through a wake-up pipe the loop
polls, so that the loop, not the handler, acts on it) stops its taking requests too, and is
passed on to every child; it exits once they have ended, or after ``ROLES_STOP_WAIT_S``.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys
import threading
import time

from hogwild.cluster.role_server import (
    BYE,
    DRIVER_EXIT_WAIT_S,
    EXIT_DRIVER_GONE,
    MAX_REQUEST,
    PR_SET_PDEATHSIG,
    PRELOAD,
    PRELOAD_GROUPS,
    ROLES_STOP_WAIT_S,
    STATUS,
    polled,
    readable,
    role_title,
)
from hogwild.process_title import set_title

_title = "hogwild role server"  # this server's title, which names the job's run directory


def serve(driver_pid: int, control_fd: int) -> list[str]:
    """The server's loop. Returns only in a forked child, the role's ``hogwild`` argv, once the
    child has become the role (see the module docstring); the server itself exits."""
    if os.getppid() != driver_pid:
        sys.exit(0)  # the driver is gone already
    driver = os.pidfd_open(driver_pid)
    if os.getppid() != driver_pid:  # the pidfd may name a process started since
        sys.exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver stops the roles, then this
    # A SIGTERM is passed on to the roles (their flush) rather than ending this server, whose
    # death would SIGKILL them: its Python handler does nothing, the byte the interpreter
    # writes for it into this pipe wakes the loop, which acts on it. Set before the preload,
    # so a SIGTERM meanwhile is not lost either.
    wakeup_r, wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wakeup_w)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    global _title
    _title = sys.argv[3] if len(sys.argv) > 3 else "hogwild role server"
    set_title(_title)
    _preload()
    # A fork copies only the forking thread, and a child's PR_SET_PDEATHSIG follows the
    # thread that forked it: no thread of the server's may hold a lock a child needs, or end
    # before the server. Only Python's threads are counted here, not native ones (a BLAS pool).
    if threading.active_count() != 1:
        print(f"hogwild role server: a preloaded module started a thread: "
              f"{threading.enumerate()}", file=sys.stderr, flush=True)  # fmt: skip
        sys.exit(1)
    gc.freeze()  # the preloaded objects: no child's collection walks them, their pages stay shared
    control = socket.socket(fileno=control_fd)
    return _Server(driver, driver_pid, control, (wakeup_r, wakeup_w)).run()


def _preload() -> None:
    import importlib

    from hogwild.entry_points import load, names

    for module in PRELOAD:
        importlib.import_module(module)
    for group in PRELOAD_GROUPS:
        for name in names(group):
            # The role that uses it says what is missing; a plugin that exits on import
            # does not end the server.
            with contextlib.suppress(Exception, SystemExit):
                load(group, name)


class _Child:
    """A role the server forked: its pidfd (readable once it exits) and status pipe."""

    def __init__(self, pid: int, pidfd: int, status: int) -> None:
        self.pid, self.pidfd, self.status = pid, pidfd, status


class _Server:
    def __init__(
        self, driver: int, driver_pid: int, control: socket.socket, wakeup: tuple[int, int]
    ) -> None:
        self.driver, self.driver_pid = driver, driver_pid
        self.said_bye = False  # the driver closed its end itself, alive
        self.control: socket.socket | None = control
        self.children: dict[int, _Child] = {}  # by pidfd
        self.wakeup = wakeup  # the signal wake-up pipe: (read end, write end)
        self.stop_by: float | None = None  # once SIGTERMed: when it exits, its roles or not

    def run(self) -> list[str]:
        """Serve until the driver closes its end or dies and the last child has been reaped,
        or, once SIGTERMed, until the last child has or the wait for them is over."""
        while self.control is not None or self.children:
            watched = [*self.children, self.wakeup[0]]
            if self.control is not None:
                watched += [self.driver, self.control.fileno()]
            wait_s = None if self.stop_by is None else self.stop_by - time.monotonic()
            if wait_s is not None and wait_s <= 0:
                break  # the roles left running are SIGKILLed as this server exits
            for fd, events in polled(watched, wait_s).items():
                if fd == self.wakeup[0]:
                    self._signalled()
                elif fd in self.children:
                    self._reap(self.children.pop(fd))
                elif fd == self.driver:  # each child watches it too, and stops
                    self._stop_accepting()
                elif self.control is None or fd != self.control.fileno():
                    continue
                elif events & (select.POLLHUP | select.POLLERR):
                    # The driver closed its end (or died): a request it left queued is not
                    # forked, as nobody would read the reply or stop the role.
                    self._hung_up()
                else:
                    argv = self._accept()
                    if argv is not None:
                        return argv  # in the child
        # The driver died (SIGKILL) if its pidfd is readable; a socket closed without a bye
        # may be a death whose pidfd is not readable yet (the kernel closes a dying process's
        # files before it reports the exit)
        wait_s = 0.0 if self.said_bye or self.stop_by is not None else DRIVER_EXIT_WAIT_S
        if polled([self.driver], wait_s):  # what the dead driver owned, we release
            from hogwild.shm.sweeper import sweep_owner

            with contextlib.suppress(Exception):  # a segment left is swept by the next job
                sweep_owner(self.driver_pid)
        sys.exit(0)

    def _signalled(self) -> None:
        """The wake-up pipe is readable: at a SIGTERM (once), stop taking requests and pass it on
        to every child, which are then waited for at most ``ROLES_STOP_WAIT_S``."""
        with contextlib.suppress(BlockingIOError):
            signals = os.read(self.wakeup[0], 64)
            if signal.SIGTERM in signals and self.stop_by is None:
                print(f"hogwild role server: SIGTERM: passed on to its {len(self.children)} "
                      f"roles, waited for {ROLES_STOP_WAIT_S:g} s at most", file=sys.stderr,
                      flush=True)  # fmt: skip
                self.stop_by = time.monotonic() + ROLES_STOP_WAIT_S
                self._stop_accepting()
                for pidfd in self.children:
                    with contextlib.suppress(ProcessLookupError):
                        signal.pidfd_send_signal(pidfd, signal.SIGTERM)

    def _hung_up(self) -> None:
        """The driver's end is closed: read what it left only to know whether it said bye."""
        with contextlib.suppress(OSError):
            data, fds, _, _ = socket.recv_fds(self.control, MAX_REQUEST, 2, socket.MSG_DONTWAIT)
            for fd in fds:
                os.close(fd)
            self.said_bye = data == BYE and not fds
        self._stop_accepting()

    def _stop_accepting(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None

    def _reap(self, child: _Child) -> None:
        _, status = os.waitpid(child.pid, 0)
        with contextlib.suppress(OSError):  # the driver may have closed its end
            os.write(child.status, STATUS.pack(os.waitstatus_to_exitcode(status)))
        os.close(child.status)
        os.close(child.pidfd)

    def _accept(self) -> list[str] | None:
        """Take one request; in the forked child, the role's argv, else None."""
        try:
            data, fds, _, _ = socket.recv_fds(self.control, MAX_REQUEST, 2)
        except OSError:
            data, fds = b"", []
        if not data or (data == BYE and not fds):  # the driver closed its end
            for fd in fds:
                os.close(fd)
            self.said_bye = data == BYE
            self._stop_accepting()
            return None
        try:
            request = _parse_request(data, fds)
        except ValueError as error:
            for fd in fds:
                os.close(fd)
            self._reply({"error": str(error)}, [])
            return None
        stderr, status = fds
        try:
            pid, pidfd = self._fork(request, stderr, status)
        except OSError as error:  # no process or no fd left: this role is refused, not the job
            os.close(status)
            self._reply({"error": f"fork failed: {error}"}, [])
            return None
        if pid == 0:
            return request["argv"]
        self.children[pidfd] = _Child(pid, pidfd, status)
        if not self._reply({"pid": pid}, [pidfd]):  # the driver has gone: nobody stops it
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return None

    def _fork(self, request: dict, stderr: int, status: int) -> tuple[int, int]:
        """Fork the role: ``(0, -1)`` in the child once it has become the role, ``(pid, pidfd)``
        in the server once the child has its own session (so the launcher can signal its group
        as soon as it hears of it). Closes ``stderr`` in the server.

        Raises:
            OSError: No pipe, no process or no pidfd; no child is left running.
        """
        try:
            started_r, started_w = os.pipe()
        except OSError:
            os.close(stderr)
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        server = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            for fd in (started_r, started_w, stderr):
                os.close(fd)
            raise
        if pid == 0:
            try:
                os.close(started_r)
                self._become_role(request, stderr, status, server, started_w)
            except BaseException:  # never back into the server's loop
                import traceback

                traceback.print_exc()
                os._exit(1)
            return 0, -1
        os.close(stderr)
        os.close(started_w)
        try:
            pidfd = os.pidfd_open(pid)  # before any wait: the pid cannot be reused yet
        except OSError:
            os.close(started_r)
            os.kill(pid, signal.SIGKILL)  # not yet waited for: the pid is still the child's
            os.waitpid(pid, 0)
            raise
        try:
            os.read(started_r, 1)  # a byte once it called setsid; nothing if it exited first
        finally:
            os.close(started_r)
        return pid, pidfd

    def _reply(self, reply: dict, fds: list[int]) -> bool:
        """Send ``reply``; whether it was sent (not: the driver has gone)."""
        try:
            socket.send_fds(self.control, [json.dumps(reply).encode()], fds)
        except OSError:  # found by the loop at its next poll
            return False
        return True

    def _become_role(
        self, request: dict, stderr: int, status: int, server: int, started: int
    ) -> None:
        """In the forked child: everything the shim and ``Popen`` would have given the role;
        a byte on ``started`` once it leads its own session."""
        # First: a SIGTERM is the role's own (its default), never noted for the server, and
        # never lost to the server's handler once the launcher knows of the role.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        for fd in self.wakeup:
            os.close(fd)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != server or readable([self.driver], 0):
            os._exit(EXIT_DRIVER_GONE)  # the server or the driver ended meanwhile
        os.close(status)
        for child in self.children.values():
            os.close(child.status)
            os.close(child.pidfd)
        self.children = {}
        os.close(self.control.detach())
        self.control = None
        os.setsid()
        os.write(started, b"s")
        os.close(started)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(stderr, 2)
        os.close(devnull)
        os.close(stderr)
        for signum in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(
            signal.SIGINT,
            signal.SIG_IGN if request["sigint_ignored"] else signal.default_int_handler,
        )
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.sched_setaffinity(0, request["cpus"])
        set_title(role_title(request["argv"]))
        if "numpy" in sys.modules:  # a fresh interpreter's global state is drawn afresh
            sys.modules["numpy"].random.seed()
        if "multiprocessing.process" in sys.modules:
            sys.modules["multiprocessing.process"].current_process().authkey = os.urandom(32)
        if request["workers"]:  # now, while this is the only thread
            from hogwild.training.zygote import fork_server

            # else (it logs why) the first gang starts one afresh, as before
            fork_server(f"pid {os.getpid()}, a role of the {_title}")
        from hogwild.signals import die_with_pidfd

        die_with_pidfd(self.driver, signal.SIGTERM)


def _parse_request(data: bytes, fds: list[int]) -> dict:
    """A request from the driver, checked: ``argv`` (strings), ``env`` (strings to strings),
    ``cwd`` (a string), ``cpus`` (CPU numbers), ``sigint_ignored`` (whether the role ignores
    SIGINT, as the driver does), ``workers`` (whether the role forks its workers' forkserver
    from itself; false where it is left out), and two fds (stderr, status).

    Raises:
        ValueError: Naming the field that is missing or of the wrong type.
    """
    if len(fds) != 2:
        raise ValueError(f"a role request carries 2 fds (stderr, status), not {len(fds)}")
    request = json.loads(data)
    if not isinstance(request, dict):
        raise ValueError("a role request is a JSON object")
    argv, env, cwd, cpus = (request.get(key) for key in ("argv", "env", "cwd", "cpus"))
    if not isinstance(argv, list) or not all(isinstance(arg, str) for arg in argv):
        raise ValueError("a role request's argv is a list of strings")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError("a role request's env maps strings to strings")
    if not isinstance(cwd, str):
        raise ValueError("a role request's cwd is a string")
    if not isinstance(cpus, list) or not cpus or not all(isinstance(c, int) for c in cpus):
        raise ValueError("a role request's cpus is a non-empty list of CPU numbers")
    if not isinstance(request.get("sigint_ignored"), bool):
        raise ValueError("a role request's sigint_ignored is true or false")
    if not isinstance(request.setdefault("workers", False), bool):
        raise ValueError("a role request's workers is true or false")
    return request
