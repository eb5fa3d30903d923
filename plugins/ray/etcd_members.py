"""The job's own etcd cluster on a Ray cluster: one member per node, each run by an actor.

``cluster.etcd = "job"`` with the Ray launcher: :class:`RayEtcdCluster` places ``count`` actors
(:class:`EtcdMemberHost`) on as many different live nodes, the driver's first (each pinned to its
node, asking no CPU: a member must not take a role's; a cluster with fewer nodes is refused,
saying so), each reserves a client and a peer port on its
node's address, the members are launched told of each other, and the cluster is ready once every
member grants leases. A member is an :class:`~hogwild_plugins.ps.etcd_process.EtcdProcess` of its
actor (its data in the node's temporary directory): it dies with the actor (the kernel's
parent-death signal), and :meth:`RayEtcdCluster.stop` stops each (its data removed) and kills
the actors. Members serve TLS: with certificates the job makes (``tls`` = ``"job"``, what
``cluster.etcd_tls`` left empty means here), or from ``cluster.etcd_tls = DIR``, a directory at
the same path on every node whose ``server.crt`` names the nodes' addresses.

Job-made certificates (:mod:`~hogwild_plugins.ps.etcd_ca`): each member's actor makes the
member's key on its node and a request naming the node's address
(:meth:`EtcdMemberHost.certificate_request`); the driver's :class:`~.etcd_ca.JobCA` signs it
only if that is the address of the node the driver placed it on (Ray's node table), and the
actor installs the certificate beside the key (:meth:`EtcdMemberHost.install`, private to the
user, removed with the member).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import ray
from hogwild_plugins.ps.etcd_ca import MEMBER, install_certificate, request_certificate
from hogwild_plugins.ps.etcd_process import ELECTION_MS, EtcdProcess, etcd_binary
from hogwild_plugins.ps.etcd_tls import JOB
from hogwild_plugins.ray.role_actor import node_ip, private_base
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hogwild.errors import ConfigError, HogwildError

__all__ = ["EtcdMemberHost", "RayEtcdCluster"]


class EtcdMemberHost:
    """One etcd member on this node (see the module docstring)."""

    def __init__(
        self, name: str, lease_floor_s: float, tls: str | None, election_ms: int = ELECTION_MS
    ) -> None:
        self.name, self.lease_floor_s, self.election_ms = name, lease_floor_s, election_ms
        self.own: Path | None = None  # the member's job-made key and certificate, on this node
        self.member: EtcdProcess | None = None
        if tls != JOB:
            self.member = EtcdProcess(host=node_ip(), name=name, lease_floor_s=lease_floor_s,
                                      tls=tls, election_ms=election_ms)  # fmt: skip

    def certificate_request(self) -> bytes:
        """The member's key made on this node; a request naming this node's address (the
        request leaves the node, the key never does)."""
        self.own = private_base() / f"{self.name}-etcd-tls"
        return request_certificate(self.own, MEMBER, node_ip())

    def install(self, certificate: bytes, ca: bytes) -> None:
        """The driver's certificate for the key :meth:`certificate_request` made: the member
        serves TLS with it."""
        tls = install_certificate(self.own, MEMBER, certificate, ca)
        self.member = EtcdProcess(host=node_ip(), name=self.name,
                                  lease_floor_s=self.lease_floor_s, tls=tls,
                                  election_ms=self.election_ms)  # fmt: skip

    def urls(self) -> tuple[str, str]:
        """A client and a peer URL on this node's address, on ports free now."""
        return self.member.urls()

    def launch(self, client: str, peer: str, initial_cluster: str) -> None:
        self.member.launch(etcd_binary(self.member.binary), client, peer, initial_cluster)

    def wait_ready(self, timeout_s: float) -> tuple[str | None, int]:
        """None once the member grants leases (else why not), and the shortest it grants."""
        error = self.member.wait_ready(time.monotonic() + timeout_s)
        return error, self.member.min_ttl_s

    def stop(self) -> None:
        if self.member is not None:
            self.member.stop()
        if self.own is not None:
            shutil.rmtree(self.own, ignore_errors=True)


EtcdMemberActor = ray.remote(max_restarts=0, max_concurrency=1)(EtcdMemberHost)


class RayEtcdCluster:
    """``count`` etcd members on as many Ray nodes, started by :meth:`start`; ``address`` is
    their client addresses (``HOST:PORT,...``), ``min_ttl_s`` the longest shortest lease."""

    def __init__(self, count: int, *, tls: str | None = None, lease_floor_s: float = 1.0,
                 timeout_s: float = 60.0, prefix: str = "hogwild", ca=None,
                 election_ms: int = 0) -> None:  # fmt: skip
        if (tls == JOB) != (ca is not None):
            raise ValueError('the job\'s own certificates (tls="job") are signed by its CA (ca)')
        self.count, self.tls, self.ca = count, tls, ca
        # the members' election timeout (0: ELECTION_MS); their shortest lease, 1.5 of it
        self.election_ms = election_ms or ELECTION_MS
        self.lease_floor_s = max(lease_floor_s, self.election_ms * 1.5 / 1000)
        self.timeout_s, self.prefix = timeout_s, prefix
        self.actors: list = []
        self.address = ""
        self.min_ttl_s = 0

    def start(self) -> str:
        """Place, launch and wait for every member; their client addresses.

        Raises:
            ConfigError: The Ray cluster has fewer live nodes than members.
            HogwildError: A member did not start (naming its node, with its log's tail);
                every member is stopped then.
        """
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> str:
        here = ray.get_runtime_context().get_node_id()
        alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
        nodes = sorted(alive, key=lambda node: node != here)  # the driver's node first
        if len(nodes) < self.count:
            raise ConfigError(
                f'cluster.etcd = "job" with the Ray launcher puts one etcd member on each of '
                f"{self.count} nodes, and the Ray cluster has {len(nodes)} live node(s); add "
                'nodes, or give cluster.etcd = "HOST:PORT,..." of an etcd cluster you run'
            )
        names = [f"{self.prefix}-etcd-{i}" for i in range(self.count)]
        self.actors = [
            EtcdMemberActor.options(
                num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(name, self.lease_floor_s, self.tls, self.election_ms)
            for name, node in zip(names, nodes, strict=False)
        ]
        if self.ca is not None:
            self._certify(names, nodes)
        urls = self._get([actor.urls.remote() for actor in self.actors])
        initial = ",".join(f"{n}={peer}" for n, (_, peer) in zip(names, urls, strict=True))
        pairs = zip(self.actors, urls, strict=True)
        self._get([actor.launch.remote(client, peer, initial) for actor, (client, peer) in pairs])
        ready = self._get([a.wait_ready.remote(self.timeout_s) for a in self.actors],
                          extra_s=self.timeout_s)  # fmt: skip
        for (client, _), (error, _) in zip(urls, ready, strict=True):
            if error is not None:
                raise HogwildError(f"the job's etcd member at {client} did not start: {error}")
        self.min_ttl_s = max(ttl for _, ttl in ready)
        scheme = "https://" if self.tls else "http://"
        self.address = ",".join(client.removeprefix(scheme) for client, _ in urls)
        return self.address

    def _certify(self, names: list[str], nodes: list[str]) -> None:
        """Each member's request signed for the address of the node it was placed on (as Ray's
        node table has it, not as the member says), the certificates sent back."""
        placed = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        requests = self._get([actor.certificate_request.remote() for actor in self.actors])
        signed = [
            self.ca.sign_member(request, placed[node], name)
            for request, node, name in zip(requests, nodes, names, strict=False)
        ]
        self._get(
            [a.install.remote(c, self.ca.pem) for a, c in zip(self.actors, signed, strict=True)]
        )

    def _get(self, refs: list, extra_s: float = 0.0) -> list:
        try:
            return ray.get(refs, timeout=30.0 + extra_s)
        except (GetTimeoutError, RayActorError) as exc:
            raise HogwildError(f"the job's etcd members on Ray: {exc}") from None

    def stop(self) -> None:
        """Stop every member (its data removed) and kill the actors; safe to call twice, and
        after Ray itself is gone (the members died with their actors)."""
        actors, self.actors = self.actors, []
        if not ray.is_initialized():
            return
        refs = []
        for actor in actors:
            try:
                refs.append(actor.stop.remote())
            except (RayActorError, ValueError):
                pass
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=30.0)
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except (RayActorError, ValueError):
                pass
