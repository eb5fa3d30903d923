"""``python -m hogwild.cli ...`` or a benchmark started by a test, forked from a preloaded server.

A fresh interpreter that runs a ``hogwild`` command pays its start before any work: the imports
of numba, numpy, ZeroMQ and hogwild, and numba's initialisation of its target, about 1.5 to 2
CPU-seconds on the suite's 2-core host, for commands that often run a few seconds. The suite
starts a few hundred of them. :func:`install` replaces ``subprocess.Popen`` in the test process
with :class:`ForkedPopen`, which hands such a command to a server (:mod:`tests.fork_launch_server`,
one per pytest process, started at its first command and stopped with the session) that imported
all of it once and forks a child per command. Everything else starts as before:
``ForkedPopen`` is ``Popen`` for any other command line, and for a command that asks what a fork
cannot give exactly.

The child is the command as ``Popen`` would have started it: its stdin, stdout and stderr (pipes,
files, ``/dev/null`` or the test's own), its working directory and environment, the test's CPU
affinity, its own session where ``start_new_session`` asks, SIGINT handled as a fresh
interpreter handles it (ignored where the test ignores it), ``python -m hogwild.cli ARGV`` as its
command line (what ``ps`` and ``psutil`` show) and ``hogwild.cli`` run as ``__main__``. A
benchmark (``python bench/.../SCRIPT.py ARGS``) is run the same way, as ``__main__`` with its
directory first on ``sys.path``, and forks the ``hogwild`` commands it starts in turn, from a
command server of its own (one benchmark starts several jobs). A child's exit status reaches
``poll``, ``wait`` and ``communicate`` through a pipe from the server (the child is the
server's, not the test's), and signals go through a pidfd.

What a fork cannot give, and so is exec'd as before:

- an environment that differs from the server's in anything but :data:`LATE_VARIABLES` (the
  server imported numba, and hogwild read its settings, with its own environment);
- any other interpreter, interpreter option, module or script, and ``preexec_fn``, ``pass_fds``,
  ``user``, ``group``, ``umask``, ``process_group``, ``executable``, ``shell``;
- commands started inside :func:`exec_only` (a test that checks what a new process imports or
  compiles);
- anything, once the server failed (a command it could not fork, a reply that did not come):
  later commands are exec'd, and the commands it runs go on until the session ends.

What a forked command shares with the server, not the test: its umask, resource limits and nice
value (the test's when the server started; the suite changes none of them), Python's hash seed
(the same for every forked command), and the warnings its imports printed once, in the server.
Its CPU time is the server's child's, so ``RUSAGE_CHILDREN`` in the test does not count it; and
the server reaps it at once, so its pid is free for reuse as soon as it exits (signals go through
its pidfd). A process the test process forks (not execs) does not fork commands itself.

``HOGWILD_TEST_FORK=0`` in the suite's environment execs every command, as before. Where
``HOGWILD_TEST_FORK_LOG`` names a file, each command appends a line to it: the command's
first words and, where it was exec'd, why.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading

from tests.fork_launch_server import STATUS

FORKED_MODULES = frozenset({"hogwild.cli"})
REPOSITORY = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
BENCH = os.path.join(REPOSITORY, "bench")
LATE_VARIABLES = frozenset({
    "PYTEST_CURRENT_TEST", "HOGWILD_KEY", "HOGWILD_DATA", "COLUMNS", "LINES",
    "TMPDIR",  # the child forgets the temporary directory the server's tempfile chose
    "CRC32C_SW_MODE",  # set in the test process by google-crc32c's import
})  # fmt: skip
"""Variables that may differ from the server's: read only once a command runs."""
UNIMPORTED_PREFIXES = ("RAY_", "TORCH")
"""Ray's and PyTorch's variables (which their imports in the test process set) may differ too:
the server imports neither (it checks), so a command that does reads the child's own."""
_ALLOWED_OPTIONS = frozenset({
    "stdin", "stdout", "stderr", "cwd", "env", "text", "universal_newlines", "encoding",
    "errors", "bufsize", "start_new_session", "close_fds",
})  # fmt: skip
LOG_VARIABLE = "HOGWILD_TEST_FORK_LOG"
SWITCH_VARIABLE = "HOGWILD_TEST_FORK"
START_WITHIN_S = 120.0  # the server's imports, on a loaded host
UNCLAIMED_WAIT_S = 5.0  # for the reply to a request given up on, naming a child to kill
LOST_SERVER_WAIT_S = 5.0  # for a child's death by PR_SET_PDEATHSIG once its server ended

_OriginalPopen = subprocess.Popen
_server: _Server | None = None
_server_lock = threading.Lock()
_exec_only = False  # inside exec_only()
_failed = False  # the server failed once (or this is a forked copy): exec from then on


def install() -> None:
    """Fork ``hogwild`` commands this process starts from now on (see the module docstring),
    unless ``HOGWILD_TEST_FORK=0``."""
    if os.environ.get(SWITCH_VARIABLE) != "0":
        subprocess.Popen = ForkedPopen


@contextlib.contextmanager
def exec_only():
    """Commands this process starts inside are exec'd, as without the command server."""
    global _exec_only
    before, _exec_only = _exec_only, True
    try:
        yield
    finally:
        _exec_only = before


def server_pid() -> int | None:
    """The pid of this process's command server, if it runs (a session helper, not a leak)."""
    server = _server
    return server.process.pid if server is not None else None


def stop() -> None:
    """End this process's command server (at the session's end)."""
    global _server
    with _server_lock:
        if _server is not None:
            _server.close()
            _server = None


def _forget_in_child() -> None:
    """In a process the test process forked: the server, its socket and its lock are the
    parent's (a request from here would mix with the parent's); this one execs."""
    global _server, _server_lock, _failed
    _server, _server_lock, _failed = None, threading.Lock(), True


os.register_at_fork(after_in_child=_forget_in_child)


class ForkedPopen(_OriginalPopen):
    """``subprocess.Popen``, forking a ``hogwild`` command from the command server where it can
    (the module docstring says where)."""

    def __init__(self, args, *positional, **options) -> None:
        self._request = None if positional else _request_for(args, options)
        self._status_fd = self._pidfd = -1
        self._fd_lock = threading.Lock()  # the pidfd and status fd: used by one thread at a time
        super().__init__(args, *positional, **options)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite,
                       errread, errwrite, restore_signals, gid, gids, uid, umask,
                       start_new_session, process_group) -> None:  # fmt: skip
        if self._request is not None:
            given = (p2cread, c2pwrite, errwrite)
            stdio = [fd if fd != -1 else std for fd, std in zip(given, (0, 1, 2), strict=True)]
            forked, why = _forked(self._request, stdio)
            _log(args, why)
            if forked is not None:
                self.pid, self._pidfd, self._status_fd = forked
                self._child_created = True
                self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
                return
        self._request = None
        super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                               startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread,
                               c2pwrite, errread, errwrite, restore_signals, gid, gids, uid,
                               umask, start_new_session, process_group)  # fmt: skip

    def _try_wait(self, wait_flags):
        """``(pid, wait status)`` as ``waitpid`` would give it, from the server's status pipe
        (``(0, 0)`` while the child runs and ``WNOHANG`` asks not to wait)."""
        if self._request is None:
            return super()._try_wait(wait_flags)
        with self._fd_lock:
            if self._status_fd == -1:
                raise ChildProcessError(f"the exit status of pid {self.pid} was read already")
            if wait_flags & os.WNOHANG and not _readable(self._status_fd, 0):
                return 0, 0
            data = b""
            while len(data) < STATUS.size:
                part = os.read(self._status_fd, STATUS.size - len(data))
                if not part:
                    break
                data += part
            if len(data) == STATUS.size:
                code = STATUS.unpack(data)[0]
            else:  # the server ended first: the child dies by its PR_SET_PDEATHSIG
                _readable(self._pidfd, LOST_SERVER_WAIT_S)
                code = -signal.SIGKILL
            os.close(self._status_fd)
            os.close(self._pidfd)
            self._status_fd = self._pidfd = -1
        return self.pid, (code & 0xFF) << 8 if code >= 0 else -code

    def _internal_poll(self, _deadstate=None, **_ignored):
        if self._request is None:
            return super()._internal_poll(_deadstate)
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)
            except (OSError, ValueError):  # as Popen's: never raise here (called by __del__)
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                self._waitpid_lock.release()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self._request is None:
            super().send_signal(sig)
            return
        self.poll()
        with self._fd_lock:
            if self.returncode is None and self._pidfd != -1:
                with contextlib.suppress(ProcessLookupError):  # it exited since
                    signal.pidfd_send_signal(self._pidfd, sig)


def _readable(fd: int, timeout_s: float) -> bool:
    poller = select.poll()  # not select(): any fd number
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def _request_for(args, options: dict) -> dict | None:
    """The server's request for ``Popen(args, **options)``, or None where it must be exec'd."""
    why = _why_not(args, options)
    if why is not None:
        _log(args, why)
        return None
    env = options.get("env")
    env = dict(os.environ if env is None else env)
    return {
        "python_args": [os.fsdecode(a) for a in args[1:]], "env": env,
        "cwd": os.path.abspath(os.fsdecode(options.get("cwd") or os.getcwd())),
        "cpus": sorted(os.sched_getaffinity(0)),
        "session": bool(options.get("start_new_session", False)),
        "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
    }  # fmt: skip


def _why_not(args, options: dict) -> str | None:
    if _exec_only:
        return "inside exec_only()"
    if _failed:
        return "the command server failed, or this is a forked copy of the test process"
    if not isinstance(args, list | tuple) or len(args) < 2 or args[0] != sys.executable:
        return "not this interpreter"
    if not all(isinstance(a, str | bytes | os.PathLike) for a in args):
        return "an argument that is not a string or path"
    unusual = set(options) - _ALLOWED_OPTIONS
    if unusual or options.get("close_fds", True) is not True:
        return f"options {sorted(unusual) or ['close_fds']}"
    cwd = os.fsdecode(options.get("cwd") or ".")
    if not os.path.isdir(cwd):
        return "no such working directory"  # Popen's own error, from the exec
    if os.fsdecode(args[1]) == "-m":
        if len(args) < 3 or os.fsdecode(args[2]) not in FORKED_MODULES:
            return "not python -m hogwild.cli"
    elif not _is_benchmark(os.path.join(cwd, os.fsdecode(args[1]))):
        return "not python -m hogwild.cli nor a benchmark"
    env = options.get("env")
    different = _differences(dict(os.environ if env is None else env), _base_environment())
    if different:
        return f"environment differs in {sorted(different)[:5]}"
    return None


def _is_benchmark(path: str) -> bool:
    """Whether ``path`` is a script of the repository's ``bench/``."""
    path = os.path.realpath(path)
    return path.endswith(".py") and os.path.isfile(path) and path.startswith(BENCH + os.sep)


def _differences(env: dict, base: dict) -> set[str]:
    keys = (set(env) | set(base)) - LATE_VARIABLES
    keys = {k for k in keys if not k.startswith(UNIMPORTED_PREFIXES)}
    return {k for k in keys if env.get(k) != base.get(k)}


def _base_environment() -> dict:
    """The server's environment: the running one's, else this process's now (it starts next)."""
    server = _server
    return server.env if server is not None else dict(os.environ)


def _log(args, why: str | None) -> None:
    """A line in the fork log (where ``HOGWILD_TEST_FORK_LOG`` names one): the command's
    first words, and why it was exec'd (None: forked)."""
    path = os.environ.get(LOG_VARIABLE)
    if not path:
        return
    words = [os.fsdecode(a) if isinstance(a, str | bytes | os.PathLike) else str(a)
             for a in (args if isinstance(args, list | tuple) else [args])][:5]  # fmt: skip
    with open(path, "a") as log:
        log.write(json.dumps({"argv": words, "exec": why}) + "\n")


def _forked(request: dict, stdio: list[int]) -> tuple[tuple[int, int, int] | None, str | None]:
    """``((pid, pidfd, status fd), None)`` of the forked command, or ``(None, why)`` where it is
    to be exec'd instead: the server could not be started or used (then no later command is
    forked: the commands it runs go on), or the environment changed since it started."""
    global _server, _failed
    with _server_lock:
        if _failed:
            return None, "the command server failed"
        if _server is None:
            try:
                _server = _Server()
            except OSError as error:
                _failed = True
                print(f"tests.fork_launch: no command server ({error}); exec'ing instead",
                      file=sys.stderr)  # fmt: skip
                return None, "the command server did not start"
        changed = _differences(request["env"], _server.env)
        if changed:
            return None, f"environment differs in {sorted(changed)[:5]}"
        try:
            return _server.fork(request, stdio), None
        except BaseException as error:
            _failed = True  # its reply may still come: never ask again, stop what it forked
            _server.abandon()
            if not isinstance(error, OSError | ValueError | RuntimeError):
                raise  # an interruption of the test (Ctrl-C, a timeout's signal)
            print(f"tests.fork_launch: the command server failed ({error}{_server._said()}); "
                  "exec'ing from now on", file=sys.stderr)  # fmt: skip
            return None, f"the command server failed: {error}"


class _Server:
    """This process's end of its command server."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
        self.log = tempfile.TemporaryFile()
        try:
            self.process = _OriginalPopen(
                [sys.executable, "-m", "tests.fork_launch_server", str(os.getpid()),
                 str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=self.log, env=self.env, cwd=REPOSITORY,
            )  # fmt: skip
        except BaseException:
            ours.close()
            self.log.close()
            raise
        finally:
            theirs.close()
        self.control = ours

    def fork(self, request: dict, stdio: list[int]) -> tuple[int, int, int]:
        """``(pid, pidfd, status fd)`` of the command forked for ``request``.

        Raises:
            RuntimeError: The server refused it, ended, or did not answer in time.
        """
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        try:
            socket.send_fds(self.control, [json.dumps(request).encode()], [*stdio, status_w])
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        try:
            if not _readable(self.control.fileno(), START_WITHIN_S):
                raise RuntimeError(f"no answer within {START_WITHIN_S} s{self._said()}")
            reply, fds = self._receive()
            if "pid" not in reply or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise RuntimeError(reply.get("error", f"a reply without a pid: {reply}"))
        except BaseException:
            os.close(status_r)
            raise
        return int(reply["pid"]), fds[0], status_r

    def _receive(self) -> tuple[dict, list[int]]:
        data, fds, _, _ = socket.recv_fds(self.control, 1 << 16, 1, socket.MSG_CMSG_CLOEXEC)
        return (json.loads(data) if data else {"error": f"it ended{self._said()}"}), fds

    def abandon(self) -> None:
        """A request was given up on: kill the command its late reply names, if one comes."""
        if not _readable(self.control.fileno(), UNCLAIMED_WAIT_S):
            return
        with contextlib.suppress(OSError, ValueError):
            _, fds = self._receive()
            for fd in fds:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                os.close(fd)

    def _said(self) -> str:
        self.log.seek(0)
        tail = self.log.read()[-1500:].decode(errors="replace").strip()
        return f"; it said: {tail}" if tail else ""

    def close(self) -> None:
        self.control.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
