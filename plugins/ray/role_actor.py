"""What runs on a Ray node for one role of a cluster job: its process, its log, its ready line.

:class:`RoleHost` is the body of the Ray actor :mod:`~hogwild_plugins.ray.launcher` places for a
role (``ray.remote`` is applied there, so this class is plain Python). It starts
``python -m hogwild.cli ROLE ...`` on the actor's node, in a session of its own, reads its stderr
from a thread into a log file and keeps the last lines (the driver may be on another host, so
the log is not always where the driver can read it: :meth:`RoleHost.status` carries the last
lines back), and notes the ready line's address (:data:`~hogwild.cluster.roles.READY`).

Every method returns at once (the driver does the waiting), so the actor needs one thread, and
the role is started from the actor's main thread: the role asks the kernel for SIGTERM when its
parent dies (``PR_SET_PDEATHSIG``, which follows the thread that forked), so a killed actor, or
a lost driver whose actors Ray then kills, still takes the role down (servers flush on SIGTERM).
The request is made by a few lines of Python run before ``hogwild.cli`` (``SHIM`` in
:mod:`hogwild.cluster.roles`), not by a ``preexec_fn``, which is unsafe in a process with
threads (a Ray worker has many).

A role on a node that is not the driver's cannot see the driver's run directory (it is on a
shared filesystem only when local): :meth:`RoleHost.start` is then given the files the role
reads from it (the job's config, the CURVE keys), writes them into a mirror of the run directory
under the node's temporary directory, and points the role's command line at the mirror.

Under a roster of the job's keys (a key pair per role), :meth:`RoleHost.identity` makes the
role's key pair on this node, beside the mirror (private to the user), and returns the public
key alone; the role is started with :data:`~hogwild.net.auth.IDENTITY_ENV` naming its secret
file, and :meth:`RoleHost.refresh` replaces the mirror's roster as roles join.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

from hogwild_plugins.ps.etcd_ca import CLIENT, install_certificate, request_certificate
from hogwild_plugins.ps.etcd_tls import ETCD_TLS_ENV

from hogwild.cluster.roles import kill_process_group, spawn_role, tee_stderr
from hogwild.net.auth import IDENTITY_ENV, make_identity
from hogwild.net.ports import free_port

LAST_LINES = 50
CALL_TIMEOUT_S = 30.0  # one request to an actor that is up (the launcher's wait for an answer)
POLL_S = 0.1  # the launcher's pause between asks while it awaits ready lines or exits


def node_ip() -> str:
    """This node's IP address as Ray knows it."""
    import ray

    return ray.util.get_node_ip_address()


def mirror_dir(run_dir: str) -> Path:
    """Where a node that cannot see ``run_dir`` keeps its mirror of it."""
    digest = hashlib.sha1(run_dir.encode()).hexdigest()[:12]
    return _base() / f"{Path(run_dir).name}-{digest}"


def remove_mirror(run_dir: str) -> None:
    """This node's mirror of ``run_dir`` removed, and the job's key folders here with whatever
    keys are left in them (a task's body, run only where no actor of the job is left on the
    node, once the job's roles stopped: a key still there is a forgotten role's, whose actor
    was killed before it could remove it)."""
    local = mirror_dir(run_dir)
    shutil.rmtree(local, ignore_errors=True)
    for folder in (f"{local.name}-own-keys", f"{local.name}-etcd-tls"):
        shutil.rmtree(local.parent / folder, ignore_errors=True)


def _base() -> Path:
    return Path(tempfile.gettempdir()) / f"hogwild-ray-{os.getuid()}"


def private_base() -> Path:
    """The user's folder of mirrors and keys on this node, made or checked private
    (:func:`_private_base`)."""
    base = _base()
    _private_base(base)
    return base


def _private_base(base: Path) -> None:
    """Make ``base`` (the user's folder of mirrors), or check that it is a real directory of
    this user that nobody else can enter: a shared /tmp must not let another user plant it."""
    base.mkdir(mode=0o700, exist_ok=True)
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"{base}: expected a directory of uid {os.getuid()} with mode 0700 (it holds the "
            "job's keys); remove it or fix its owner and mode"
        )


def repath(value: str, old: str, new: str) -> str:
    """``value`` with the directory ``old`` at its start (or after ``--key=``) made ``new``."""
    key, eq, path = value.partition("=") if value.startswith("--") else ("", "", value)
    if path == old or path.startswith(old.rstrip("/") + "/"):
        return f"{key}{eq}{new}{path[len(old) :]}"
    return value


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class RoleHost:
    """One role's process on this node (see the module docstring).

    Args:
        name: The role's name (``"ps 0"``), for messages.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: deque[str] = deque(maxlen=LAST_LINES)
        self.address: str | None = None
        self.process: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None
        self.keep: re.Pattern | None = None  # the lines to remember the last of (start's keep)
        self.kept: str | None = None  # the last of them: later lines cannot push it out
        self.log = ""
        self.mirrored: Path | None = None  # the run directory's mirror this actor made
        self.own_key: Path | None = None  # the role's secret key file, made on this node
        self.own_etcd: Path | None = None  # the role's etcd client key and certificate, here

    def where(self) -> dict:
        """This node: ``host`` (its IP) and ``node_id``."""
        import ray

        return {"host": node_ip(), "node_id": ray.get_runtime_context().get_node_id()}

    def free_port(self, host: str) -> int:
        """A TCP port free on ``host`` (an address of this node) right now."""
        return free_port(host)

    def identity(self, run_dir: str) -> str:
        """Make the role's own CURVE key pair on this node (kept for a restart here); its
        public key, the only part that leaves the node."""
        local = mirror_dir(run_dir)
        _private_base(local.parent)
        self.own_key, public = make_identity(local.parent / f"{local.name}-own-keys", self.name)
        return public

    def etcd_request(self, run_dir: str) -> bytes:
        """Make the role's etcd client key on this node (a new one at every start here); a
        certificate signing request for it, the only part that leaves the node."""
        local = mirror_dir(run_dir)
        _private_base(local.parent)
        folder = local.parent / f"{local.name}-etcd-tls"
        folder.mkdir(mode=0o700, exist_ok=True)
        self.own_etcd = folder / self.name.replace(" ", "-")
        return request_certificate(self.own_etcd, CLIENT)

    def etcd_install(self, certificate: bytes, ca: bytes) -> None:
        """The driver's certificate for the key :meth:`etcd_request` made, kept beside it."""
        install_certificate(self.own_etcd, CLIENT, certificate, ca)

    def refresh(self, relative: str, data: bytes) -> None:
        """Replace one file of this node's mirror (the job's roster as roles join), whole."""
        if self.mirrored is None:
            return
        path = (self.mirrored / relative).resolve()
        if not path.is_relative_to(self.mirrored.resolve()):
            raise ValueError(f"{relative}: not a path inside the run directory")
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)

    def start(
        self,
        argv: list[str],
        log: str,
        cwd: str | None,
        env: dict[str, str],
        mirror: dict | None = None,
        keep: str = "",
    ) -> dict:
        """Start the role: ``python -m hogwild.cli *argv``; its ``pid`` and ``log``.

        Args:
            argv: The ``hogwild`` command line.
            log: The log file (its folder is made).
            cwd: The working directory, if it exists here (else this actor's).
            env: Variables added to this actor's environment.
            mirror: ``{"run_dir": ..., "files": {relative path: bytes}}`` when this node cannot
                see the driver's run directory: the files are written into :func:`mirror_dir`
                (the run directory's path in JSON files made the mirror's) and every path under
                the run directory in ``argv`` and ``log`` is made the mirror's.
            keep: A regular expression: the last line of the role's matching it (its stop
                line, say) is kept apart from the last lines, and :meth:`status` carries it as
                ``kept`` however many lines came after it ("": none kept).
        """
        if self.process is not None:
            raise RuntimeError(f"{self.name} was already started here")
        if mirror is not None:
            argv, log = self._mirror(argv, log, mirror["run_dir"], mirror["files"])
        self.log = log
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        if self.own_key is not None:  # the role's own key pair names it to the job's servers
            env = {**env, IDENTITY_ENV: str(self.own_key)}
        if self.own_etcd is not None:  # the job's etcd knows the role by this certificate
            env = {**env, ETCD_TLS_ENV: str(self.own_etcd)}
        self.process = spawn_role(
            argv, cwd=cwd if cwd and os.path.isdir(cwd) else None, env={**os.environ, **env}
        )
        self.keep = re.compile(keep) if keep else None
        self.reader = tee_stderr(
            self.process, self.log, self.lines, self._ready, self._heard if keep else None
        )
        return {"pid": self.process.pid, "log": log}

    def _mirror(self, argv, log, run_dir: str, files: dict) -> tuple[list[str], str]:
        local = mirror_dir(run_dir)
        _private_base(local.parent)
        local.mkdir(mode=0o700, exist_ok=True)  # it holds the job's secret key
        local.chmod(0o700)
        self.mirrored = local
        for relative, data in files.items():
            path = local / relative
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if relative.endswith(".json"):
                old, new = json.dumps(run_dir)[1:-1], json.dumps(str(local))[1:-1]
                text = data.decode()
                for end in ('"', "/"):
                    text = text.replace(old + end, new + end)
                data = text.encode()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable
            with os.fdopen(fd, "wb") as out:  # by others, not even for an instant
                out.write(data)
        return [repath(a, run_dir, str(local)) for a in argv], repath(log, run_dir, str(local))

    def _ready(self, address: str) -> None:
        self.address = address

    def _heard(self, line: str) -> None:
        if self.keep is not None and self.keep.match(line):
            self.kept = line

    def status(self) -> dict:
        """``address`` (once ready), ``returncode`` (once exited), ``last`` lines of stderr,
        ``kept``: the last line matching start's ``keep`` (None: none yet)."""
        code = None if self.process is None else self.process.poll()
        if code is not None and self.reader is not None:
            self.reader.join(1.0)  # the last lines, which say why it exited
        last = list(self.lines)[-4:]
        return {"address": self.address, "returncode": code, "last": last, "kept": self.kept}

    def send(self, signum: int, group: bool = False) -> None:
        """Send ``signum`` to the role (``group``: to its whole process group, its workers too)."""
        if self.process is None:
            return
        try:
            if group and signum == signal.SIGKILL:  # its resource tracker cleans up after it
                kill_process_group(self.process.pid)
            elif group:
                os.killpg(self.process.pid, signum)
            elif self.process.poll() is None:
                self.process.send_signal(signum)
        except (ProcessLookupError, PermissionError):
            pass

    def clear(self, timeout_s: float) -> None:
        """Once the role exited, before it is started again here: what is left of its process
        group (workers its death orphaned) asked to stop, killed after ``timeout_s``, reaped."""
        if self.process is None:
            return
        deadline = time.monotonic() + timeout_s
        self.send(signal.SIGTERM, group=True)
        while time.monotonic() < deadline and _group_alive(self.process.pid):
            time.sleep(0.05)
        self.send(signal.SIGKILL, group=True)
        self.reap(timeout_s)
        _sweep_dead(self.process.pid)
        self.process, self.reader, self.address = None, None, None
        self.lines.clear()  # the last words the driver reads are the next process's
        self.keep, self.kept = None, None

    def cleanup(self) -> None:
        """Remove the mirror of the run directory made on this node (config, keys, the
        server's store, logs) and the role's own key pair, once the role is gone."""
        if self.process is not None and self.process.poll() is None:
            return
        if self.process is not None:
            _sweep_dead(self.process.pid)
        if self.mirrored is not None:
            shutil.rmtree(self.mirrored, ignore_errors=True)
            self.mirrored = None
        self.drop_keys()

    def drop_keys(self) -> None:
        """Remove the role's own key pair and etcd client key from this node (the node's mirror,
        which the job's other roles here read, stays): at the job's end, or when its replica is
        placed anew elsewhere."""
        if self.own_key is not None:
            self.own_key.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # the last role of the job on this node
                self.own_key.parent.rmdir()
            self.own_key = None
        if self.own_etcd is not None:
            shutil.rmtree(self.own_etcd, ignore_errors=True)
            with contextlib.suppress(OSError):  # the last role of the job on this node
                self.own_etcd.parent.rmdir()
            self.own_etcd = None

    def reap(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` for the role to be gone, close its pipe; its exit status."""
        if self.process is None:
            return None
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        if self.reader is not None:
            self.reader.join(5.0)
        if self.process.stderr is not None:
            self.process.stderr.close()
        return code


def _sweep_dead(pid: int) -> None:
    """Remove the shared-memory segments the role's process left when it died without its own
    clean-up (SIGKILL: a partition host's arena), as its node's owner of the role."""
    from hogwild.shm.sweeper import sweep_owner

    with contextlib.suppress(OSError):
        sweep_owner(pid)


__all__ = [
    "CALL_TIMEOUT_S",
    "LAST_LINES",
    "POLL_S",
    "RoleHost",
    "mirror_dir",
    "node_ip",
    "private_base",
    "remove_mirror",
    "repath",
]
