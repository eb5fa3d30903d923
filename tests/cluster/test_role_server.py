"""Roles forked from a role server are what the launcher's shim made of them, real roles each.

One server (:class:`hogwild.cluster.role_server.RoleServer`) forks real data servers
(``hogwild data serve``): a forked role is the leader of its own session, has ``/dev/null`` on
stdin and stdout and the driver's pipe on stderr, runs in the directory it was given, is titled
with its own command line (its process name left as Python's), and ends with the exit codes a
spawned role has: 143 after SIGTERM, 2 after an error it names, -9 when SIGKILLed, or when its
server is (a role never outlives its server, and the next role is started as a fresh one). An
environment variable given to one role reaches that role and no other (each names its own key
file in its error); a role whose environment differs from the server's in a variable read
before a role runs is not forked, and the launcher is told why once. A fork the server cannot
make is that role's alone, a failed exchange leaves the running roles to the launcher, and a
request a departed driver left queued is never forked. A SIGTERM of the server is passed on to
its roles, which exit 143, not SIGKILLed, and the reason the next role is spawned quotes the
server's stderr. The job-level guarantees
(a SIGKILLed driver takes its forked roles down; roles found by their command line) are in
``tests/cluster/test_cluster.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import psutil
import pytest

from hogwild.cluster.role_server import SERVER, SERVER_LOST_WAIT_S, ForkedRole, RoleServer
from hogwild.cluster.roles import tee_stderr
from hogwild.net.auth import IDENTITY_ENV, ROSTER

pytestmark = pytest.mark.slow

STARTED_WITHIN_S = 240.0  # the server's first import of numba on a loaded 2-core machine
ENDS_WITHIN_S = 30.0  # a SIGKILLed process, or the role server once its last role has ended


def role_server(tmp_path: Path) -> RoleServer:
    return RoleServer(
        f"hogwild role server of {tmp_path}", STARTED_WITHIN_S, tmp_path / "role-server.log"
    )


def server_of(role: ForkedRole) -> psutil.Process:
    return psutil.Process(role.pid).parent()


@contextlib.contextmanager
def no_fork_in(pid: int):
    """No process ``pid`` forks succeeds meanwhile, by a real limit of the kernel's: its user's
    process limit (``RLIMIT_NPROC``, which root is exempt from), or, for root, a pids cgroup
    of its own with room for no further process."""
    if os.geteuid() != 0:
        process = psutil.Process(pid)
        before = process.rlimit(psutil.RLIMIT_NPROC)
        process.rlimit(psutil.RLIMIT_NPROC, (0, before[1]))
        try:
            yield
        finally:
            process.rlimit(psutil.RLIMIT_NPROC, before)
        return
    v1, v2 = Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")
    if (v1 / "cgroup.procs").exists():
        root, was = (
            v1,
            v1
            / next(
                line.split(":", 2)[2].lstrip("/")
                for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if line.split(":", 2)[1] == "pids"
            ),
        )
    elif "pids" in (v2 / "cgroup.controllers").read_text().split():
        root = v2
        was = v2 / Path(f"/proc/{pid}/cgroup").read_text().strip().split("::", 1)[1].lstrip("/")
    else:
        pytest.skip("root, and no pids cgroup to limit a process's forks with")
    group = root / f"hogwild-test-{os.getpid()}-{pid}"
    group.mkdir()
    try:
        (group / "pids.max").write_text("1")  # the server alone
        (group / "cgroup.procs").write_text(str(pid))
        try:
            yield
        finally:
            (was / "cgroup.procs").write_text(str(pid))
    finally:
        group.rmdir()


def data_serve(source: Path | str) -> list[str]:
    return ["data", "serve", str(source), "--bind", "127.0.0.1", "--port", "0"]


class Started:
    """A role forked by ``server``, its stderr read into ``lines``."""

    def __init__(self, server: RoleServer, argv: list[str], **kw) -> None:
        self.role = server.start_role(argv, **kw)
        assert isinstance(self.role, ForkedRole), "the role was not forked"
        self.lines: deque[str] = deque(maxlen=50)
        self.ready = threading.Event()
        self.reader = tee_stderr(self.role, os.devnull, self.lines, lambda _: self.ready.set())

    def ended(self) -> tuple[int, str]:
        """Its exit code and everything it said."""
        code = self.role.wait(STARTED_WITHIN_S)
        self.reader.join(10)  # its last lines are read after the exit
        return code, "\n".join(self.lines)


def test_a_forked_role_is_started_and_ends_as_a_spawned_one(mnist_dir, tmp_path):
    server = role_server(tmp_path)
    try:
        serving = Started(server, data_serve(mnist_dir), cwd=str(tmp_path))
        role = serving.role
        # Its own session as soon as the launcher hears of it: killpg reaches it at once.
        assert os.getsid(role.pid) == os.getpgid(role.pid) == role.pid
        assert serving.ready.wait(STARTED_WITHIN_S), list(serving.lines)
        proc = psutil.Process(role.pid)
        assert f"hogwild role server of {tmp_path}" in " ".join(proc.parent().cmdline())
        # The server's stderr is its log, not the driver's: a reader of the driver's stderr
        # sees its end when the driver dies, however long the roles run on.
        server_stderr = os.readlink(f"/proc/{proc.parent().pid}/fd/2")
        assert server_stderr == str(tmp_path / "role-server.log")
        title = " ".join(proc.cmdline())
        assert title.startswith(f"{sys.executable} -m hogwild.cli data serve {mnist_dir} ")
        assert proc.name() == Path(sys.executable).name[:15]  # comm: as exec gave it
        assert os.readlink(f"/proc/{role.pid}/fd/0") == os.devnull
        assert os.readlink(f"/proc/{role.pid}/fd/1") == os.devnull
        assert os.readlink(f"/proc/{role.pid}/fd/2").startswith("pipe:")
        assert proc.cwd() == str(tmp_path)
        assert role.poll() is None
        role.send_signal(signal.SIGTERM)
        code, said = serving.ended()
        assert code == 143, said  # the CLI's SIGTERM path, as a spawned role's
        role.send_signal(signal.SIGTERM)  # once it has exited: nothing is sent anywhere

        code, said = Started(server, data_serve(tmp_path / "missing")).ended()
        assert code == 2 and f"{tmp_path / 'missing'}: no such directory" in said, said

        killed = Started(server, data_serve(mnist_dir))
        killed.role.send_signal(signal.SIGKILL)
        assert killed.ended()[0] == -signal.SIGKILL

        orphaned = Started(server, data_serve(mnist_dir))  # its server killed: so is the role
        assert orphaned.ready.wait(STARTED_WITHIN_S), list(orphaned.lines)
        orphan = psutil.Process(orphaned.role.pid)
        orphan.parent().kill()
        # gone by the kernel's parent-death signal, before the driver's own kill would come
        _, alive = psutil.wait_procs([orphan], timeout=SERVER_LOST_WAIT_S - 1.0)
        assert alive == []
        assert orphaned.ended()[0] == -signal.SIGKILL
        assert orphaned.role.server_lost
        assert server.start_role(data_serve(mnist_dir)) is None  # the launcher spawns it
    finally:
        server.close()


def _children_titled(title: str) -> list[psutil.Process]:
    """This process's live children whose command line holds ``title`` (a zombie another test
    left unreaped has no command line to read)."""
    found = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if title in " ".join(child.cmdline()):
                found.append(child)
    return found


def test_an_environment_given_to_one_role_reaches_it_and_no_other(mnist_dir, tmp_path, capfd):
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / ROSTER).write_text('{"roles": {}}')  # each role must then bring its own key pair
    argv = [*data_serve(mnist_dir), "--keys", str(keys)]
    server = role_server(tmp_path)
    try:
        capfd.readouterr()
        numba_differs = {**os.environ, "NUMBA_OPT": "1"}  # read when numba is imported
        assert server.start_role(argv, env=numba_differs) is None
        title = f"hogwild role server of {tmp_path}"  # none started for a role it cannot serve
        assert not _children_titled(title)
        assert server.start_role(argv, env=numba_differs) is None
        err = capfd.readouterr().err
        assert err.count("not forked") == 1 and "differs from the role server's in NUMBA_OPT" in err

        said = {}
        for name in ("a", "b"):
            env = {**os.environ, IDENTITY_ENV: str(keys / f"{name}.key_secret")}
            code, said[name] = Started(server, argv, env=env).ended()
            assert code == 2, said[name]
        assert "a.key_secret: missing" in said["a"] and "b.key_secret" not in said["a"]
        assert "b.key_secret: missing" in said["b"] and "a.key_secret" not in said["b"]
        code, none = Started(server, argv).ended()  # the driver's own environment: no key
        assert code == 2 and f"set {IDENTITY_ENV} to its .key_secret file" in none, none
        assert server.start_role(argv, env=numba_differs) is None  # nor once it serves

        # A SIGTERMed server (a stray kill) does not SIGKILL its roles: each gets the SIGTERM
        # (a parameter server's flush) and exits 143; then the server leaves, its pid no longer
        # named, and the next role is spawned, the reason quoting what the server said.
        running = Started(server, data_serve(mnist_dir))
        assert running.ready.wait(STARTED_WITHIN_S), list(running.lines)
        pid = server.pid
        assert pid == server_of(running.role).pid
        capfd.readouterr()
        os.kill(pid, signal.SIGTERM)
        code, said = running.ended()
        assert code == 143 and not running.role.server_lost, said
        deadline = time.monotonic() + ENDS_WITHIN_S
        while server.pid is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.pid is None  # ended and reaped: no pid that may be reused is named
        assert server.start_role(data_serve(mnist_dir)) is None  # the launcher spawns it
        err = capfd.readouterr().err
        assert err.count("cluster roles start as fresh interpreters") == 1, err
        assert "the role server ended (exit code 0): it said: " in err, err
        assert "SIGTERM: passed on to its 1 roles" in err, err
    finally:
        server.close()


def test_a_role_the_server_cannot_fork_is_spawned_and_the_running_roles_run_on(mnist_dir, tmp_path):
    """A refused fork is that role's alone; a failed exchange ends the server's use, not the
    roles it forked: each is stopped by the launcher and the server then leaves by itself."""
    server = role_server(tmp_path)
    try:
        running = Started(server, data_serve(mnist_dir))
        assert running.ready.wait(STARTED_WITHIN_S), list(running.lines)
        process = server_of(running.role)
        with no_fork_in(process.pid):
            assert server.start_role(data_serve(mnist_dir)) is None  # the launcher spawns it
        assert process.is_running() and running.role.poll() is None
        again = Started(server, data_serve(mnist_dir))  # the server serves on
        assert again.ready.wait(STARTED_WITHIN_S), list(again.lines)

        lowest_free = os.dup(0)  # where the driver runs out of fds: its next pipe fails
        os.close(lowest_free)
        limits = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, limits[1]))
        try:
            assert server.start_role(data_serve(mnist_dir)) is None
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        assert server.start_role(data_serve(mnist_dir)) is None  # the server is no longer used
        for started in (running, again):
            assert started.role.poll() is None
            started.role.send_signal(signal.SIGTERM)
            code, said = started.ended()
            assert code == 143, said  # stopped as the launcher stops it: never SIGKILLed
        assert process.wait(ENDS_WITHIN_S) == 0  # it left by itself once its last role ended
    finally:
        server.close()


def test_a_request_left_queued_by_a_driver_that_hung_up_is_not_forked(mnist_dir, tmp_path):
    """A driver interrupted while the server still preloads leaves its request queued on the
    socket (a SOCK_SEQPACKET keeps it readable after the hang-up): nobody would read the reply
    or stop the role, so the server forks nothing and leaves."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with open(tmp_path / "role-server.log", "ab") as log:
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(os.getpid()), str(theirs.fileno()), "test"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
        )
    theirs.close()
    stderr_r, stderr_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        request = {
            "argv": data_serve(mnist_dir),
            "env": dict(os.environ),
            "cwd": str(tmp_path),
            "cpus": sorted(os.sched_getaffinity(0)),
            "sigint_ignored": False,
        }
        socket.send_fds(ours, [json.dumps(request).encode()], [stderr_w, status_w])
        os.close(stderr_w)
        os.close(status_w)
        ours.close()  # before the server has read it: it is still importing what it preloads
        assert server.wait(STARTED_WITHIN_S) == 0
        with os.fdopen(stderr_r, "rb") as stderr, os.fdopen(status_r, "rb") as status:
            assert stderr.read() == b"" and status.read() == b""  # no role ever had them
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
