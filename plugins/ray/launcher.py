"""The ``ray`` launcher: every role of a cluster job as a Ray actor running the role's process.

The driver joins a Ray cluster, or starts one of its own, and leaves it when the job is over
(:mod:`~hogwild_plugins.ray.joining`: which cluster, its token, whether it has room for the job).

Each role is one actor (:class:`~hogwild_plugins.ray.role_actor.RoleHost`) that starts
``python -m hogwild.cli ROLE ...`` on its node and reports the role's ready address, last lines
and exit status; the driver waits by polling the actors.

This module holds the launcher's records of its roles and watches them (:meth:`RayLauncher.poll`);
its parts of their own are placing them (:mod:`~hogwild_plugins.ray.placing`), starting and
restarting them side by side (:mod:`~hogwild_plugins.ray.starting`), stopping them
(:mod:`~hogwild_plugins.ray.stopping`), a spread replica's followers
(:mod:`~hogwild_plugins.ray.followers`) and the job's etcd (:mod:`~hogwild_plugins.ray.etcd_job`).

Placement, by the role's resources (:class:`~hogwild.cluster.roles.RoleSpec`):

- a role with a ``group`` (a replica) gets a placement group of one bundle of ``cpus`` CPUs,
  ``STRICT_PACK``: its workers (or, partitioned, its K partition processes, which exchange
  blocks of neurons through one shared arena) share one node's memory (one role per group);
  with ``cluster.partition_placement = "spread"`` a partitioned replica's group is instead K
  one-CPU bundles, ``STRICT_SPREAD``, its role on the first and a ``hogwild partition-host``
  follower on each other (:mod:`~hogwild_plugins.ray.spread`), kept, stopped and restarted
  with the replica (no roles of the driver's);
- a server asks for ``cpus`` (1) CPU as a plain actor, spread over the nodes (``SPREAD``) when
  the roles are reachable from other hosts, so a bucket's copies sit on different nodes where
  there are as many nodes as servers. Ray's CPUs are logical: a node started with
  ``--num-cpus`` above its cores oversubscribes them, as the local launcher does on a small
  host, and the local instance is started so (a 2-core host runs 2 parameter servers, a data
  server and 2 one-worker replicas). Requests are not made fractional: on a real cluster a
  server does use its core.

Parameter servers are told the whole server list, so their ports are chosen before they start:
:meth:`RayLauncher.reserve` places their actors first and asks each for a port free on its node.
Roles started together start side by side, as the local launcher's do, and a tier of restarts
the same way, each role's failure its own (:mod:`~hogwild_plugins.ray.starting`).

Addresses: with ``cluster.host`` on loopback (the default) every role binds it, which works only
when Ray places it on the driver's host (otherwise the role is refused, naming the node); any
other ``cluster.host`` means "reachable from other hosts", and each role's ``--bind`` is made its
node's IP (the driver then gives the roles CURVE keys, ``ps.keys``: a key pair per role, each
made by the role's actor on its node, only its public key entering the job's roster). A role on
a node other than the driver's gets the files it reads from the run directory (config, the
roster) in a mirror on its node (private to its user, removed when the job stops; the roster
is sent again as roles join); the data (``--data``) and keys kept elsewhere (``cluster.keys``)
must be readable at the same path on every node.

The job's own etcd cluster (``cluster.etcd = "job"``,
:meth:`~hogwild_plugins.ray.etcd_job.JobEtcd.start_etcd_cluster`)
has a member on each of three nodes, so its traffic leaves the node: unless ``cluster.etcd_tls``
names the user's certificates, the launcher makes the job's etcd CA
(:class:`~hogwild_plugins.ps.etcd_ca.JobCA`, its key in the driver's memory alone, never on
disk) and signs, as CURVE public keys are carried: each member's request (its key made
on its node, the certificate naming exactly that node's address), the driver's own client
certificate, and each etcd client role's request (parameter servers, replicas, members; made by
the role's actor on its node at every start, :meth:`RoleHost.etcd_request
<hogwild_plugins.ray.role_actor.RoleHost.etcd_request>`). No private key travels.

Restarting a role that exited (:meth:`RayLauncher.restart`, :meth:`RayLauncher.restart_all`:
:mod:`~hogwild_plugins.ray.starting`) clears what is left of its process group in its actor and
starts it there again (same node; a data server keeps its address); a role whose actor was lost
with it (its node) is placed anew: a replica anywhere, but a parameter server or a data server,
whose address the other roles were given, only on a live node with its old node's IP (the
machine back, its Ray node started again), waited for up to ``cluster.start_timeout_s``:
anywhere else it would listen where nobody looks for it.

Stopping (:meth:`RayLauncher.stop_all`, :mod:`~hogwild_plugins.ray.stopping`) follows
:data:`~hogwild.cluster.launcher.STOP_ORDER`, then kills every actor and removes every placement
group.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import ray
from hogwild_plugins.ray.etcd_job import JobEtcd
from hogwild_plugins.ray.followers import SpreadFollowers
from hogwild_plugins.ray.joining import join_ray
from hogwild_plugins.ray.mirrors import send_roster
from hogwild_plugins.ray.placing import STATUS_EVERY_S, Placing, RayRole
from hogwild_plugins.ray.role_actor import CALL_TIMEOUT_S
from hogwild_plugins.ray.spread import spreads
from hogwild_plugins.ray.starting import Starting
from hogwild_plugins.ray.stopping import Stopping
from ray.exceptions import (
    ActorUnavailableError,
    GetTimeoutError,
    RayActorError,
    RayTaskError,
)

from hogwild.cluster.launcher import Launcher, RoleExit, RoleFailedError, said_in
from hogwild.cluster.roles import RoleSpec, member_count, replica_cpus
from hogwild.errors import EXIT_STOPPED
from hogwild.net.address import host_port, is_loopback, parse_address

__all__ = ["RayLauncher"]

STATUS_WAIT_S = 1.0  # what poll() waits for slow actors before the next round
ADDRESSED_KINDS = ("ps", "data")  # roles the others were told the address of: kept at it


class RayLauncher(Starting, Stopping, Placing, SpreadFollowers, JobEtcd, Launcher):
    """Roles as Ray actors on a Ray cluster (see the module docstring): starting them
    (:mod:`~hogwild_plugins.ray.starting`), stopping them (:mod:`~hogwild_plugins.ray.stopping`),
    placing them (:mod:`~hogwild_plugins.ray.placing`), a spread replica's followers
    (:mod:`~hogwild_plugins.ray.followers`) and the job's etcd
    (:mod:`~hogwild_plugins.ray.etcd_job`) are parts of their own."""

    def __init__(self, config, run_dir: str) -> None:
        super().__init__(config, run_dir)
        self.run_dir = str(Path(run_dir).resolve())
        self.cluster = config.cluster
        self.per_replica = replica_cpus(config)  # a replica's processes share one node
        self.spread = spreads(config)  # or each partition on a node of its own
        self._init_followers()  # followers, follower_failed: SpreadFollowers' own
        self.mirrored: set[str] = set()  # the nodes given a mirror of the run directory
        self.members = member_count(config)  # synchronous groups' members, a CPU each
        self.loopback = is_loopback(parse_address(f"{self.cluster.host}:0"))
        self.roles: dict[str, RayRole] = {}
        self.groups: dict[str, object] = {}
        self._reported: set[str] = set()
        self.homes: dict[str, str] = {}  # a lost server's node IP: where it must come back
        self._stopped = False
        self.etcd_members = None  # the job's own etcd cluster, one member per node
        self.etcd_ca = None  # its certificates' authority (a JobCA), made by the job
        self._own_connection = not ray.is_initialized()
        if self._own_connection:
            join_ray(self.cluster, self.per_replica, self.members, spread=self.spread)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.node_ip = next(
            (n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == self.node_id), ""
        )

    # -- placing ---------------------------------------------------------------------------------

    def _bind_host(self, role: RayRole) -> str:
        return self.cluster.host if self.loopback else role.host

    def reserve(self, specs: list[RoleSpec], host: str) -> list[str]:
        deadline = time.monotonic() + self.cluster.start_timeout_s
        placed = self._place_all(specs, deadline)
        hosts = [host if self.loopback else role.host for role in placed]
        ports = self._get(
            [r.actor.free_port.remote(h) for r, h in zip(placed, hosts, strict=True)], specs
        )
        return [host_port(h, p) for h, p in zip(hosts, ports, strict=True)]

    # -- the roles' records and their actors -----------------------------------------------------

    def kill(self, name: str) -> bool:
        role = self.roles.get(name)
        if role is None:
            return False
        self._send([role], signal.SIGKILL, process_group=True)  # a lost node: nothing to reach
        return True

    def _forget(self, role: RayRole) -> None:
        """A lost role's actor killed and its placement group removed (it is placed anew; a
        server at its node's IP)."""
        del self.roles[role.spec.name]
        if role.spec.kind in ADDRESSED_KINDS and not self.loopback and role.host:
            self.homes[role.spec.name] = role.host
        self._release(role)

    def _every_role(self) -> list[RayRole]:
        """The roles and the spread replicas' followers."""
        return [*self.roles.values(), *(f for fs in self.followers.values() for f in fs)]

    def _publish(self, roster: bytes) -> None:
        """The job's new roster to every node that keeps a mirror of the run directory (the
        driver's node reads the run directory itself)."""
        far = [
            r.actor for r in self._every_role() if r.node_id != self.node_id and r.pid is not None
        ]
        send_roster(far, self.run_dir, str(self.job_keys.keys), roster)

    def _get(self, refs: list, specs: list[RoleSpec]) -> list:
        """Results of requests to the roles' actors, as errors naming the role when they fail."""
        results = []
        for ref, spec in zip(refs, specs, strict=True):
            try:
                results.append(ray.get(ref, timeout=CALL_TIMEOUT_S))
            except GetTimeoutError:
                raise RoleFailedError(
                    f"{spec.name}: its Ray actor did not answer within {CALL_TIMEOUT_S:g} s"
                ) from None
            except RayActorError as exc:
                host = self.roles[spec.name].host if spec.name in self.roles else "?"
                raise RoleFailedError(
                    f"{RoleExit(spec.name, host, None).describe()}: {exc}"
                ) from None
            except RayTaskError as exc:  # the request itself failed there (say, a bad cwd)
                raise RoleFailedError(f"{spec.name}: {exc}") from None
        return results

    def _last_words(self, role: RayRole) -> str:
        words = " | ".join(role.last) or "nothing"
        where = "" if role.node_id == self.node_id else f" on {role.host}"
        return f"{words} ({role.log}{where})" if role.log else words

    # -- watching --------------------------------------------------------------------------------

    def poll(self) -> list[RoleExit]:
        if self._stopped:
            return []
        self._watch_followers()
        watched = [
            r for n, r in self.roles.items() if r.pid is not None and n not in self._reported
        ]
        now = time.monotonic()
        for role in watched:
            if role.pending is None and now - role.asked >= STATUS_EVERY_S:
                role.pending, role.asked = role.actor.status.remote(), now
        refs = [r.pending for r in watched if r.pending is not None]
        ready, _ = (
            ray.wait(refs, num_returns=len(refs), timeout=STATUS_WAIT_S) if refs else ([], [])
        )
        ready = set(ready)
        gone = []
        for role in watched:
            if role.pending not in ready:
                continue  # a slow actor: asked again next time
            ref, role.pending = role.pending, None
            try:
                status = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except ActorUnavailableError:
                continue  # unreachable for now, not known dead
            except RayActorError:
                status = {"returncode": None, "last": role.last, "lost": True}
            role.last = status["last"]
            if status["returncode"] is not None or status.get("lost"):
                self._reported.add(role.spec.name)
                code = status["returncode"]
                said = said_in(status["last"]) if code == EXIT_STOPPED else ""
                exit_ = RoleExit(role.spec.name, role.host, code, said=said)
                gone.append(self._replica_exit(exit_))
        return gone

    def hosts(self) -> dict[str, str]:
        return {name: role.host for name, role in self.roles.items()}

    def describe(self) -> list[dict]:
        roles = [
            {"name": name, "host": role.host, "pid": role.pid} for name, role in self.roles.items()
        ]
        return roles + [  # a spread replica's followers, named with their replica
            {"name": f.spec.name, "host": f.host, "pid": f.pid, "replica": name}
            for name, followers in self.followers.items()
            for f in followers
        ]

    def last_words(self, name: str) -> str:
        role = self.roles.get(name)
        return self._last_words(role) if role else ""
