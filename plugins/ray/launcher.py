"""The ``ray`` launcher: every role of a cluster job as a Ray actor running the role's process.

The driver joins a Ray cluster, or starts one of its own, and leaves it when the job is over
(:mod:`~hogwild_plugins.ray.joining`: which cluster, its token, whether it has room for the job).

Each role is one actor (:class:`~hogwild_plugins.ray.role_actor.RoleHost`) that starts
``python -m hogwild.cli ROLE ...`` on its node and reports the role's ready address, last lines
and exit status; the driver waits by polling the actors.

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

The job's own etcd cluster (``cluster.etcd = "job"``, :meth:`RayLauncher.start_etcd_cluster`)
has a member on each of three nodes, so its traffic leaves the node: unless ``cluster.etcd_tls``
names the user's certificates, the launcher makes the job's etcd CA
(:class:`~hogwild_plugins.ps.etcd_ca.JobCA`, its key in the driver's memory alone, never on
disk) and signs, as CURVE public keys are carried: each member's request (its key made
on its node, the certificate naming exactly that node's address), the driver's own client
certificate, and each etcd client role's request (parameter servers, replicas, members; made by
the role's actor on its node at every start, :meth:`RoleHost.etcd_request
<hogwild_plugins.ray.role_actor.RoleHost.etcd_request>`). No private key travels.

Restarting a role that exited (:meth:`RayLauncher.restart`) clears what is left of its process
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

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import ray
from hogwild_plugins.ps.etcd_ca import JobCA
from hogwild_plugins.ps.etcd_tls import JOB, drop_etcd_tls, use_etcd_tls
from hogwild_plugins.ray.joining import join_ray
from hogwild_plugins.ray.mirrors import files_for, remove_mirrors, send_roster
from hogwild_plugins.ray.role_actor import RoleHost
from hogwild_plugins.ray.spread import (
    FOLLOWER,
    bundles,
    follower_argv,
    follower_specs,
    partition_hosts,
    spreads,
)
from ray.exceptions import (
    ActorUnavailableError,
    ActorUnschedulableError,
    GetTimeoutError,
    RayActorError,
    RayTaskError,
)
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

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

POLL_S = 0.1
NODE_POLL_S = 1.0  # a lost server's home looked for again (a machine comes back in seconds)
CALL_TIMEOUT_S = 30.0  # one request to an actor that is up
STATUS_WAIT_S = 1.0  # what poll() waits for slow actors before the next round
REAP_S = 10.0  # after SIGKILL, until the process is gone
FORWARDED_ENV = ("HOGWILD_", "NUMBA_")  # the driver's settings its own host's roles get
ETCD_CLIENTS = ("ps", "replica", "member")  # the role kinds that speak to the job's etcd
PRIVATE = "private-keys"  # the driver's own keys in the run directory (mode 0700)
RoleActor = ray.remote(max_restarts=0, max_concurrency=1)(RoleHost)
ADDRESSED_KINDS = ("ps", "data")  # roles the others were told the address of: kept at it


@dataclass
class RayRole:
    """One role's actor and what the driver knows of it."""

    spec: RoleSpec
    actor: object
    host: str = ""
    node_id: str = ""
    pid: int | None = None
    log: str = ""
    last: list[str] = field(default_factory=list)
    pending: object = None  # a status request in flight (poll)
    # a spread replica's leader: its model.partition_hosts override; a follower: its link address
    link: str = ""


class RayLauncher(Launcher):
    """Roles as Ray actors on a Ray cluster (see the module docstring)."""

    def __init__(self, config, run_dir: str) -> None:
        super().__init__(config, run_dir)
        self.run_dir = str(Path(run_dir).resolve())
        self.cluster = config.cluster
        self.per_replica = replica_cpus(config)  # a replica's processes share one node
        self.spread = spreads(config)  # or each partition on a node of its own
        self.followers: dict[str, list[RayRole]] = {}  # a spread replica's follower hosts
        self.members = member_count(config)  # synchronous groups' members, a CPU each
        self.loopback = is_loopback(parse_address(f"{self.cluster.host}:0"))
        self.roles: dict[str, RayRole] = {}
        self.groups: dict[str, object] = {}
        self._reported: set[str] = set()
        self.homes: dict[str, str] = {}  # a lost server's node IP: where it must come back
        self._stopped = False
        self.etcd_members = None  # the job's own etcd cluster, one member per node
        self.etcd_ca: JobCA | None = None  # its certificates' authority, made by the job
        self._own_connection = not ray.is_initialized()
        if self._own_connection:
            join_ray(self.cluster, self.per_replica, self.members, spread=self.spread)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.node_ip = next(
            (n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == self.node_id), ""
        )

    # -- placing ---------------------------------------------------------------------------------

    def _place_all(self, specs: list[RoleSpec], deadline: float) -> list[RayRole]:
        """The roles' actors, placed side by side and answering (their nodes known): every
        placement group asked for, then every actor, then each one's node (Ray starts their
        worker processes together rather than one after another)."""
        made: list[str] = []  # the placement groups this call asked for
        try:
            return self._place_each(specs, deadline, made)
        except RoleFailedError:
            # a group whose role was never made (or was forgotten) would stay pending, holding
            # its CPUs once placed, and refuse the next start as "holds a role already"
            held = {role.spec.group for role in self.roles.values()}
            for name in made:
                if name not in held and name in self.groups:
                    with contextlib.suppress(Exception):  # already removed with its node
                        remove_placement_group(self.groups[name])
                    del self.groups[name]
            raise

    def _place_each(self, specs: list[RoleSpec], deadline: float, made: list[str]) -> list:
        for spec in specs:
            if spec.group:
                if spec.group in self.groups:
                    raise RoleFailedError(f"{spec.name}: group {spec.group!r} holds a role already")
                wanted, strategy = bundles(spec, self.config.model.partitions, self.spread)
                self.groups[spec.group] = placement_group(
                    wanted, strategy=strategy, name=f"hogwild-{spec.group}"
                )
                made.append(spec.group)
        for spec in specs:
            if spec.group and not self.groups[spec.group].wait(
                max(0.0, deadline - time.monotonic())
            ):
                raise RoleFailedError(self._unplaced(spec, "a node with them free"))
        roles, placed = [], []  # placed: with the spread replicas' followers
        for spec in specs:
            spread = self.spread and spec.kind == "replica"
            options: dict = {"num_cpus": 1 if spread else spec.cpus}
            if spec.group:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    self.groups[spec.group], 0
                )
            elif spec.name in self.homes:  # a lost server back at its address
                try:
                    node_id = self._node_at(spec, self.homes[spec.name], deadline)
                except RoleFailedError:
                    self._unplace(roles)  # those asked for before it in this call
                    raise
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
            elif not self.loopback:  # servers on as many nodes as there are: copies apart
                options["scheduling_strategy"] = "SPREAD"
            role = RayRole(spec, RoleActor.options(**options).remote(spec.name))
            self.roles[spec.name] = role
            roles.append(role)
            placed.append(role)
            if spread:  # a follower host on each other bundle, each on a node of its own
                followers = []
                for g, follower in enumerate(follower_specs(spec, self.config.model.partitions)):
                    strategy = PlacementGroupSchedulingStrategy(self.groups[spec.group], g + 1)
                    actor = RoleActor.options(num_cpus=1, scheduling_strategy=strategy)
                    followers.append(RayRole(follower, actor.remote(follower.name)))
                self.followers[spec.name] = followers
                placed += followers
        nodes = [role.actor.where.remote() for role in placed]
        for role, ref in zip(placed, nodes, strict=True):
            spec = role.spec
            try:
                node = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except GetTimeoutError:
                self._unplace(roles)
                raise RoleFailedError(self._unplaced(spec, "them free")) from None
            except ActorUnschedulableError as exc:  # its node (a server's home) died meanwhile
                self._unplace(roles)
                raise RoleFailedError(f"{spec.name}: Ray cannot place its actor: {exc}") from None
            except RayActorError as exc:
                self._unplace(roles)
                raise RoleFailedError(
                    f"{spec.name}: its Ray actor died as it started: {exc}"
                ) from None
            role.host, role.node_id = node["host"], node["node_id"]
            if self.loopback and role.host != self.node_ip:
                raise RoleFailedError(
                    f"{spec.name} was placed on {role.host}, but cluster.host = "
                    f"{self.cluster.host} (loopback) is reachable only on the driver's host "
                    f"{self.node_ip}; set cluster.host to a non-loopback address (roles then bind "
                    "their node's IP)"
                )
        return roles

    def _unplace(self, roles: list[RayRole]) -> None:
        """Roles whose placement failed forgotten, their actors killed and placement groups
        removed (a pending actor placed later would otherwise be taken for a placed one); where
        a server must come back stays in :attr:`homes`."""
        for role in roles:
            if self.roles.get(role.spec.name) is role:
                del self.roles[role.spec.name]
            self._release(role)

    def _release(self, role: RayRole) -> None:
        """``role``'s actor killed and its placement group removed (either may be gone already);
        a spread replica's followers' actors too."""
        for actor in [role.actor, *(f.actor for f in self.followers.pop(role.spec.name, []))]:
            try:
                ray.kill(actor, no_restart=True)
            except (RayActorError, ValueError):
                pass
        group = self.groups.pop(role.spec.group, None) if role.spec.group else None
        if group is not None:
            try:
                remove_placement_group(group)
            except Exception:  # noqa: BLE001 -- already removed with its node
                pass

    def _node_at(self, spec: RoleSpec, ip: str, deadline: float) -> str:
        """The id of a live node with IP ``ip``, waited for until ``deadline``."""
        while True:
            try:
                nodes = ray.nodes()
            except Exception:  # noqa: BLE001 -- the GCS busy or away: looked for again
                nodes = []
            for node in nodes:
                if node.get("Alive") and node.get("NodeManagerAddress") == ip:
                    return node["NodeID"]
            if time.monotonic() > deadline:
                raise RoleFailedError(
                    f"{spec.name} must come back at its address on {ip} (the other roles were "
                    f"told it), but no live Ray node has that IP after "
                    f"{self.cluster.start_timeout_s:g} s; start a Ray node there again"
                )
            time.sleep(min(NODE_POLL_S, max(0.0, deadline - time.monotonic()) + 0.01))

    def start_etcd_cluster(self, count: int, tls: str | None):
        """The job's own etcd cluster (``cluster.etcd = "job"``): ``count`` members, one per
        node (:mod:`~hogwild_plugins.ray.etcd_members`), started; stopped by :meth:`stop_all`
        (or by its ``stop``). It has ``address``, ``min_ttl_s`` and ``stop``. ``tls``:
        ``"job"``, certificates the job makes (the module docstring), or the user's directory.
        """
        from hogwild_plugins.ray.etcd_members import RayEtcdCluster

        try:
            if tls == JOB:
                self.etcd_ca = JobCA.make()
                driver = Path(self.run_dir) / PRIVATE / "etcd-driver"
                use_etcd_tls(self.etcd_ca.client_directory(driver, "driver").directory)
            members = RayEtcdCluster(count, tls=tls, timeout_s=self.cluster.start_timeout_s,
                                     prefix=f"hogwild-{os.getpid()}", ca=self.etcd_ca)  # fmt: skip
            self.etcd_members = members
            members.start()
        except BaseException:
            # no controller is made, so none closes: the driver's key goes here, and a later
            # "job" in this process finds none rather than a dead CA's
            if tls == JOB:
                drop_etcd_tls()
            raise
        return members

    def _unplaced(self, spec: RoleSpec, where: str) -> str:
        return (
            f"Ray did not place {spec.name} within {self.cluster.start_timeout_s:g} s: it needs "
            f"{spec.cpus} CPU(s) and {where}; free in the Ray cluster now: "
            f"{ray.available_resources()}"
        )

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
            for follower in followers:  # each listens where its replica's leader is told
                (public,) = self._get([follower.actor.identity.remote(self.run_dir)],
                                      [follower.spec])  # fmt: skip
                self.job_keys.add(follower.spec.name, public, follower.link)
        if self.etcd_ca is not None:
            self._certify([r for r in roles if r.spec.kind in ETCD_CLIENTS])
        self._launch_all([*followers, *roles])  # the followers wait for their leader's job
        return self._wait_ready(roles, deadline)

    def _link_spread(self, roles: list[RayRole]) -> None:
        """Each spread replica's link: a port free on each of its nodes, its followers' command
        lines and its own ``model.partition_hosts`` (:mod:`~hogwild_plugins.ray.spread`)."""
        for role in roles:
            followers = self.followers.get(role.spec.name)
            if not followers:
                continue
            every = [role, *followers]
            ports = self._get(
                [r.actor.free_port.remote(r.host) for r in every], [r.spec for r in every]
            )
            addresses = [host_port(r.host, p) for r, p in zip(every, ports, strict=True)]
            role.link = partition_hosts(addresses[0], addresses[1:])
            wait_s = self.cluster.start_timeout_s
            for follower, address in zip(followers, addresses[1:], strict=True):
                argv = follower_argv(address, self.config.ps.keys, wait_s, role.spec.name)
                follower.spec = replace(follower.spec, argv=argv)
                follower.link = address

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

    def _certify(self, roles: list[RayRole]) -> None:
        """Each role's etcd client key made by its actor on its node, the request signed here
        for the role's name, the certificate sent back (the roles side by side)."""
        requests = self._get(
            [r.actor.etcd_request.remote(self.run_dir) for r in roles], [r.spec for r in roles]
        )
        signed = [
            r.actor.etcd_install.remote(self.etcd_ca.sign_client(q, r.spec.name), self.etcd_ca.pem)
            for r, q in zip(roles, requests, strict=True)
        ]
        self._get(signed, [r.spec for r in roles])

    def _launch(self, role: RayRole):
        """Ask the role's actor to start its process (a request in flight): with the driver's
        settings on the driver's node, else with a mirror of the files it reads."""
        spec, argv = role.spec, self._argv(role)
        log = os.path.join(self.run_dir, "logs", f"{spec.kind}-{spec.index}.log")
        if role.node_id == self.node_id:
            env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}
            return role.actor.start.remote(argv, log, os.getcwd(), env)
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
                spec = role.spec
                role.last = status["last"]
                if status["address"]:
                    addresses[spec.name] = status["address"]
                    if self.job_keys is not None:
                        self.job_keys.located(spec.name, status["address"])
                    continue
                code = status["returncode"]
                if code is not None or time.monotonic() > deadline:
                    why = (
                        RoleExit(spec.name, role.host, code).describe()
                        if code is not None
                        else f"{spec.name} on {role.host} did not print its ready line within "
                        f"{self.cluster.start_timeout_s:g} s"
                    )
                    raise RoleFailedError(f"{why} while starting: {self._last_words(role)}")
            if len(addresses) < len(roles):
                time.sleep(POLL_S)
        return [addresses[r.spec.name] for r in roles]

    def _check_followers_started(self, waiting: list[RayRole]) -> None:
        """A spread replica whose follower exited while it starts fails as a role, with the
        follower's last words (its leader would wait for it until its own start timeout)."""
        followers = [f for r in waiting for f in self.followers.get(r.spec.name, [])]
        statuses = self._get([f.actor.status.remote() for f in followers],
                             [f.spec for f in followers])  # fmt: skip
        for follower, status in zip(followers, statuses, strict=True):
            follower.last = status["last"]
            if status["returncode"] is not None:
                exit = RoleExit(follower.spec.name, follower.host, status["returncode"])
                raise RoleFailedError(f"{exit.describe()} while starting: "
                                      f"{self._last_words(follower)}")  # fmt: skip

    def start(self, spec: RoleSpec) -> str:
        return self.start_all([spec])[0]

    def restart(self, spec: RoleSpec) -> str:
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
        for role in watched:
            if role.pending is None:
                role.pending = role.actor.status.remote()
        refs = [r.pending for r in watched]
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
                gone.append(RoleExit(role.spec.name, role.host, code, said=said))
        return gone

    def _watch_followers(self) -> None:
        """A spread replica whose follower failed (exited but by its leader's STOP, or lost
        with its node) is killed whole: the driver then sees the replica exit and restarts it,
        rather than the leader waiting ``model.partition_silence_s`` for a host that is gone."""
        watched = [
            (name, f)
            for name, fs in self.followers.items()
            if name in self.roles and name not in self._reported and self.roles[name].pid
            for f in fs
            if f.pid is not None
        ]
        for _, follower in watched:
            if follower.pending is None:
                follower.pending = follower.actor.status.remote()
        refs = [f.pending for _, f in watched]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        failed = set()
        for name, follower in watched:
            if follower.pending not in ready:
                continue
            ref, follower.pending = follower.pending, None
            try:
                status = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except ActorUnavailableError:
                continue
            except RayActorError:
                failed.add(name)
                continue
            follower.last = status["last"]
            if status["returncode"] not in (None, 0):
                failed.add(name)
        for name in failed:
            self._send([self.roles[name]], signal.SIGKILL, process_group=True)

    def _clear_spread(self, replica: RayRole) -> None:
        """A spread replica's leader and followers cleared in their actors, to be started there
        again; if any actor is lost (a follower's node, say), the whole replica is forgotten and
        placed anew."""
        every = [replica, *self.followers[replica.spec.name]]
        wait_s = 2 * self.cluster.stop_timeout_s + CALL_TIMEOUT_S
        refs = [r.actor.clear.remote(self.cluster.stop_timeout_s) for r in every]
        try:
            for ref in refs:
                ray.get(ref, timeout=wait_s)
        except (GetTimeoutError, RayActorError):  # ActorUnavailableError among them
            self._forget(replica)
            return
        for follower in every[1:]:
            follower.pid, follower.pending = None, None

    def _stop_followers(self, replica: RayRole) -> None:
        """A spread replica's followers stopped and reaped (their leader is gone: each would
        leave after ``model.partition_silence_s`` by itself)."""
        followers = [f for f in self.followers.get(replica.spec.name, []) if f.pid]
        self._send(followers, signal.SIGTERM)
        self._wait_exited(followers, self.cluster.stop_timeout_s)
        self._send(followers, signal.SIGKILL, process_group=True)
        self._reap(followers)

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
                if kind == "replica":  # their leaders gone, the spread replicas' followers
                    for role in group:
                        self._stop_followers(role)
        finally:
            if self.etcd_members is not None:  # after the servers (their leases given back),
                self.etcd_members.stop()  # before Ray goes (the members' data removed)
            remove_mirrors([role.actor for role in self._every_role()])
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
