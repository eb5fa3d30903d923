"""The ``ray`` launcher: every role of a cluster job as a Ray actor running the role's process.

The driver joins a Ray cluster, or starts one of its own, and leaves it when the job is over
(:mod:`~hogwild_plugins.ray.joining`: which cluster, its token, whether it has room for the job).

Each role is one actor (:class:`~hogwild_plugins.ray.role_actor.RoleHost`) that starts
``python -m hogwild.cli ROLE ...`` on its node and reports the role's ready address, last lines
and exit status; the driver waits by polling the actors.

This module starts, watches, restarts and stops the roles; its parts of their own are placing
them (:mod:`~hogwild_plugins.ray.placing`), a spread replica's followers
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
Roles started together (:meth:`RayLauncher.start_all`) start side by side, as the local
launcher's do: every actor placed, then every process started, then every ready line awaited.

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

Restarting a role that exited (:meth:`RayLauncher.restart`; :meth:`RayLauncher.restart_all`
for one tier of a round, side by side: every clear asked at once, then every start, then the
ready lines, each role's failure its own; a spread replica, whose followers start with it,
one at a time) clears what is left of its process
group in its actor and starts it there again (same node; a data server keeps its address); a
role whose actor was lost with it (its node) is placed anew: a replica anywhere, but a parameter
server or a data server, whose address the other roles were given, only on a live node with its
old node's IP (the machine back, its Ray node started again), waited for up to
``cluster.start_timeout_s``: anywhere else it would listen where nobody looks for it.

Stopping (:meth:`RayLauncher.stop_all`) follows :data:`~hogwild.cluster.launcher.STOP_ORDER`:
replicas get ``grace_s`` to leave, then each kind is sent SIGTERM, waited for up to
``cluster.stop_timeout_s``, and its process groups are SIGKILLed; then every actor is killed and
every placement group removed. Roles whose actor died anyway get SIGTERM from the kernel
(``PR_SET_PDEATHSIG``), and Ray kills a driver's actors when the driver is gone.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import ray
from hogwild_plugins.ray.etcd_job import JobEtcd
from hogwild_plugins.ray.followers import SpreadFollowers
from hogwild_plugins.ray.joining import join_ray
from hogwild_plugins.ray.mirrors import files_for, remove_left_mirrors, remove_mirrors, send_roster
from hogwild_plugins.ray.placing import STATUS_EVERY_S, Placing, RayRole
from hogwild_plugins.ray.role_actor import CALL_TIMEOUT_S
from hogwild_plugins.ray.spread import FOLLOWER, spreads
from ray.exceptions import (
    ActorUnavailableError,
    GetTimeoutError,
    RayActorError,
    RayTaskError,
)
from ray.util.placement_group import remove_placement_group

from hogwild.cluster.launcher import (
    STOP_ORDER,
    Launcher,
    RoleExit,
    RoleFailedError,
    said_in,
)
from hogwild.cluster.roles import RoleSpec, member_count, replica_cpus
from hogwild.errors import EXIT_STOPPED
from hogwild.net.address import host_port, is_loopback, parse_address

__all__ = ["RayLauncher"]

POLL_S = 0.1
STATUS_WAIT_S = 1.0  # what poll() waits for slow actors before the next round
REAP_S = 10.0  # after SIGKILL, until the process is gone
FORWARDED_ENV = ("HOGWILD_", "NUMBA_")  # the driver's settings its own host's roles get
ETCD_CLIENTS = ("ps", "replica", "member")  # the role kinds that speak to the job's etcd
ADDRESSED_KINDS = ("ps", "data")  # roles the others were told the address of: kept at it


class RayLauncher(Placing, SpreadFollowers, JobEtcd, Launcher):
    """Roles as Ray actors on a Ray cluster (see the module docstring): placing them
    (:mod:`~hogwild_plugins.ray.placing`), a spread replica's followers
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

    # -- starting --------------------------------------------------------------------------------

    def start_all(self, specs: list[RoleSpec]) -> list[str]:
        """Every role's actor placed (those :meth:`reserve` placed are kept), then every
        process started, then the ready lines: the roles start side by side, as the local
        launcher's do (they load their kernels together)."""
        deadline = time.monotonic() + self.cluster.start_timeout_s
        self._place_all([s for s in specs if s.name not in self.roles], deadline)
        roles = [self.roles[spec.name] for spec in specs]
        for role, spec in zip(roles, specs, strict=True):
            role.spec = spec  # reserve() placed it before its command line was known
        followers = [f for role in roles for f in self.followers.get(role.spec.name, [])]
        self._link_spread(roles)
        if self.job_keys is not None:  # every key in the roster before any of them starts:
            for role in roles:  # servers started together are each other's clients (copies);
                self._identify(role, self._argv(role))  # a role placed anew has a new one
            self._identify_followers(followers)  # each where its replica's leader is told
        if self.etcd_ca is not None:
            self._certify([r for r in roles if r.spec.kind in ETCD_CLIENTS])
        self._launch_all([*followers, *roles])  # the followers wait for their leader's job
        # the ready lines get a start_timeout_s of their own, as the local launcher's do: a
        # placement that waited for a lost node's machine must not leave them none
        return self._wait_ready(roles, time.monotonic() + self.cluster.start_timeout_s)

    def _launch_all(self, roles: list[RayRole]) -> None:
        """Every role's process started, each one's pid recorded before the first failure is
        raised: a role that did start is then stopped by :meth:`stop_all` like any other."""
        requests, failure = [], None
        try:
            for role in roles:
                requests.append(self._launch(role))
        except Exception as exc:  # a request not sent (say, a far node's files): the sent ones run
            failure = exc
        for role, request in zip(roles, requests, strict=False):  # only those sent
            try:
                (process,) = self._get([request], [role.spec])
            except RoleFailedError as exc:
                failure = failure or exc
                continue
            role.pid, role.log = process["pid"], process["log"]
        if failure is not None:
            raise failure

    def _argv(self, role: RayRole) -> list[str]:
        """The role's command line on its node (bound to the node's address)."""
        argv = list(role.spec.argv)
        if role.spec.kind == FOLLOWER:  # bound at its link address (port and all) already
            return argv
        if not self.loopback and "--bind" in argv[:-1]:
            argv[argv.index("--bind") + 1] = role.host
        return [*argv, role.link] if role.link else argv

    def _identify(self, role: RayRole, argv: list[str]) -> None:
        """The role's key pair made by its actor on its node; its public key (and its address,
        if fixed) into the job's roster, sent to the nodes that keep a mirror."""
        self.job_keys.publish = self._publish
        (public,) = self._get([role.actor.identity.remote(self.run_dir)], [role.spec])
        self.job_keys.enter(replace(role.spec, argv=tuple(argv)), public)

    def _launch(self, role: RayRole):
        """Ask the role's actor to start its process (a request in flight): with the driver's
        settings on the driver's node, else with a mirror of the files it reads."""
        spec, argv = role.spec, self._argv(role)
        log = os.path.join(self.run_dir, "logs", f"{spec.kind}-{spec.index}.log")
        if role.node_id == self.node_id:
            env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}
            return role.actor.start.remote(argv, log, os.getcwd(), env)
        self.mirrored.add(role.node_id)
        mirror = {
            "run_dir": self.run_dir,
            "files": files_for(self.run_dir, argv, self.config.ps.keys),
        }
        return role.actor.start.remote(argv, log, None, {}, mirror)

    def _wait_ready(self, roles: list[RayRole], deadline: float) -> list[str]:
        """Each role's ready address, once all have printed it (each entered in the roster as
        it comes)."""
        addresses: dict[str, str] = {}
        while len(addresses) < len(roles):
            waiting = [r for r in roles if r.spec.name not in addresses]
            statuses = self._get(
                [r.actor.status.remote() for r in waiting], [r.spec for r in waiting]
            )
            self._check_followers_started(waiting)
            for role, status in zip(waiting, statuses, strict=True):
                address = self._ready_in(role, status, deadline)
                if address is not None:
                    addresses[role.spec.name] = address
            if len(addresses) < len(roles):
                time.sleep(POLL_S)
        return [addresses[r.spec.name] for r in roles]

    def _wait_each(self, roles: list[RayRole], deadline: float) -> dict[str, str | RoleFailedError]:
        """:meth:`_wait_ready` of roles without followers, each one's failure its own: role
        name -> its ready address, or why it exited or stayed silent past ``deadline``."""
        results: dict[str, str | RoleFailedError] = {}
        while len(results) < len(roles):
            waiting = [r for r in roles if r.spec.name not in results]
            refs = [r.actor.status.remote() for r in waiting]  # asked together, read in turn
            for role, ref in zip(waiting, refs, strict=True):
                try:
                    (status,) = self._get([ref], [role.spec])
                    address = self._ready_in(role, status, deadline)
                    if address is not None:
                        results[role.spec.name] = address
                except RoleFailedError as exc:
                    results[role.spec.name] = exc
            if len(results) < len(roles):
                time.sleep(POLL_S)
        return results

    def _ready_in(self, role: RayRole, status: dict, deadline: float) -> str | None:
        """The role's ready address from its actor's ``status`` (entered in the roster), None
        while it may still print it; raises :class:`RoleFailedError` once it cannot."""
        spec = role.spec
        role.last = status["last"]
        if status["address"]:
            if self.job_keys is not None:
                self.job_keys.located(spec.name, status["address"])
            return status["address"]
        code = status["returncode"]
        if code is not None or time.monotonic() > deadline:
            why = (
                RoleExit(spec.name, role.host, code).describe()
                if code is not None
                else f"{spec.name} on {role.host} did not print its ready line within "
                f"{self.cluster.start_timeout_s:g} s"
            )
            raise RoleFailedError(f"{why} while starting: {self._last_words(role)}")
        return None

    def start(self, spec: RoleSpec) -> str:
        return self.start_all([spec])[0]

    def restart(self, spec: RoleSpec) -> str:
        return self._restart_one(spec)

    def _restart_one(self, spec: RoleSpec) -> str:
        """What is left of ``spec``'s role cleared in its actor (a spread replica's followers
        too), then the role started again there, or placed anew if its actor is lost."""
        self.follower_failed.pop(spec.name, None)  # a failure poll never reported is stale
        role = self.roles.get(spec.name)
        if role is not None and spec.name in self.followers:
            self._clear_spread(role)
            role = None
        if role is not None:
            wait_s = 2 * self.cluster.stop_timeout_s + CALL_TIMEOUT_S
            try:
                ray.get(role.actor.clear.remote(self.cluster.stop_timeout_s), timeout=wait_s)
            except GetTimeoutError:
                raise RoleFailedError(
                    f"{spec.name}: its Ray actor did not clear the role within {wait_s:g} s"
                ) from None
            except ActorUnavailableError as exc:  # unreachable, not known dead: its process may
                # still hold the address, so it is not placed anew (a failed attempt; the next
                # finds it back, or lost)
                raise RoleFailedError(f"{spec.name}: its Ray actor is unreachable: {exc}") from None
            except RayActorError:  # its actor (or node) is lost: place the role anew
                self._forget(role)
        self._reported.discard(spec.name)
        return self.start(spec)

    def restart_all(self, specs: list[RoleSpec]) -> list[str | RoleFailedError]:
        """Every one of ``specs`` cleared in its actor (asked together), then those cleared or
        lost started side by side (:meth:`_start_each`); each one's address or failure. A
        spread replica (its followers on other nodes) is restarted alone (:meth:`restart`)."""
        results: dict[str, str | RoleFailedError] = {}
        for spec in specs:
            if spec.name in self.followers or (self.spread and spec.kind == "replica"):
                try:
                    results[spec.name] = self._restart_one(spec)
                except RoleFailedError as exc:
                    results[spec.name] = exc
        specs_together = [spec for spec in specs if spec.name not in results]
        wait_s = 2 * self.cluster.stop_timeout_s + CALL_TIMEOUT_S
        clears = [
            (
                self.roles[spec.name],
                self.roles[spec.name].actor.clear.remote(self.cluster.stop_timeout_s),
            )
            for spec in specs_together
            if spec.name in self.roles
        ]
        deadline = time.monotonic() + wait_s
        for role, ref in clears:
            name = role.spec.name
            try:
                ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except GetTimeoutError:
                results[name] = RoleFailedError(
                    f"{name}: its Ray actor did not clear the role within {wait_s:g} s"
                )
            except ActorUnavailableError as exc:  # unreachable, not known dead: its process may
                # still hold the address, so it is not placed anew (a failed attempt; the next
                # finds it back, or lost)
                results[name] = RoleFailedError(f"{name}: its Ray actor is unreachable: {exc}")
            except RayActorError:  # its actor (or node) is lost: place the role anew
                self._forget(role)
        pending = [spec for spec in specs_together if spec.name not in results]
        self._reported.difference_update(spec.name for spec in pending)
        results.update(self._start_each(pending))
        return [results[spec.name] for spec in specs]

    def _start_each(self, specs: list[RoleSpec]) -> dict[str, str | RoleFailedError]:
        """:meth:`start_all`'s steps, each role's failure its own: the roles lost with their
        actors placed together (one by one only if that fails, to tell which cannot be), every
        key and certificate made, every process started, then the ready lines."""
        results: dict[str, str | RoleFailedError] = {}
        deadline = time.monotonic() + self.cluster.start_timeout_s
        unplaced = [spec for spec in specs if spec.name not in self.roles]
        try:
            self._place_all(unplaced, deadline)
        except RoleFailedError as joint:  # which cannot be placed: each again alone, all within
            # one more start_timeout_s (a tier's placement is bounded by two), any the failed
            # call left placed unplaced first; a single role's failure is its own already
            self._unplace([self.roles[s.name] for s in unplaced if s.name in self.roles])
            if len(unplaced) == 1:
                results[unplaced[0].name] = joint
            else:
                alone_by = time.monotonic() + self.cluster.start_timeout_s
                for spec in unplaced:
                    try:
                        self._place_all([spec], alone_by)
                    except RoleFailedError as exc:
                        results[spec.name] = exc
        roles = [self.roles[spec.name] for spec in specs if spec.name not in results]
        for role, spec in zip(roles, [s for s in specs if s.name not in results], strict=True):
            role.spec = spec

        def each(step, roles: list[RayRole]) -> list[RayRole]:
            """``step`` of every role; those it did not fail."""
            for role in roles:
                try:
                    step(role)
                except RoleFailedError as exc:
                    results[role.spec.name] = exc
            return [r for r in roles if r.spec.name not in results]

        if self.job_keys is not None:  # every key in the roster before any of them starts
            roles = each(lambda role: self._identify(role, self._argv(role)), roles)
        if self.etcd_ca is not None:
            certified = each(
                lambda role: self._certify([role]),
                [r for r in roles if r.spec.kind in ETCD_CLIENTS],
            )
            roles = [r for r in roles if r in certified or r.spec.kind not in ETCD_CLIENTS]
        roles = self._launch_each(roles, results)
        # the ready lines get a start_timeout_s of their own (see start_all): a deadline the
        # placement spent, or the one-by-one placement outlived, would fail them unheard
        results.update(self._wait_each(roles, time.monotonic() + self.cluster.start_timeout_s))
        return results

    def _launch_each(
        self, roles: list[RayRole], results: dict[str, str | RoleFailedError]
    ) -> list[RayRole]:
        """:meth:`_launch_all`, a role whose process did not start entered in ``results``; the
        roles started. An error that is no role's (a request not sent) is raised once every
        sent request's pid is recorded."""
        requests, failure = [], None
        for role in roles:
            try:
                requests.append((role, self._launch(role)))
            except RoleFailedError as exc:
                results[role.spec.name] = exc
            except Exception as exc:  # as _launch_all: the sent ones run, and are recorded
                failure = failure or exc
        started = []
        for role, request in requests:
            try:
                (process,) = self._get([request], [role.spec])
            except RoleFailedError as exc:
                results[role.spec.name] = exc
                continue
            role.pid, role.log = process["pid"], process["log"]
            started.append(role)
        if failure is not None:
            raise failure
        return started

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

    # -- stopping --------------------------------------------------------------------------------

    def stop_all(self, grace_s: float = 0.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            for kind in STOP_ORDER:
                group = [r for r in self.roles.values() if r.spec.kind == kind and r.pid]
                if kind == "replica" and grace_s > 0:
                    group_left = self._wait_exited(group, grace_s)
                else:
                    group_left = group
                self._send(group_left, signal.SIGTERM)
                self._wait_exited(group_left, self.cluster.stop_timeout_s)
                self._send(group, signal.SIGKILL, process_group=True)  # stragglers, workers too
                self._reap(group)
                if kind == "replica":  # their leaders gone, every spread replica's followers
                    self._stop_followers()
        finally:
            if self.etcd_members is not None:  # after the servers (their leases given back),
                self.etcd_members.stop()  # before Ray goes (the members' data removed)
            remove_mirrors([role.actor for role in self._every_role()])
            kept = {role.node_id for role in self._every_role()}  # each removed its node's
            remove_left_mirrors(self.run_dir, self.mirrored - kept)  # forgotten roles' nodes
            self._remove_actors()
            self._reported.update(self.roles)
            if self._own_connection and ray.is_initialized():
                ray.shutdown()

    def _send(self, roles: list[RayRole], signum: int, process_group: bool = False) -> None:
        refs = [r.actor.send.remote(signum, process_group) for r in roles]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=CALL_TIMEOUT_S)

    def _wait_exited(self, roles: list[RayRole], seconds: float) -> list[RayRole]:
        """Wait up to ``seconds`` for the roles to exit; those still running."""
        deadline = time.monotonic() + seconds
        running = list(roles)
        while running:
            refs = [r.actor.status.remote() for r in running]
            ray.wait(refs, num_returns=len(refs), timeout=CALL_TIMEOUT_S)
            still = []
            for role, ref in zip(running, refs, strict=True):
                try:
                    status = ray.get(ref, timeout=0)
                except (GetTimeoutError, ActorUnavailableError):
                    still.append(role)
                    continue
                except RayActorError:
                    continue  # its actor is gone (and took the role with it)
                if status["returncode"] is None:
                    still.append(role)
            running = still
            if not running or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        return running

    def _reap(self, roles: list[RayRole]) -> None:
        refs = [r.actor.reap.remote(REAP_S) for r in roles]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=REAP_S + CALL_TIMEOUT_S)

    def _remove_actors(self) -> None:
        for role in self._every_role():
            try:
                ray.kill(role.actor, no_restart=True)
            except (RayActorError, ValueError):
                pass
        for group in self.groups.values():
            try:
                remove_placement_group(group)
            except Exception:  # noqa: BLE001 -- already removed, or Ray is going away
                pass
