"""One cluster topology for every training framework (SINGA section 5.2), resolved without I/O.

SINGA describes a job as *worker groups* × workers per group and *server groups* × servers per
group: each worker group trains a whole model replica against one server group, worker groups run
asynchronously, and a server group holds a whole copy of the parameters. The known frameworks are
topologies of that kind:

============  ===============  ==================  ===============  ===============================
framework     worker groups    workers per group   server groups    optimizer (default; allowed)
============  ===============  ==================  ===============  ===============================
downpour      N (replicas)     W, Hogwild (Adam)   1                adagrad (sgd for N = 1); sgd
sandblaster   1                W, synchronous      1                lbfgs
allreduce     1                W, synchronous      1 of W servers   sgd; adagrad
hogwild       N >= 2           W, Hogwild          N (or N / k)     sgd; adagrad; sync_every
hybrid        N >= 2           W >= 2, synchron.   1 (or N / k)     sgd; adagrad
============  ===============  ==================  ===============  ===============================

**The keys.** ``[cluster]``'s ``worker_groups``, ``workers_per_group``, ``server_groups``,
``servers_per_group``, ``sync_every`` and ``optimizer`` are SINGA's; ``framework`` names one of the
rows above and fills in the keys left unset. Today's keys keep their meaning and their defaults:
``replicas`` is the number of worker groups, ``workers_per_replica`` the workers of each group,
``ps`` the servers of each server group. A new key at 0 (``""`` for the names) is unset and takes
today's key; a today's key at its default counts as unset when a framework or a new key says
otherwise (``cluster.replicas = 2`` is only a default), but one set away from its default must
agree with the new key and with the framework, or the config is rejected naming both. So every
existing config resolves to Downpour (one server group, Adam's Hogwild workers in each replica,
Adagrad on the servers across several replicas), which stays the default, and a resolved
topology's :meth:`JobTopology.cluster_overrides` writes today's keys back, so that a config
rewritten with them resolves to the same topology.

Adam's replicas are not SINGA's worker groups in one respect: Adam's workers inside a replica are
asynchronous (Hogwild on one arena), SINGA's synchronous. :attr:`JobTopology.within_group` says
which a framework uses: Downpour and distributed Hogwild keep Adam's Hogwild workers;
Sandblaster, AllReduce and the hybrid have synchronous workers.

:func:`resolve_topology` rejects what cannot work, saying why; ``hogwild cluster`` runs every
framework (:data:`BUILT`: downpour and distributed Hogwild as replica processes, several server
groups (:func:`split_groups`) synchronised through the ``hogwild.server_groups`` entry point;
sandblaster, allreduce and hybrid through the worker-group roles their ``hogwild.worker_groups``
entry points register, each with a coordinator, :data:`COORDINATED`), and
:func:`require_built` refuses the combinations that are not built (Adagrad in a coordinated
group). With several server groups and replicated servers
(``cluster.copies`` > 1) each group keeps its bucket map in an etcd namespace of its own
(:func:`etcd_group`): every group numbers its servers from 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hogwild.errors import ConfigError

__all__ = [
    "BUILT",
    "COORDINATED",
    "DEFAULT_SYNC_EVERY",
    "FRAMEWORKS",
    "OPTIMIZERS",
    "JobTopology",
    "TopologyError",
    "etcd_group",
    "require_built",
    "resolve_topology",
    "split_groups",
]

FRAMEWORKS = ("downpour", "sandblaster", "allreduce", "hogwild", "hybrid")
OPTIMIZERS = ("sgd", "adagrad", "lbfgs")
BUILT = FRAMEWORKS  # every framework, the hybrid on one server group or several
COORDINATED = ("sandblaster", "allreduce", "hybrid")  # a role per group, a coordinator steps
DEFAULT_SYNC_EVERY = 10_000  # examples a worker group trains between its server group's syncs

# Today's keys (at their ClusterConfig defaults) behind the new ones.
_OLD = {"worker_groups": "replicas", "workers_per_group": "workers_per_replica"}
_OLD["servers_per_group"] = "ps"
_OLD_DEFAULTS = {"replicas": 2, "workers_per_replica": 1, "ps": 1}
_RULE_OPTIMIZER = {"sgd": "sgd", "momentum": "sgd", "staleness": "sgd", "adagrad": "adagrad"}


class TopologyError(ConfigError):
    """A ``[cluster]`` topology that cannot work (the message says why)."""


@dataclass(frozen=True)
class JobTopology:
    """A resolved topology (see the module docstring).

    Attributes:
        framework: One of :data:`FRAMEWORKS`.
        worker_groups: Model replicas, asynchronous to each other.
        workers_per_group: Workers of each group.
        server_groups: Whole copies of the parameters (each serves ``worker_groups /
            server_groups`` worker groups).
        servers_per_group: Servers a server group's shards are spread over.
        sync_every: Examples a worker group trains between its server group's synchronisations
            with the others (0: one server group, nothing to synchronise).
        optimizer: ``sgd`` or ``adagrad`` (the servers' rule), or ``lbfgs`` (Sandblaster's
            coordinator).
        within_group: ``"hogwild"`` (Adam's asynchronous workers on one arena) or
            ``"synchronous"`` (SINGA's).
    """

    framework: str
    worker_groups: int
    workers_per_group: int
    server_groups: int
    servers_per_group: int
    sync_every: int
    optimizer: str
    within_group: str

    @property
    def coordinated(self) -> bool:
        """One synchronous worker group whose coordinator moves the parameters through shard
        operations (a ``hogwild.worker_groups`` role), not the servers' rule."""
        return self.framework in COORDINATED

    @property
    def servers(self) -> int:
        """Parameter servers in all."""
        return self.server_groups * self.servers_per_group

    @property
    def workers(self) -> int:
        """Workers in all."""
        return self.worker_groups * self.workers_per_group

    def describe(self) -> str:
        """One line: the framework, its groups and optimizer."""
        sync = f", synchronised every {self.sync_every:,} examples" if self.sync_every else ""
        return (
            f"{self.framework}: {self.worker_groups} worker group(s) x {self.workers_per_group} "
            f"{self.within_group} worker(s), {self.server_groups} server group(s) x "
            f"{self.servers_per_group} server(s){sync}, {self.optimizer}"
        )

    def cluster_overrides(self) -> dict[str, int]:
        """Today's keys as this topology says (``replicas``, ``workers_per_replica``, ``ps``)."""
        return {
            "cluster.replicas": self.worker_groups,
            "cluster.workers_per_replica": self.workers_per_group,
            "cluster.ps": self.servers_per_group,
        }

    def server_rule(self, ps_rule: str) -> str:
        """The servers' update rule: ``ps.rule``, or the optimizer's when it is ``"auto"``
        (plain SGD for ``lbfgs``, whose vectors bypass the rule)."""
        if ps_rule != "auto":
            return ps_rule
        return self.optimizer if self.optimizer in ("sgd", "adagrad") else "sgd"


def resolve_topology(cluster, ps_rule: str = "auto") -> JobTopology:
    """The topology ``cluster`` (a :class:`~hogwild.config.ClusterConfig`) describes.

    Args:
        cluster: The ``[cluster]`` section.
        ps_rule: ``ps.rule``, which must agree with the optimizer.

    Raises:
        TopologyError: A topology that cannot work, or keys that say different things.
    """
    framework = cluster.framework
    if framework not in ("", *FRAMEWORKS):
        raise TopologyError(
            f'cluster.framework must be one of {", ".join(FRAMEWORKS)} or "" (the keys decide); '
            f"got {framework!r}"
        )
    if cluster.optimizer not in ("", *OPTIMIZERS):
        raise TopologyError(
            f'cluster.optimizer must be one of {", ".join(OPTIMIZERS)} or "" (the framework\'s '
            f"default); got {cluster.optimizer!r}"
        )
    for key in ("worker_groups", "workers_per_group", "server_groups", "servers_per_group"):
        if getattr(cluster, key) < 0:
            value = getattr(cluster, key)
            raise TopologyError(f"cluster.{key} must be >= 0 (0: unset), got {value}")
    if cluster.sync_every < 0:
        raise TopologyError(
            f"cluster.sync_every must be >= 0 (examples; 0: unset), got {cluster.sync_every}"
        )
    given, names = _given(cluster)
    optimizer = cluster.optimizer or None
    if optimizer == "lbfgs" and given["worker_groups"] not in (None, 1):
        raise TopologyError(
            f"cluster.optimizer = 'lbfgs' with {names['worker_groups']} = "
            f"{given['worker_groups']}: worker groups are asynchronous, and L-BFGS needs each "
            "batch's whole gradient at one point; L-BFGS runs on one synchronous worker group "
            "(framework 'sandblaster', its replicas the group's workers: workers_per_group)"
        )
    if not framework:
        framework = _infer(given, optimizer)
    topology = _FILL[framework](given, names, optimizer, ps_rule)
    _check(topology, cluster, names, ps_rule)
    return topology


def require_built(topology: JobTopology) -> None:
    """Refuse a topology ``hogwild cluster`` cannot run yet, naming what is not built.

    Replicated servers (``copies`` > 1) replicate the named pushes and vector operations that
    L-BFGS and the server groups' synchronisation use; with several server groups each group's
    replication keys live in a namespace of its own (:func:`etcd_group`), so any topology runs
    with copies.

    Raises:
        ConfigError: Adagrad with AllReduce or a hybrid.
    """
    name = f"cluster.framework = {topology.framework!r} ({topology.describe()})"
    if topology.framework in ("allreduce", "hybrid") and topology.optimizer != "sgd":
        raise ConfigError(
            f"{name} is a valid topology but hogwild cluster does not run it yet: not built: "
            "Adagrad through the shards' vector operations (a group's coordinator steps with "
            "axpy); use cluster.optimizer = 'sgd'"
        )


def etcd_group(config) -> int | None:
    """The server group whose etcd namespace holds a role's replication keys (bucket map,
    members): ``ps.server_group`` in a job of several server groups, where every group numbers
    its servers and buckets from 0; None in a job of one, whose keys are the job's own."""
    return config.ps.server_group if config.cluster.server_groups > 1 else None


def replica_starts_workers(config) -> bool:
    """Whether a replica role of the job starts worker processes from a forkserver (so that a
    workers' forkserver forked early saves its first gang a fresh interpreter): forkserver being
    the job's start method, and the framework not coordinated (Sandblaster, AllReduce, hybrid:
    their group's members are roles of their own). The local launcher and a replica started as
    a fresh interpreter both ask this."""
    coordinated = resolve_topology(config.cluster, config.ps.rule).coordinated
    return config.train.start_method == "forkserver" and not coordinated


def split_groups(servers: Sequence[str], per_group: int) -> list[list[str]]:
    """``servers`` (every server group's, group after group) cut into groups of ``per_group``.

    Raises:
        ConfigError: The list does not divide into groups of that size.
    """
    if per_group < 1 or not servers or len(servers) % per_group:
        raise ConfigError(
            f"cluster.group_servers: {len(servers)} server(s) do not split into server groups "
            f"of {per_group} (cluster.servers_per_group); expected a multiple of it"
        )
    return [list(servers[i : i + per_group]) for i in range(0, len(servers), per_group)]


# -- resolution ---------------------------------------------------------------------------------


def _given(cluster) -> tuple[dict, dict]:
    """Each topology key as given (None: unset), and the name of the key that gave it."""
    given: dict = {"server_groups": cluster.server_groups or None}
    given["sync_every"] = cluster.sync_every or None
    names = {"server_groups": "cluster.server_groups", "sync_every": "cluster.sync_every"}
    for new, old in _OLD.items():
        value, before = getattr(cluster, new), getattr(cluster, old)
        moved = before != _OLD_DEFAULTS[old]
        if value and moved and value != before:
            raise TopologyError(
                f"cluster.{new} = {value} and cluster.{old} = {before} say different things "
                f"(cluster.{old} is the {new.replace('_', ' ')}); set one of them"
            )
        given[new] = value or (before if moved else None)
        names[new] = f"cluster.{new}" if value else f"cluster.{old}"
    return given, names


def _infer(given: dict, optimizer: str | None) -> str:
    """The framework the keys describe when ``cluster.framework`` is ``""``."""
    if optimizer == "lbfgs":
        return "sandblaster"
    if (given["server_groups"] or 1) > 1:
        return "hogwild"
    return "downpour"


def _fixed(framework: str, key: str, want: int, given: dict, names: dict, why: str) -> int:
    """``want``, unless the key was given otherwise (then the config is rejected)."""
    if given[key] not in (None, want):
        raise TopologyError(
            f"cluster.framework = {framework!r} has {key} = {want} ({why}); "
            f"{names[key]} = {given[key]} says otherwise: remove it or choose another framework"
        )
    return want


def _optimizer(framework: str, optimizer, allowed: tuple, default: str, ps_rule: str) -> str:
    """The optimizer given, else the one ``ps.rule`` names, else the framework's default."""
    if optimizer is None:
        named = _RULE_OPTIMIZER.get(ps_rule)
        return named if named in allowed else default
    if optimizer in allowed:
        return optimizer
    if framework == "sandblaster":
        why = (
            "Sandblaster here is DistBelief's batch L-BFGS coordinator; synchronous SGD on one "
            "worker group is framework 'allreduce'"
        )
    elif optimizer == "lbfgs":
        why = (
            "L-BFGS needs one synchronous worker group and runs through Sandblaster's "
            "coordinator: framework 'sandblaster'"
        )
    else:
        why = f"it runs {' or '.join(allowed)}"
    raise TopologyError(f"cluster.optimizer = {optimizer!r} with framework {framework!r}: {why}")


def _downpour(given, names, optimizer, ps_rule) -> JobTopology:
    groups = given["worker_groups"] or _OLD_DEFAULTS["replicas"]
    server_groups = _fixed("downpour", "server_groups", 1, given, names, "one global server group")
    default = "adagrad" if groups > 1 else "sgd"  # ps.rule = "auto" before topologies
    return JobTopology(
        "downpour", groups, given["workers_per_group"] or 1, server_groups,
        given["servers_per_group"] or 1, given["sync_every"] or 0,
        _optimizer("downpour", optimizer, ("sgd", "adagrad"), default, ps_rule), "hogwild",
    )  # fmt: skip


def _sandblaster(given, names, optimizer, ps_rule) -> JobTopology:
    why = "its replicas are the workers of one synchronous group: cluster.workers_per_group"
    groups = _fixed("sandblaster", "worker_groups", 1, given, names, why)
    server_groups = _fixed("sandblaster", "server_groups", 1, given, names, "one server group")
    return JobTopology(
        "sandblaster", groups, given["workers_per_group"] or 1, server_groups,
        given["servers_per_group"] or 1, given["sync_every"] or 0,
        _optimizer("sandblaster", optimizer, ("lbfgs",), "lbfgs", ps_rule), "synchronous",
    )  # fmt: skip


def _allreduce(given, names, optimizer, ps_rule) -> JobTopology:
    groups = _fixed("allreduce", "worker_groups", 1, given, names, "one synchronous group")
    server_groups = _fixed("allreduce", "server_groups", 1, given, names, "one server group")
    workers = given["workers_per_group"] or 1
    why = "every worker is bound to a server on its node"
    servers = _fixed("allreduce", "servers_per_group", workers, given, names, why)
    return JobTopology(
        "allreduce", groups, workers, server_groups, servers, given["sync_every"] or 0,
        _optimizer("allreduce", optimizer, ("sgd", "adagrad"), "sgd", ps_rule), "synchronous",
    )  # fmt: skip


def _hogwild(given, names, optimizer, ps_rule) -> JobTopology:
    groups = given["worker_groups"] or _OLD_DEFAULTS["replicas"]
    server_groups = given["server_groups"] or groups
    _fit(server_groups, groups)
    if server_groups < 2:
        raise TopologyError(
            f"cluster.framework = 'hogwild' (distributed Hogwild) with {groups} worker group(s) "
            f"and {server_groups} server group: it needs two or more of each, every worker "
            "group with a server group on its node; one server group is 'downpour'"
        )
    return JobTopology(
        "hogwild", groups, given["workers_per_group"] or 1, server_groups,
        given["servers_per_group"] or 1, given["sync_every"] or DEFAULT_SYNC_EVERY,
        _optimizer("hogwild", optimizer, ("sgd", "adagrad"), "sgd", ps_rule), "hogwild",
    )  # fmt: skip


def _hybrid(given, names, optimizer, ps_rule) -> JobTopology:
    groups = given["worker_groups"] or _OLD_DEFAULTS["replicas"]
    workers = given["workers_per_group"] or 2
    if groups < 2 or workers < 2:
        raise TopologyError(
            f"cluster.framework = 'hybrid' with {groups} worker group(s) of {workers} "
            "worker(s): a hybrid has two or more asynchronous worker groups, each of two or "
            "more synchronous workers (one group is 'sandblaster' or 'allreduce'; one worker "
            "per group is 'downpour')"
        )
    server_groups = given["server_groups"] or 1
    return JobTopology(
        "hybrid", groups, workers, server_groups, given["servers_per_group"] or 1,
        given["sync_every"] or (DEFAULT_SYNC_EVERY if server_groups > 1 else 0),
        _optimizer("hybrid", optimizer, ("sgd", "adagrad"), "sgd", ps_rule), "synchronous",
    )  # fmt: skip


_FILL = {
    "downpour": _downpour,
    "sandblaster": _sandblaster,
    "allreduce": _allreduce,
    "hogwild": _hogwild,
    "hybrid": _hybrid,
}


def _fit(server_groups: int, worker_groups: int) -> None:
    """Every server group serves the same number (one or more) of worker groups."""
    if server_groups > worker_groups:
        raise TopologyError(
            f"{server_groups} server groups for {worker_groups} worker group(s): each worker "
            "group trains against one server group, so a server group beyond the worker groups "
            "would hold a copy of the parameters that nobody trains"
        )
    if worker_groups % server_groups:
        raise TopologyError(
            f"{worker_groups} worker groups do not split evenly over {server_groups} server "
            "groups (each server group serves the same number of worker groups)"
        )


def _check(t: JobTopology, cluster, names: dict, ps_rule: str) -> None:
    """What no framework can work with."""
    _fit(t.server_groups, t.worker_groups)
    if t.server_groups == 1 and t.sync_every:
        raise TopologyError(
            f"cluster.sync_every = {t.sync_every} does nothing with one server group (it is "
            "how often several server groups synchronise: framework 'hogwild'); remove it"
        )
    if t.optimizer == "lbfgs":
        if ps_rule != "auto":
            raise TopologyError(
                f"ps.rule = {ps_rule!r} does nothing with cluster.optimizer = 'lbfgs': the "
                "coordinator moves the parameters through vector operations, never the servers' "
                "rule; remove it"
            )
        if cluster.warm_start:
            raise TopologyError(
                f"cluster.warm_start = {cluster.warm_start} with cluster.optimizer = 'lbfgs': "
                "a warm start lets one replica train alone before the others join, and "
                "Sandblaster has one worker group; remove it"
            )
    elif ps_rule in _RULE_OPTIMIZER and _RULE_OPTIMIZER[ps_rule] != t.optimizer:
        raise TopologyError(
            f"ps.rule = {ps_rule!r} and cluster.optimizer = {t.optimizer!r} say different "
            f"things (the servers' rule is the optimizer); set one of them"
        )
    if cluster.copies > t.servers_per_group:
        raise TopologyError(
            f"cluster.copies = {cluster.copies}: expected 1 (no replication) up to the servers "
            f"of a server group ({names['servers_per_group']}: {t.servers_per_group}): the "
            "copies of a bucket live on different servers"
        )
