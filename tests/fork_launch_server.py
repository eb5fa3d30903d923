"""The tests' command server: imports what a ``hogwild`` command imports once, then forks one
child per command (a ``hogwild`` command, or a benchmark script) a test starts
(:mod:`tests.fork_launch` is the test's side and says when a command is forked rather than
exec'd, and what the child gets).

``python -m tests.fork_launch_server PARENT_PID FD``: ``FD`` is one end of a socket pair the test
process (``PARENT_PID``) keeps the other end of. The server is single-threaded, so that no lock a
child needs is held by another thread at a fork; it watches its parent through a pidfd and
exits with it, and its children die with it (``PR_SET_PDEATHSIG``). It reads requests and reaps
children in one loop over the socket and the pidfds; each child's exit status goes into the
status pipe the request carried; a request it cannot parse or fork is answered with an error,
and the others run on. It exits when the test process closes its end (the session's end) or
dies, SIGKILLing a command still running then (the test that started it has leaked it, and the
suite's leak check has said so).

A request is one JSON object (``python_args``: what follows the interpreter on the command
line, ``-m MODULE ARGS`` or ``SCRIPT ARGS``; ``env``, ``cwd``, ``cpus``, ``session``,
``sigint_ignored``) and four fds: the command's stdin, stdout and stderr, and the write end of
its status pipe. The reply is ``{"pid": N}`` with the child's pidfd, once the child has its
session, or ``{"error": ...}``.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import shlex
import signal
import socket
import struct
import sys
import tempfile
import threading

from hogwild.process_title import set_title
from hogwild.signals import die_with_parent

STATUS = struct.Struct("=i")  # a command's exit code, negative for a signal (as Popen says it)
MAX_REQUEST = 1 << 20
PRELOAD = (
    "hogwild.training.preload",  # numba and its target, numpy: what every worker imports
    "hogwild.cli_commands",
    "hogwild.training.api",
    "hogwild.cluster.driver",
    "hogwild.cluster.replica",
    "hogwild.cluster.replica_role",
    "hogwild.data.cli_data",
    "zmq",
)
"""Not ``hogwild.cli``: each child runs it as ``__main__``, and ``runpy`` warns about a module run
that way that was imported before."""
PRELOAD_GROUPS = ("hogwild.commands", "hogwild.parameter_stores", "hogwild.server_groups")


def serve(parent_pid: int, control_fd: int) -> list[str]:
    """The server's loop. Returns only in a forked child, once it has become the command: the
    interpreter's arguments to run (:func:`run`)."""
    if os.getppid() != parent_pid:
        sys.exit(0)  # the test process is gone already
    parent = os.pidfd_open(parent_pid)  # watched, not PR_SET_PDEATHSIG: that follows a thread
    if os.getppid() != parent_pid:  # the pidfd may name a process started since
        sys.exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the session stops this, not a Ctrl-C
    # setproctitle finds the room for a title at its first call: here, while the environment
    # is still where the interpreter started it (a child clears and refills it)
    set_title(f"hogwild tests' command server for pid {parent_pid}")
    for module in PRELOAD:
        importlib.import_module(module)
    from hogwild.entry_points import load, names

    for group in PRELOAD_GROUPS:
        for name in names(group):
            with contextlib.suppress(Exception, SystemExit):  # the command says what is missing
                load(group, name)
    # Python's threads: a native one (OpenBLAS's pool, started by numpy's import) holds no lock a
    # child needs, and the library restarts its pool in a child at fork
    if threading.active_count() != 1:
        print(f"a preloaded module started a thread: {threading.enumerate()}", file=sys.stderr)
        sys.exit(1)
    if {"ray", "torch"} & set(sys.modules):  # their variables may differ (fork_launch)
        print("a preloaded module imported Ray or PyTorch", file=sys.stderr)
        sys.exit(1)
    gc.freeze()
    control = socket.socket(fileno=control_fd)
    children: dict[int, tuple[int, int]] = {}  # pidfd: (pid, status fd)
    while True:
        ready, _, _ = select.select([control, parent, *children], [], [])
        for pidfd in [fd for fd in ready if fd in children]:
            _reap(pidfd, *children.pop(pidfd))
        if parent in ready:  # the test process died: its commands go with it
            _end(children)
        if control not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(control, MAX_REQUEST, 4)
        except OSError:
            data, fds = b"", []
        if not data:  # the session is over: what still runs was leaked
            _end(children)
        try:
            request = _parse(data, fds)
            pid, pidfd = _fork(request, fds, (control, parent), children)
        except (OSError, ValueError) as error:  # this command is refused, not the others
            for fd in fds:
                os.close(fd)
            _reply(control, {"error": str(error)}, [])
            continue
        if pid == 0:
            return request["python_args"]
        for fd in fds[:3]:  # the child's now
            os.close(fd)
        children[pidfd] = (pid, fds[3])
        if not _reply(control, {"pid": pid}, [pidfd]):  # nobody left to stop it
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def _reap(pidfd: int, pid: int, status: int) -> None:
    _, wait_status = os.waitpid(pid, 0)
    with contextlib.suppress(OSError):  # the test may have closed its end
        os.write(status, STATUS.pack(os.waitstatus_to_exitcode(wait_status)))
    os.close(status)
    os.close(pidfd)


def _end(children: dict) -> None:
    """Exit, SIGKILLing every command still running."""
    for pidfd in children:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    sys.exit(0)


def _reply(control: socket.socket, reply: dict, fds: list[int]) -> bool:
    try:
        socket.send_fds(control, [json.dumps(reply).encode()], fds)
    except OSError:
        return False
    return True


def _parse(data: bytes, fds: list[int]) -> dict:
    """A request, checked (the module docstring says its fields).

    Raises:
        ValueError: Naming what is missing or of the wrong type.
    """
    if len(fds) != 4:
        raise ValueError(f"a request carries 4 fds (stdin, stdout, stderr, status), not {len(fds)}")
    request = json.loads(data)
    words = request.get("python_args") if isinstance(request, dict) else None
    if not isinstance(words, list) or not words or not all(isinstance(w, str) for w in words):
        raise ValueError("a request's python_args is a non-empty list of strings")
    env = request.get("env")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError("a request's env maps strings to strings")
    if not isinstance(request.get("cwd"), str):
        raise ValueError("a request's cwd is a string")
    cpus = request.get("cpus")
    if not isinstance(cpus, list) or not cpus or not all(isinstance(c, int) for c in cpus):
        raise ValueError("a request's cpus is a non-empty list of CPU numbers")
    if not all(isinstance(request.get(k), bool) for k in ("session", "sigint_ignored")):
        raise ValueError("a request's session and sigint_ignored are true or false")
    return request


def _fork(request: dict, fds: list[int], own: tuple, children) -> tuple[int, int]:
    """Fork the command: ``(0, -1)`` in the child once it is the command, ``(pid, pidfd)`` here
    once the child leads its own session (where asked), so the test's ``killpg`` reaches it.

    Raises:
        OSError: No pipe, process or pidfd; no child is left running.
    """
    started_r, started_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError:
        os.close(started_r)
        os.close(started_w)
        raise
    if pid == 0:
        try:
            os.close(started_r)
            _become(request, fds, own, children, started_w)
        except BaseException:  # never back into the server's loop
            import traceback

            traceback.print_exc()
            os._exit(1)
        return 0, -1
    os.close(started_w)
    try:
        pidfd = os.pidfd_open(pid)  # before any wait: the pid is still the child's
    except OSError:
        os.close(started_r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    try:
        os.read(started_r, 1)  # a byte once it is set up; nothing if it died first
    finally:
        os.close(started_r)
    return pid, pidfd


def _become(request: dict, fds: list[int], own: tuple, children, started: int) -> None:
    """In the child: what ``Popen`` and a fresh interpreter would have given the command (the
    server's own socket and parent's pidfd, ``own``, closed)."""
    die_with_parent(signal.SIGKILL)  # the server ends only at the session's end
    control, parent = own
    os.close(control.detach())  # detached: the socket object must not close a reused number
    os.close(parent)
    for pidfd, (_, status) in children.items():
        os.close(pidfd)
        os.close(status)
    children.clear()
    os.close(fds[3])
    if request["session"]:
        os.setsid()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in set(fds[:3]) - {0, 1, 2}:
        os.close(fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN if request["sigint_ignored"] else
                  signal.default_int_handler)  # fmt: skip
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # chosen again from the command's TMPDIR
    os.sched_setaffinity(0, request["cpus"])
    set_title(shlex.join([sys.executable, *request["python_args"]]))
    sys.modules["numpy"].random.seed()  # drawn afresh, as a fresh interpreter's is
    if "multiprocessing.process" in sys.modules:
        process = sys.modules["multiprocessing.process"]
        process.current_process().authkey = os.urandom(32)
        process.ORIGINAL_DIR = request["cwd"]
    os.write(started, b"s")
    os.close(started)


def run(python_args: list[str]) -> None:
    """Run ``python PYTHON_ARGS`` in this process, as the interpreter would: ``-m MODULE`` with
    the working directory first on ``sys.path``, a script with its own directory first. A script
    (a benchmark) forks the ``hogwild`` commands it starts from a command server of its own."""
    import runpy

    if python_args[0] == "-m":
        sys.path[0] = os.getcwd()
        sys.argv[:] = ["-m", *python_args[2:]]
        runpy.run_module(python_args[1], run_name="__main__", alter_sys=True)
        return
    script = os.path.abspath(python_args[0])
    sys.path[0] = os.path.dirname(script)
    sys.argv[:] = python_args
    import atexit

    from tests import fork_launch

    fork_launch.install()
    atexit.register(fork_launch.stop)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    run(serve(int(sys.argv[1]), int(sys.argv[2])))  # serve returns only in a forked child
