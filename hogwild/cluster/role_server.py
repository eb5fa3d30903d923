"""Cluster roles forked from a preloaded server, instead of each started as a fresh interpreter.

A role started as ``python -c SHIM ... hogwild ROLE`` (:data:`hogwild.cluster.roles.SHIM`)
pays the whole start of an interpreter that imports numba, numpy, ZeroMQ and hogwild before it
serves anything. The local launcher instead starts one role server per job, the first time it
has a role to start: a process that imports that once (:data:`PRELOAD`, and every entry point
of the plugin groups roles run) and then forks one child per role. The child becomes the role
exactly as the shim would have made it, then runs ``hogwild ROLE`` through the same
``runpy`` call:

- its own session (``setsid``), so a Ctrl-C in the terminal reaches only the driver and the
  launcher kills the role's process group;
- stdin and stdout on ``/dev/null``, stderr on a pipe the driver reads line by line;
- the environment the launcher gives it (applied in the child: a forked child otherwise keeps
  the server's), its working directory, the driver's CPU affinity at the request;
- its death with the driver: its parent is the server, so the kernel's parent-death signal
  cannot follow the driver. The child watches the driver through a pidfd the server opened
  while the driver was still its parent (so it names the driver, never a reused pid), and exits
  at once with 143 if the driver is gone already, as the shim does. The server's own death
  SIGKILLs its children (``PR_SET_PDEATHSIG``; the server has a single thread, so that signal
  follows the server and not one of its threads). A SIGTERM of the server is passed on to
  every child (a parameter server's final flush, a replica's orderly stop), waited for at most
  :data:`ROLES_STOP_WAIT_S`, and then the server exits; a SIGKILL of it (the OOM killer's)
  leaves its children no such time: they die with -9 (:data:`SERVER_LOST`), unflushed;
- its exit status: the server reaps the child and writes ``os.waitstatus_to_exitcode`` of it
  (negative for a signal, as :class:`subprocess.Popen` reports) into a pipe the driver gave it;
  :class:`ForkedRole` is the driver's ``Popen``-like handle on it (``poll``, ``wait``,
  ``send_signal`` through a pidfd, so no signal reaches a reused pid);
- its command line: a forked child's ``/proc/PID/cmdline`` would be the server's, so the child
  takes ``python -m hogwild.cli ROLE ARGV`` as its process title (``setproctitle``): ``ps``, and
  whatever finds a role by its command line (a run directory, a role's kind), still finds it.
  ``/proc/PID/environ`` shows the server's environment, not the role's (the one given is
  applied with ``putenv``), unless ``setproctitle`` moved it to make room for the title.
- its workers' forkserver, for a role that starts workers (a replica): forked by the child
  from itself while it is still the server's single thread, before the watch on the driver
  starts, instead of started later as a fresh interpreter that imports again what the server
  had imported (:func:`hogwild.training.zygote.fork_server`; where it cannot, the role's first
  gang starts one the usual way);
- its session at the reply: the server answers the driver only once the child called
  ``setsid`` (a byte on a pipe), so the launcher's ``killpg`` reaches it from the start.

What a child inherits from the server and is not reset: the state of every preloaded module,
Python's hash seed, resource limits and the umask at the server's start (the driver changes
none of them). numpy's global random state and multiprocessing's authentication key are drawn
afresh in each child, as a fresh interpreter would.

A forked child takes what was imported with the server's environment, so the server is used only
for roles whose environment is the server's but for :data:`LATE_VARIABLES`, which hogwild
reads only once a role runs. Any other difference, a kernel without pidfds, a server that did
not start or has ended, and ``cluster.start_method = "spawn"`` start the role through the shim
instead; each reason is told once per :class:`RoleServer`, on stderr and in the log, with the
server's last words on its stderr where it failed or ended. A fork the server cannot make (no
process or fd left) is answered as an error and that role alone is spawned; an exchange that
fails on the driver's side (a timeout, no fd left, an interruption) ends the server's use, but
not the server: its roles run on until the launcher stops them. The server talks to the driver
over a socket pair inherited at its start (no path, so no limit on ``TMPDIR``'s length), ends
when the driver closes its end (:meth:`RoleServer.close`, after the roles are stopped) or dies,
once its last child has ended; a request still queued then is not forked. A server whose driver
died first removes the driver's shared-memory segments (its parameter store's arena) as it
ends: the driver, SIGKILLed, could not, and no other process of the job is left to. Its own
stderr goes to a log file, never to the driver's stderr, which it would hold open after the
driver died.
The driver reads a role's stderr as UTF-8, undecodable bytes replaced.

This module is the driver's side (:class:`RoleServer`, :class:`ForkedRole`) and what both sides
share; the server's own process is :mod:`hogwild.cluster.role_server_process`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

from hogwild.net.auth import IDENTITY_ENV

PRELOAD = (
    "hogwild.training.preload",  # numba and its target, numpy, what a worker imports
    "hogwild.cluster.replica",
    "hogwild.cluster.replica_role",
    "hogwild.data.cli_data",
    "zmq",
)
"""Modules the server imports before it forks any role: what parameter servers and replicas
need. The entry points of :data:`PRELOAD_GROUPS` are loaded after them. Not ``hogwild.cli``
itself: each role runs it as ``__main__``, as the shim does, and ``runpy`` warns about a module
run that way that was imported before."""
PRELOAD_GROUPS = (
    "hogwild.commands",
    "hogwild.parameter_stores",
    "hogwild.controllers",
    "hogwild.server_groups",
    "hogwild.worker_groups",
)
LATE_VARIABLES = frozenset({IDENTITY_ENV, "PYTEST_CURRENT_TEST"})
"""Variables that may differ between a role and its server: read only once the role runs."""

SERVER = (
    "import sys\n"
    "from hogwild.cluster.role_server_process import serve\n"
    "argv = serve(int(sys.argv[1]), int(sys.argv[2]))  # returns only in a forked role\n"
    "sys.argv[:] = ['-c', *argv]\n"
    "import runpy\n"
    "runpy.run_module('hogwild.cli', run_name='__main__', alter_sys=True)\n"
)
"""``python -c SERVER DRIVER_PID FD``: the server, and (once :func:`serve` returns in a child)
the role, run as the shim runs it."""

STATUS = struct.Struct("=i")  # an exit code, as the server writes it into a role's status pipe
MAX_REQUEST = 1 << 20  # bytes: a role's command line and environment
EXIT_DRIVER_GONE = 143  # the shim's code for a driver that died before the role started
PR_SET_PDEATHSIG = 1
SERVER_LOST = -signal.SIGKILL
"""A role's exit code when its server ended first (which SIGKILLs it) and could not say."""
BYE = b"bye"  # the driver's last message: it closes the server's use itself, alive
DRIVER_EXIT_WAIT_S = 2.0  # for a dead driver's pidfd, after its socket closed without a bye
UNCLAIMED_WAIT_S = 1.0  # for a reply to a request given up on, naming a role to end
SERVER_LOST_WAIT_S = 5.0  # for the kernel's SIGKILL of a role whose server ended, before ours

ROLES_STOP_WAIT_S = 20.0
"""How long a SIGTERMed server waits for the roles it passed the SIGTERM on to (the local
launcher's default ``cluster.stop_timeout_s``) before it exits, which SIGKILLs those left."""
SAID_LINES = 5  # of the server's stderr, quoted where it failed

logger = logging.getLogger(__name__)


def role_title(argv) -> str:
    """The process title of a forked role: the command line that would run it."""
    return shlex.join([sys.executable, "-m", "hogwild.cli", *argv])


class ForkedRole:
    """The driver's handle on a role the server forked: what the launcher uses of
    :class:`subprocess.Popen` (``pid``, ``stderr``, ``returncode``, ``poll``, ``wait``,
    ``send_signal``). It owns the role's stderr, status pipe and pidfd; the last two are closed
    once the exit code is known."""

    def __init__(self, pid: int, pidfd: int, status: int, stderr: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.server_lost = False  # it ended because its server did (its code then SERVER_LOST)
        self.stderr = open(stderr, encoding="utf-8", errors="replace")  # noqa: SIM115 - owned
        self._pidfd = pidfd
        self._status = status
        self._reading = threading.Lock()  # one reader of the status pipe at a time
        self._fds = threading.Lock()  # the pidfd is never used while it is closed

    def poll(self) -> int | None:
        """The exit code if the role has exited (and the server said so), else None; None too
        while another thread waits for it (as ``Popen.poll``)."""
        if self.returncode is not None or not self._reading.acquire(blocking=False):
            return self.returncode
        try:
            return self._read_status(0.0)
        finally:
            self._reading.release()

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, waiting at most ``timeout`` seconds (forever with None).

        Raises:
            subprocess.TimeoutExpired: Still running after ``timeout``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._reading.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                code = self._read_status(left)
            finally:
                self._reading.release()
        else:
            code = self.returncode
        if code is None:
            raise subprocess.TimeoutExpired(f"role {self.pid}", timeout)
        return code

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the role if it has not exited (through its pidfd: never to a pid
        reused since)."""
        with self._fds:
            if self.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, signum)

    def _read_status(self, timeout: float | None) -> int | None:
        """(Holding ``_reading``.) The exit code once the server wrote it within ``timeout``."""
        if self.returncode is not None:
            return self.returncode
        if not readable([self._status], timeout):
            return None
        data = os.read(self._status, STATUS.size)
        if len(data) == STATUS.size:
            code = STATUS.unpack(data)[0]
        else:  # the server ended first, which SIGKILLs its children: make sure of this one
            if not readable([self._pidfd], SERVER_LOST_WAIT_S):
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                readable([self._pidfd], None)  # a SIGKILL is not refused: it ends
            code = SERVER_LOST
            self.server_lost = True
        with self._fds:
            self.returncode = code
            os.close(self._status)
            os.close(self._pidfd)
        return code

    def __del__(self) -> None:  # a handle dropped before its role was waited for
        if getattr(self, "returncode", 0) is None:
            for fd in (self._status, self._pidfd):
                with contextlib.suppress(OSError):
                    os.close(fd)


class RoleServer:
    """The driver's end of one role server: started at the first :meth:`start_role`, ended by
    :meth:`close`. Thread-safe."""

    def __init__(
        self,
        title: str,
        start_timeout_s: float,
        log: str | os.PathLike | None,
        roles: str = "cluster roles",
    ) -> None:
        """``title``: the server's process title (name the job's run directory in it, so that
        whatever looks for the job's processes finds it); ``start_timeout_s``: how long the
        first role waits for the server to import what it preloads; ``log``: the file the
        server's own stderr is appended to (never the driver's stderr, which the server would
        hold open after the driver died for as long as a role runs), or None for an unnamed
        temporary file (gone with the last process holding it); what the server said there
        since its start is quoted where it failed. ``roles``: what it forks, as the reason a
        role is spawned instead names it (told once per :class:`RoleServer`)."""
        self.title = title
        self.start_timeout_s = start_timeout_s
        self.log = log
        self.roles = roles
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._environment: dict[str, str] = {}
        self._broken: str | None = None
        self._said: set[str] = set()  # the reasons told already
        self._log_file = None  # the unnamed log (log=None), kept to read back
        self._log_start = 0  # the log's size at the server's start

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs, else None: not yet started, ended (reaped, so the
        pid may name another process since), or closed."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def say_once(self, reason: str) -> None:
        """Tell, once per reason, why a role starts through the shim rather than the server."""
        if reason not in self._said:
            self._said.add(reason)
            message = f"hogwild: {self.roles} start as fresh interpreters, not forked: {reason}"
            logger.warning(message)
            print(message, file=sys.stderr, flush=True)

    def start_role(
        self, argv, env: dict | None = None, cwd: str | None = None, workers: bool = False
    ):
        """Fork ``hogwild ARGV`` from the server: a :class:`ForkedRole`, or None where the
        server cannot be used for it (the reason told once: start it through the shim).
        ``workers``: the role starts workers from a forkserver, which it then forks from
        itself as it begins (:func:`hogwild.training.zygote.fork_server`)."""
        env = dict(os.environ if env is None else env)
        with self._lock:
            try:
                reason = self._usable(env)
                if reason is None:
                    return self._request(argv, env, cwd or os.getcwd(), workers)
            except RoleRefusedError as error:  # the server is fine: only this role falls back
                self.say_once(f"the role server could not fork a role ({error})")
                return None
            except BaseException as error:
                # The exchange may be half done (a reply left unread would be paired with the
                # next request): no more requests. The server and the roles it forked are left
                # running; close() waits for the server once the launcher has stopped them.
                self._broken = f"the role server failed ({error!r}){self._last_words()}"
                if self._control is not None:
                    self._stop_unclaimed()
                    self._control.close()
                    self._control = None
                if not isinstance(error, Exception):  # Ctrl-C, SIGTERM: the caller's to handle
                    raise
                self.say_once(self._broken)
                return None
            self.say_once(reason)
            return None

    def _stop_unclaimed(self) -> None:
        """A request given up on (Ctrl-C, a timeout) after the server forked its role: the reply
        naming it may be on its way. Read for it a moment and end that role (SIGTERM: it has
        hardly begun), so nothing runs that the launcher does not know of."""
        with contextlib.suppress(OSError, ValueError):
            self._control.settimeout(UNCLAIMED_WAIT_S)
            _, fds, _, _ = socket.recv_fds(self._control, 4096, 1)
            for fd in fds:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGTERM)
                os.close(fd)

    def _usable(self, env: dict) -> str | None:
        from hogwild.training.zygote import pidfd_supported

        if self._broken is not None:
            return self._broken
        if not pidfd_supported():
            return "this kernel has no pidfd, by which a forked role watches its driver"
        if self._process is not None and self._process.poll() is not None:
            code = self._process.returncode
            self._broken = f"the role server ended (exit code {code}){self._last_words()}"
            return self._broken
        # The server takes the driver's environment at its start: compared before it is
        # started, so that a first role it could not serve starts no server.
        server_env = self._environment if self._process is not None else dict(os.environ)
        differs = sorted(
            name
            for name in (set(env) | set(server_env)) - LATE_VARIABLES
            if env.get(name) != server_env.get(name)
        )
        if differs:
            return f"the role's environment differs from the role server's in {', '.join(differs)}"
        if self._process is None:
            self._start()
        return None

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._environment = dict(os.environ)
            if self.log is None:
                if self._log_file is None:
                    self._log_file = tempfile.TemporaryFile()  # noqa: SIM115 - kept to read
                log = contextlib.nullcontext(self._log_file)
            else:
                log = open(self.log, "ab")  # noqa: SIM115 - closed once the server has it
            with log as file:
                self._log_start = os.fstat(file.fileno()).st_size
                self._process = subprocess.Popen(
                    [sys.executable, "-c", SERVER, str(os.getpid()), str(theirs.fileno()),
                     self.title],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=file,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,  # a Ctrl-C in the terminal is the driver's alone
                )  # fmt: skip
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(self.start_timeout_s)
        self._control = ours

    def _last_words(self) -> str:
        """``": it said: LINES"``, the server's last lines in its log since its start (why it
        failed: a preload that started a thread, a traceback), or "" if it said nothing."""
        try:
            if self._log_file is not None:
                fd = os.dup(self._log_file.fileno())
            else:
                fd = os.open(self.log, os.O_RDONLY | os.O_CLOEXEC)
            try:
                size = os.fstat(fd).st_size
                start = max(self._log_start, size - 4096)
                data = os.pread(fd, max(0, size - start), start)  # pread: no shared offset moves
            finally:
                os.close(fd)
        except (OSError, TypeError):
            return ""
        lines = [line for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
        return f": it said: {' | '.join(lines[-SAID_LINES:])}" if lines else ""

    def _request(self, argv, env: dict, cwd: str, workers: bool) -> ForkedRole:
        request = {
            "argv": [str(arg) for arg in argv],
            "env": env,
            "cwd": cwd,
            "workers": workers,
            "cpus": sorted(os.sched_getaffinity(0)),
            # A driver run with SIGINT ignored (nohup, a shell's background job) passes that
            # on to its roles, as a spawned role inherits it.
            "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
        }
        stderr_r, stderr_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            socket.send_fds(self._control, [json.dumps(request).encode()], [stderr_w, status_w])
        except BaseException:
            for fd in (stderr_r, status_r):
                os.close(fd)
            raise
        finally:
            os.close(stderr_w)
            os.close(status_w)
        try:
            data, fds, _, _ = socket.recv_fds(self._control, 4096, 1)
            pid, pidfd = _parse_reply(data, fds)
        except BaseException:
            for fd in (stderr_r, status_r):
                os.close(fd)
            raise
        return ForkedRole(pid, pidfd, status_r, stderr_r)

    def close(self, timeout_s: float = 5.0) -> None:
        """End the server (call it once the roles are stopped): it leaves once its last child
        has ended; after ``timeout_s`` it is killed, which SIGKILLs any role still running.
        A role started after this is started through the shim (no server is left behind)."""
        with self._lock:
            self._end(timeout_s)
            self._broken = "the role server was closed"

    def _end(self, timeout_s: float) -> None:
        if self._control is not None:
            with contextlib.suppress(OSError):  # the server ended already: nothing to tell
                self._control.send(BYE)
            self._control.close()
            self._control = None
        if self._process is not None:
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


class RoleRefusedError(Exception):
    """The server answered a request with an error (it could not fork the role), and serves on."""


def _parse_reply(data: bytes, fds: list[int]) -> tuple[int, int]:
    """The role's pid and pidfd from the server's reply (checked: one fd, a positive pid).

    Raises:
        RoleRefusedError: The server said why it started no role (and no fd came with it).
        ValueError: Anything else than a pid and one fd, or an error reply.
    """
    try:
        reply = json.loads(data) if data else {}
    except ValueError:
        reply = {}
    pid = reply.get("pid") if isinstance(reply, dict) else None
    if not isinstance(pid, int) or pid <= 0 or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        said = reply.get("error") if isinstance(reply, dict) else None
        if isinstance(said, str) and not fds and set(reply) == {"error"}:
            raise RoleRefusedError(said[:500])
        raise ValueError(f"no role started: the server sent {data[:200]!r}")
    return pid, fds[0]


def readable(fds: list[int], timeout: float | None) -> list[int]:
    """Those of ``fds`` readable (or hung up) within ``timeout`` seconds (None: no bound)."""
    return list(polled(fds, timeout))


def polled(fds: list[int], timeout: float | None) -> dict[int, int]:
    """The poll events of those of ``fds`` readable or hung up within ``timeout`` seconds
    (None: no bound); ``poll``, not ``select``, which refuses fds past 1023."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    wait_ms = None if timeout is None else max(0, int(timeout * 1000))
    return dict(poller.poll(wait_ms))
