"""How one parameter server runs: :class:`ServerOptions`, built from the job's config.

The job config's ``[ps]`` section (:class:`hogwild.config.PsConfig`, with ``cluster.copies``,
``cluster.etcd`` and ``cluster.etcd_election_ms``) is the one source of the server's settings:
:meth:`ServerOptions.from_config` builds the options from it (``hogwild ps serve`` does, with
its flags), and the defaults of the
fields that mirror the config are the config's own defaults, resolved as a server resolves them
(``rule = "auto"`` and ``lr = 0`` become the rule and step :func:`hogwild.config.ps_update_rule`
gives one replica: SGD with step 1; ``lease_s = 0`` becomes :data:`DEFAULT_LEASE_S`). A server
built from ``ServerOptions(job=..., servers=...)`` therefore runs as ``hogwild ps serve`` with no
flags does. What the config does not hold is this server's own: its place in the job, its
threads and NUMA node, its store, how it receives and acknowledges.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hogwild.config import ClusterConfig, Config, PsConfig, ps_update_rule
from hogwild.config.topology import etcd_group

__all__ = ["DEFAULT_LEASE_S", "ServerOptions"]

DEFAULT_LEASE_S = 2
"""``ps.lease_s = 0``: a lease any etcd honours (its default timers: 2 s at least)."""

_PS = PsConfig()
_RULE, _LR = ps_update_rule(_PS)


@dataclass(frozen=True)
class ServerOptions:
    """How one server runs (``[ps]`` of the job config, plus the command line).

    Attributes:
        job: The job's name (its id goes in every header).
        servers: Every server of the job, ``HOST:PORT``, in order.
        index: This server's position in ``servers``.
        bind: Address to listen on (default: ``servers[index]``).
        rule, lr, momentum, staleness_decay, max_staleness, adagrad_eps: The update rule.
        shard_kib, buckets: Sharding (see :mod:`~hogwild_plugins.ps.layout`).
        threads: Update threads (0: one per CPU of the node, or of this process).
        node: NUMA node to pin to and allocate on (None: wherever the process runs).
        store, flush_s: LMDB store directory and seconds between flushes (None: no store).
        keys: CURVE key directory (required to bind beyond loopback).
        recv: ``"pool"``, ``"inplace"`` or ``"auto"`` (see
            :mod:`~hogwild_plugins.ps.serving.server`).
        ack: ``"applied"`` or ``"queued"``.
        copies: Copies of every bucket (1: no replication; more: every server holds every shard
            and :mod:`~hogwild_plugins.ps.replication` keeps the copies, with ``etcd``).
        etcd: ``HOST:PORT`` of the job's etcd (required when ``copies > 1``).
        etcd_tls: A directory of etcd certificates (``cluster.etcd_tls``): HTTPS to etcd.
        etcd_group: The server group whose etcd namespace holds this server's keys (a job of
            several server groups, ``ps.server_group``); None: the job's own keys.
        lease_s: TTL of the server's etcd lease (replication).
        etcd_election_ms: The election timeout of the etcd members (``cluster.etcd_election_ms``;
            0: hogwild's own, :data:`~hogwild_plugins.ps.etcd_process.ELECTION_MS`): what the
            first timeout of a map write is sized from
            (:func:`~hogwild_plugins.ps.etcd_cas.write_retry_s`).
        nonfinite: ``ps.nonfinite``: refuse a write holding NaN or inf (``"refuse"``, the
            default), or apply it and count it (``"count"``).
        max_vectors: ``ps.max_vectors``: named vectors a shard holds at most.
        min_copies: ``ps.min_copies``: live in-sync copies a write needs (0: half the copies,
            rounded up); with fewer a bucket refuses writes (replication).
        direct_pulls: With one copy, answer a pull of a shard that has no write pending on the
            network thread (the default); False queues every pull behind its shard's update
            thread, as replicated servers do (``bench/figures/adam_fig9_ps.py`` measures both).
        direct_pushes: With one copy, apply a push of deltas on the network thread when its
            shard's update thread is idle and no write is pending for the shard (the default);
            False queues every push for the update threads
            (``bench/figures/adam_fig9_ps.py`` measures both).
    """

    job: str
    servers: tuple[str, ...]
    index: int = 0
    bind: str | None = None
    rule: str = _RULE
    lr: float = _LR
    momentum: float = _PS.momentum
    staleness_decay: float = _PS.staleness_decay
    max_staleness: int = _PS.max_staleness
    adagrad_eps: float = _PS.adagrad_eps
    shard_kib: int = _PS.shard_kib
    buckets: int = _PS.buckets
    threads: int = 0
    node: int | None = None
    store: str | None = None
    flush_s: float = _PS.flush_s
    keys: str | None = _PS.keys or None
    recv: str = "auto"
    ack: str = "queued"
    copies: int = ClusterConfig.copies
    etcd: str | None = ClusterConfig.etcd or None
    etcd_tls: str | None = ClusterConfig.etcd_tls or None
    etcd_group: int | None = None  # several server groups: this server's group's namespace
    lease_s: int = _PS.lease_s or DEFAULT_LEASE_S
    etcd_election_ms: int = ClusterConfig.etcd_election_ms
    nonfinite: str = _PS.nonfinite
    max_vectors: int = _PS.max_vectors
    min_copies: int = _PS.min_copies
    direct_pulls: bool = True
    direct_pushes: bool = True
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        job: str,
        servers: tuple[str, ...],
        index: int = 0,
        bind: str | None = None,
        rule: str | None = None,
        keys: str | None = None,
        copies: int | None = None,
        etcd: str | None = None,
        lease_s: int | None = None,
        **own,
    ) -> ServerOptions:
        """The options ``config`` gives one server of the job.

        Args:
            config: The job's config: ``[ps]``, ``cluster.copies``, ``cluster.etcd`` and
                ``cluster.etcd_election_ms``.
            job, servers, index, bind: This server's job and place in it.
            rule, keys, copies, etcd, lease_s: Values given on the command line, in place of
                the config's (``ps.rule``, ``ps.keys``, ``cluster.copies``, ``cluster.etcd``,
                ``ps.lease_s``); None, 0 or empty leaves the config's. A ``rule`` given with
                ``ps.lr = 0`` takes that rule's default step.
            own: The fields the config does not hold (``threads``, ``node``, ``store``,
                ``recv``, ``ack``, ``direct_pulls``, ``direct_pushes``).
        """
        ps = dataclasses.replace(config.ps, rule=rule) if rule else config.ps
        rule, lr = ps_update_rule(ps)
        return cls(
            job=job,
            servers=servers,
            index=index,
            bind=bind,
            rule=rule,
            lr=lr,
            momentum=ps.momentum,
            staleness_decay=ps.staleness_decay,
            max_staleness=ps.max_staleness,
            adagrad_eps=ps.adagrad_eps,
            shard_kib=ps.shard_kib,
            buckets=ps.buckets,
            flush_s=ps.flush_s,
            keys=keys or ps.keys or None,
            copies=copies or config.cluster.copies,
            etcd=etcd or config.cluster.etcd or None,
            etcd_tls=config.cluster.etcd_tls or None,
            etcd_group=etcd_group(config),
            lease_s=lease_s or ps.lease_s or DEFAULT_LEASE_S,
            etcd_election_ms=config.cluster.etcd_election_ms,
            nonfinite=ps.nonfinite,
            max_vectors=ps.max_vectors,
            min_copies=ps.min_copies,
            **own,
        )

    def check(self) -> None:
        """Refuse options no server can run with, naming the option and what it takes.

        Raises:
            HogwildError: An unknown rule, receive or acknowledgement mode, or treatment of
                non-finite values; an etcd election timeout out of range; an Adagrad epsilon
                float32 cannot hold; an index outside the server list; copies without etcd, or
                with receive pools.
        """
        from hogwild_plugins.ps import kernels
        from hogwild_plugins.ps.serving.receive_pool import RECV_MODES
        from hogwild_plugins.ps.serving.requests import NONFINITE_MODES

        from hogwild.config.checks import (
            FLOAT32_TINY,
            MAX_LEASE_S,
            etcd_election_out_of_range,
        )
        from hogwild.errors import HogwildError

        if self.rule not in kernels.RULES:
            raise HogwildError(f"ps.rule {self.rule!r}: expected one of {sorted(kernels.RULES)}")
        if not self.adagrad_eps >= FLOAT32_TINY:  # the Adagrad kernel divides by sqrt(g) + eps
            raise HogwildError(
                f"ps.adagrad_eps must be > 0 and representable in float32 "
                f"(>= {FLOAT32_TINY:.3g}), got {self.adagrad_eps}"
            )
        if (
            isinstance(self.lease_s, bool)
            or not isinstance(self.lease_s, int)
            or not (1 <= self.lease_s <= MAX_LEASE_S)
        ):
            raise HogwildError(
                f"lease_s (--lease-s, ps.lease_s) must be 1 to {MAX_LEASE_S} seconds, "
                f"got {self.lease_s!r}"
            )
        election_ms = self.etcd_election_ms
        if isinstance(election_ms, bool) or not isinstance(election_ms, int):
            raise HogwildError(
                f"cluster.etcd_election_ms must be a whole number of milliseconds, "
                f"got {election_ms!r}"
            )
        if (out_of_range := etcd_election_out_of_range(election_ms)) is not None:
            raise HogwildError(out_of_range)
        if self.nonfinite not in NONFINITE_MODES:
            raise HogwildError(
                f"ps.nonfinite = {self.nonfinite!r}: expected one of {NONFINITE_MODES}"
            )
        if self.recv not in RECV_MODES or self.ack not in ("applied", "queued"):
            raise HogwildError(f"recv {self.recv!r} / ack {self.ack!r}: unknown mode")
        if not 0 <= self.index < len(self.servers):
            raise HogwildError(
                f"server index {self.index} is not in the list of {len(self.servers)} servers"
            )
        if self.copies > 1 and not self.etcd:
            raise HogwildError(
                f"copies = {self.copies} needs etcd (ps.etcd HOST:PORT, or `hogwild cluster`, "
                "which starts one)"
            )
        if self.copies > 1 and self.recv == "pool":
            raise HogwildError(
                'recv = "pool" is not available with copies > 1: a primary forwards the frames '
                "it received to the copies after its own update may have freed a pool block"
            )
