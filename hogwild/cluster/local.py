"""The ``local`` launcher: every role of a cluster job as a process on this host.

Each role runs ``hogwild ROLE ...`` in a session of its own (so a Ctrl-C in the terminal
reaches the driver alone, which then stops the roles in order), and ends when the driver dies,
however it dies, so a SIGKILLed driver still takes its roles down (parameter servers flush on
the way). With ``cluster.start_method = "forkserver"`` (the default) each role is forked from
the job's role server, which has imported what roles import once
(:mod:`hogwild.cluster.role_server`: the role watches the driver through a pidfd); with
``"spawn"``, or where that server cannot be used, each role is a fresh interpreter started
through ``SHIM`` (:mod:`hogwild.cluster.roles`), which asks the kernel for SIGTERM when the
driver dies (``PR_SET_PDEATHSIG``). A thread per role reads its stderr into
``RUN_DIR/logs/KIND-INDEX.log`` and watches for its ready line. Stopping sends SIGTERM, waits
``cluster.stop_timeout_s``, then SIGKILLs the role's whole process group (its workers too).
Restarting a role that exited does the same to what is left of its group (a SIGKILLed replica's
workers), then starts it again, its log appended to. A group is killed all but multiprocessing's
resource tracker, which is let run on: once the others are gone it removes the named semaphores
they left (``/dev/shm/sem.mp-*``), which nobody removes once it is killed with them. The role
server is stopped last, once every role is (:meth:`LocalLauncher.stop_all`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import deque
from pathlib import Path

from hogwild.cluster.launcher import STOP_ORDER, Launcher, RoleExit, RoleFailedError, said_in
from hogwild.cluster.role_server import RoleServer
from hogwild.cluster.roles import RoleSpec, kill_process_group, spawn_role, tee_stderr
from hogwild.config.topology import replica_starts_workers
from hogwild.errors import EXIT_STOPPED
from hogwild.net.auth import IDENTITY_ENV
from hogwild.net.ports import free_port

POLL_S = 0.05


class RoleProcess:
    """One role's process, its log, and its ready line."""

    def __init__(
        self, spec: RoleSpec, log_dir: Path, env: dict | None = None,
        server: RoleServer | None = None, workers: bool = False,
    ) -> None:  # fmt: skip
        """``server``: the role server to fork the role from; None, or where it cannot be
        used, the role is started through the shim. ``workers``: the role starts workers from
        a forkserver (forked from the role as it begins, when the role is forked)."""
        self.spec = spec
        self.lines: deque[str] = deque(maxlen=50)
        self.address: str | None = None
        self.ready = threading.Event()
        self.log = log_dir / f"{spec.kind}-{spec.index}.log"
        forked = None
        if server is not None:
            forked = server.start_role(spec.argv, env, workers=workers)
        self.process = forked or spawn_role(spec.argv, env=env)
        self.reader = tee_stderr(self.process, self.log, self.lines, self._ready)

    def _ready(self, address: str) -> None:
        self.address = address
        self.ready.set()

    def last_words(self) -> str:
        return " | ".join(list(self.lines)[-4:]) or "nothing"

    def last_error(self) -> str:
        """Once it exited: its last ``hogwild: error:`` line (its stderr read to the end)."""
        self.reader.join(1.0)  # the exit may be seen before its last lines are read
        return said_in(list(self.lines))

    def signal_group(self, signum: int) -> bool:
        """Send ``signum`` to the role's process group; whether any process was there."""
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def kill_group(self) -> bool:
        """:func:`kill_process_group` of the role's group; whether any process was there."""
        return kill_process_group(self.process.pid)

    def clear(self, timeout_s: float) -> None:
        """Once the role exited: its group asked to stop, killed after ``timeout_s``, reaped."""
        clear_roles([self], timeout_s)


def clear_roles(roles: list[RoleProcess], timeout_s: float) -> None:
    """Once the roles exited: their groups asked to stop together, each killed once it is gone
    or ``timeout_s`` ran out (one wait for all, not one each), reaped."""
    deadline = time.monotonic() + timeout_s
    asked = [role for role in roles if role.signal_group(signal.SIGTERM)]  # orphaned workers
    for role in asked:  # release their memory
        while time.monotonic() < deadline and role.signal_group(0):
            time.sleep(POLL_S)
    for role in roles:
        role.kill_group()
        role.process.wait()
        role.reader.join(5.0)
        if role.process.stderr is not None:
            role.process.stderr.close()


class LocalLauncher(Launcher):
    """Roles as processes of this host (the default launcher)."""

    def __init__(self, config, run_dir: str) -> None:
        super().__init__(config, run_dir)
        self.log_dir = Path(run_dir) / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.roles: dict[str, RoleProcess] = {}
        self._reported: set[str] = set()
        cluster = config.cluster
        self.server = (
            RoleServer(
                f"hogwild role server of {run_dir}",
                cluster.start_timeout_s,
                self.log_dir / "role-server.log",
            )
            if cluster.start_method == "forkserver"
            else None
        )  # started at the first role, stopped last by stop_all

    def reserve(self, specs: list[RoleSpec], host: str) -> list[str]:
        return [f"{host}:{free_port(host)}" for _ in specs]

    def start(self, spec: RoleSpec) -> str:
        return self.start_all([spec])[0]

    def start_all(self, specs: list[RoleSpec]) -> list[str]:
        """Every process first, then the ready lines: the roles start side by side."""
        results = self._start_each(specs, first_failure_ends=True)
        return [str(result) for result in results]  # a failure was raised: all are addresses

    def _start_each(
        self, specs: list[RoleSpec], first_failure_ends: bool
    ) -> list[str | RoleFailedError]:
        """Start ``specs`` side by side; each one's address or why it did not start (with
        ``first_failure_ends``, the first failure is raised instead)."""
        roles = []
        envs = [self._identity(spec) for spec in specs]  # every key in the roster before any
        for spec, env in zip(specs, envs, strict=True):  # starts: servers started side by side
            role = RoleProcess(  # ... know each other
                spec, self.log_dir, env, self.server, workers=self._starts_workers(spec)
            )
            self.roles[spec.name] = role
            roles.append(role)
        # Taken once every process exists: the first start may wait on the role server's
        # preload, which must not eat the roles' own time to start (a role whose fork was
        # refused is spawned then, and starts in full).
        deadline = time.monotonic() + self.config.cluster.start_timeout_s
        results: list[str | RoleFailedError] = []
        for role in roles:  # one deadline for all: they start together
            try:
                results.append(self._wait_ready(role, deadline))
            except RoleFailedError as exc:
                if first_failure_ends:
                    raise
                results.append(exc)
        if self.job_keys is not None:
            for spec, result in zip(specs, results, strict=True):
                if isinstance(result, str):
                    self.job_keys.located(spec.name, result)
        return results

    def _starts_workers(self, spec: RoleSpec) -> bool:
        """Whether the role starts its workers from a forkserver: a replica of a job that does
        (:func:`hogwild.config.topology.replica_starts_workers`)."""
        return spec.kind == "replica" and replica_starts_workers(self.config)

    def _identity(self, spec: RoleSpec) -> dict | None:
        """With a roster: the role's own key pair (made here: this is its node), its public key
        entered in the roster, and the environment that names its secret file to it."""
        if self.job_keys is None:
            return None
        path, public = self.job_keys.identity_for(spec.name)
        self.job_keys.enter(spec, public)
        return {**os.environ, IDENTITY_ENV: str(path)}

    def _wait_ready(self, role: RoleProcess, deadline: float) -> str:
        while not role.ready.wait(POLL_S):
            code = role.process.poll()
            if code is not None or time.monotonic() > deadline:
                name = role.spec.name
                why = (
                    RoleExit(name, "localhost", code).describe()
                    if code is not None
                    else f"{name} did not start within {self.config.cluster.start_timeout_s:g} s"
                )
                raise RoleFailedError(f"{why} while starting: {role.last_words()} ({role.log})")
        return role.address

    def restart(self, spec: RoleSpec) -> str:
        (result,) = self.restart_all([spec])
        if isinstance(result, RoleFailedError):
            raise result
        return result

    def restart_all(self, specs: list[RoleSpec]) -> list[str | RoleFailedError]:
        """What is left of every one of ``specs`` cleared together, then all started side by
        side (:meth:`start_all`), each one's failure its own."""
        old = [self.roles[spec.name] for spec in specs if spec.name in self.roles]
        clear_roles(old, self.config.cluster.stop_timeout_s)
        self._reported.difference_update(spec.name for spec in specs)
        return self._start_each(specs, first_failure_ends=False)

    def poll(self) -> list[RoleExit]:
        gone = []
        for name, role in self.roles.items():
            code = role.process.poll()
            if code is not None and name not in self._reported:
                self._reported.add(name)
                said = role.last_error() if code == EXIT_STOPPED else ""
                why = (
                    f"{name} on localhost was killed by SIGKILL: its role server ended"
                    if getattr(role.process, "server_lost", False)
                    else ""
                )
                gone.append(RoleExit(name, "localhost", code, why=why, said=said))
        return gone

    def kill(self, name: str) -> bool:
        role = self.roles.get(name)
        return role is not None and role.kill_group()

    def hosts(self) -> dict[str, str]:
        return {name: "localhost" for name in self.roles}

    def describe(self) -> list[dict]:
        return [
            {"name": name, "host": "localhost", "pid": role.process.pid}
            for name, role in self.roles.items()
        ]

    def last_words(self, name: str) -> str:
        role = self.roles.get(name)
        return f"{role.last_words()} ({role.log})" if role else ""

    def stop_all(self, grace_s: float = 0.0) -> None:
        timeout = self.config.cluster.stop_timeout_s
        for kind in STOP_ORDER:
            group = [r for r in self.roles.values() if r.spec.kind == kind]
            deadline = time.monotonic() + (grace_s if kind == "replica" else 0.0)
            for role in group:  # replicas asked to stop leave by themselves first
                try:
                    role.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            for role in group:
                if role.process.poll() is None:
                    role.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for role in group:
                try:
                    role.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                role.kill_group()  # stragglers, and any child left in its group
                role.process.wait()
                role.reader.join(5.0)
                if role.process.stderr is not None:
                    role.process.stderr.close()
        self._reported.update(self.roles)
        if self.server is not None:
            self.server.close(timeout)
