"""The roles of a cluster job, as plain data: what each runs, what it needs, where it listens.

A role is one process started by a launcher: a parameter server (``hogwild ps serve``), a data
server (``hogwild data serve``), a model replica (``hogwild cluster replica``) or, in a
synchronous worker group (Sandblaster, AllReduce, hybrid), where the replica role is the group's
coordinator, each of the group's members (``hogwild cluster member``, started once its group
serves and told where), each a command line of ``hogwild`` plus the CPUs it needs.
:func:`plan_roles` derives them from the job's ``[cluster]`` section; every role reads the
job's resolved config from one JSON file the driver writes (``Config.to_dict()``), so all of
them agree on the model, the rules and the seed.

Every role, once it accepts requests, prints one line to stderr,
``hogwild ROLE: serving ... on HOST:PORT`` (:data:`READY`), which is how a launcher learns that
it is up and where. Parameter servers listen on ports fixed before they start, because each is
told the whole list of servers (the bucket map); the other roles take any free port.

A role's process group is killed by :func:`kill_process_group`, which spares multiprocessing's
resource tracker of the group so that it removes the named semaphores the others leave.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field, replace

import psutil

from hogwild.config.topology import resolve_topology

READY = re.compile(r"^hogwild [a-z]+: serving .* on (\S+)$")
PR_SET_PDEATHSIG = 1
SHIM = (
    "import ctypes, os, runpy, signal, sys\n"
    f"ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PDEATHSIG}, signal.SIGTERM, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv.pop(1)):\n"
    "    sys.exit(143)\n"
    "runpy.run_module('hogwild.cli', run_name='__main__', alter_sys=True)\n"
)
"""How a launcher runs a role as a fresh interpreter (the Ray launcher always; the local launcher
with ``cluster.start_method = "spawn"`` or where its role server cannot be used, see
:mod:`hogwild.cluster.role_server`): ``python -c SHIM PARENT_PID ARGV...`` asks the kernel for
SIGTERM when the parent (the driver, or a Ray actor) dies, exits at once if it died already,
then runs ``hogwild ARGV``. A ``preexec_fn`` would do the same between fork and exec, which is
unsafe in a process that has threads (the driver's readers, ZeroMQ's, Ray's)."""
KINDS = ("ps", "data", "replica", "member")


def spawn_role(argv, *, cwd: str | None = None, env: dict | None = None) -> subprocess.Popen:
    """``hogwild ARGV`` through :data:`SHIM`, in a session of its own, stderr piped to the
    caller (read it with :func:`tee_stderr`)."""
    return subprocess.Popen(
        [sys.executable, "-c", SHIM, str(os.getpid()), *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=cwd,
        env=env,
    )


def tee_stderr(
    process: subprocess.Popen, log, lines: deque, on_ready, on_line=None
) -> threading.Thread:
    """A started thread copying the role's stderr into the file ``log``, keeping its last
    lines in ``lines``, calling ``on_ready(address)`` at its first :data:`READY` line and, if
    given, ``on_line(line)`` at every line."""

    def read() -> None:
        ready = False
        with open(log, "a", encoding="utf-8") as out:
            for line in process.stderr:
                out.write(line)
                out.flush()
                line = line.rstrip("\n")
                lines.append(line)
                if on_line is not None:
                    on_line(line)
                match = READY.match(line)
                if match and not ready:
                    ready = True
                    on_ready(match.group(1))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True)
class RoleSpec:
    """One role of a cluster job.

    Attributes:
        kind: ``"ps"``, ``"data"``, ``"replica"`` or ``"member"``.
        index: Its index among the roles of its kind.
        argv: The ``hogwild`` command line that runs it (after ``hogwild``).
        cpus: CPUs it needs (a replica's workers; one for a server).
        fixed_port: Its port must be chosen before it starts (a parameter server).
        group: Roles with the same group run on one node (a replica and nothing else).
    """

    kind: str
    index: int
    argv: tuple[str, ...]
    cpus: int = 1
    fixed_port: bool = False
    group: str = ""

    @property
    def name(self) -> str:
        return f"{self.kind} {self.index}"


@dataclass
class ClusterPlan:
    """Every role of a job, in the order they start (servers before the replicas using them)."""

    ps: list[RoleSpec] = field(default_factory=list)
    data: list[RoleSpec] = field(default_factory=list)
    replicas: list[RoleSpec] = field(default_factory=list)
    members: list[RoleSpec] = field(default_factory=list)  # synchronous groups' replicas

    @property
    def roles(self) -> list[RoleSpec]:
        return [*self.ps, *self.data, *self.replicas, *self.members]


def ps_argv(config_file: str, job: str, servers: list[str], index: int, store: str | None) -> tuple:
    """``hogwild ps serve`` for server ``index`` of ``servers``, serving ``job``."""
    port = servers[index].rpartition(":")[2]
    host = servers[index].rpartition(":")[0]
    argv = ["ps", "serve", "--config", config_file, "--job", job, "--servers", ",".join(servers)]
    argv += ["--index", str(index), "--bind", host, "--port", port]
    if store:
        argv += ["--store", store]
    return tuple(argv)


def replica_cpus(config) -> int:
    """The CPUs one replica role asks for, all on one node: its workers, or, partitioned, its
    partition processes (:mod:`hogwild.cluster.partitioned`); a synchronous group's
    coordinator one (its members are roles of their own, a CPU each)."""
    partitions = config.model.partitions
    if coordinated(config):
        return 1
    return partitions if partitions > 1 else config.cluster.workers_per_replica


def member_count(config) -> int:
    """The job's member roles (a CPU each): every synchronous group's workers, or none."""
    return (
        config.cluster.replicas * config.cluster.workers_per_replica if coordinated(config) else 0
    )


def coordinated(config) -> bool:
    """Whether the job's replica roles are synchronous worker groups with member roles."""
    return resolve_topology(config.cluster, config.ps.rule).coordinated


def plan_roles(config, config_file: str, data: str, host: str) -> ClusterPlan:
    """The roles of ``config``'s cluster, before the parameter servers' ports are known.

    Args:
        config: The resolved job config.
        config_file: Where the driver wrote it (every role reads it).
        data: The data source (a directory of idx files or an image cache).
        host: The address roles listen on.
    """
    cluster = config.cluster
    plan = ClusterPlan()
    for i in range(cluster.ps * max(cluster.server_groups, 1)):  # ps: a server group's
        plan.ps.append(RoleSpec("ps", i, (), cpus=1, fixed_port=True))
    for i in range(cluster.data_servers):
        argv = ("data", "serve", data, "--config", config_file, "--bind", host, "--port", "0")
        plan.data.append(RoleSpec("data", i, argv, cpus=1))
    cpus = replica_cpus(config)
    for i in range(cluster.replicas):
        argv = ("cluster", "--config", config_file, "--data", data, "replica", "--index", str(i))
        argv += ("--bind", host)
        plan.replicas.append(RoleSpec("replica", i, argv, cpus=cpus, group=f"replica-{i}"))
    for m in range(member_count(config)):  # told their coordinator once it serves
        argv = ("cluster", "--config", config_file, "--data", data, "member", "--index", str(m))
        plan.members.append(RoleSpec("member", m, (*argv, "--bind", host), cpus=1))
    return plan


def planned_address(spec: RoleSpec) -> str:
    """``HOST:PORT`` a role with a port fixed before it starts will serve on; ``""`` for the
    others (they say where in their ready line)."""
    argv = list(spec.argv)
    if not spec.fixed_port or "--bind" not in argv[:-1] or "--port" not in argv[:-1]:
        return ""
    return f"{argv[argv.index('--bind') + 1]}:{argv[argv.index('--port') + 1]}"


def on_port_of(spec: RoleSpec, address: str) -> RoleSpec:
    """``spec`` made to listen on ``address``'s port (``--port``): a data server started again
    must be where the replicas were told it is."""
    argv = list(spec.argv)
    if "--port" in argv[:-1]:
        argv[argv.index("--port") + 1] = address.rpartition(":")[2]
    return replace(spec, argv=tuple(argv))


def with_incarnation(spec: RoleSpec, incarnation: int) -> RoleSpec:
    """A replica's ``spec`` started as its ``incarnation`` (``--incarnation``): the fencing
    token its requests carry (:mod:`hogwild.net.fencing`)."""
    argv = list(spec.argv)
    if "--incarnation" in argv[:-1]:
        argv[argv.index("--incarnation") + 1] = str(incarnation)
    else:
        argv += ["--incarnation", str(incarnation)]
    return replace(spec, argv=tuple(argv))


def with_servers(
    plan: ClusterPlan, config_file: str, job: str, servers: list[str], stores: list,
    per_group: int | None = None,
) -> None:  # fmt: skip
    """Fill in the parameter servers' command lines once their addresses are chosen; with
    ``per_group`` (several server groups, listed group after group) each server is told only
    its own group's servers: a group shards its own whole copy of the parameters, and keeps
    its replication keys in its own etcd namespace (``ps.server_group``)."""
    per_group = per_group or len(servers)
    plan.ps = []
    for i in range(len(servers)):
        first = i - i % per_group
        group = servers[first : first + per_group]
        argv = ps_argv(config_file, job, group, i - first, stores[i])
        if per_group < len(servers):
            argv += (f"--ps.server_group={i // per_group}",)
        plan.ps.append(RoleSpec("ps", i, argv, 1, True))


RESOURCE_TRACKER = "from multiprocessing.resource_tracker import main"  # its command line


def kill_process_group(pgid: int) -> bool:
    """SIGKILL process group ``pgid`` but multiprocessing's resource tracker, which is woken if
    stopped (the group may have been paused whole) to clean up after the others; whether any
    process was there. The group is stopped first, so none of it forks meanwhile."""
    try:
        os.killpg(pgid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        return False
    trackers = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
            if RESOURCE_TRACKER in " ".join(proc.info["cmdline"] or ()):
                trackers.append(proc)
            else:
                proc.kill()
        except (OSError, psutil.Error):
            continue  # gone meanwhile
    for tracker in trackers:
        try:
            tracker.send_signal(signal.SIGCONT)
        except psutil.Error:
            pass
    return True
