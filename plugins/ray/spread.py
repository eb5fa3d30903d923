"""A partitioned replica spread over Ray nodes (``cluster.partition_placement = "spread"``).

Adam's Fig. 11 replica is several machines, each holding a vertical slice of every layer. With
``model.partitions = K`` and ``spread``, the Ray launcher gives a replica one placement group of
K one-CPU bundles, ``STRICT_SPREAD`` (each bundle on a node of its own): the replica's role
(the *leader*, ``hogwild cluster replica``: partition 0, the feeder, the softmax, the replica's
portions) on bundle 0, and on each other bundle a *follower host*, ``hogwild partition-host``,
running one partition (:mod:`hogwild.partition.follower`). The leader is told where its
followers listen (``model.partition_hosts``: its own link address first, then theirs, each a
port free on its node), and the blocks of neurons cross between them as CURVE-keyed ZeroMQ
frames (:mod:`hogwild.partition.link`), each follower exchanging its partition's rows with the
parameter servers itself.

The followers are no roles of the driver's: the launcher keeps them beside their replica, stops
them with it, and starts them again with it. A follower that dies, or whose node is lost, takes
its replica down (the launcher kills the replica's processes, and the leader would find the
follower silent anyway), and the driver restarts the replica as for any replica: the launcher
then places the whole replica anew, its followers with it. This module only decides names,
bundles and command lines (no I/O); the launcher carries them out.
"""

from __future__ import annotations

from hogwild.cluster.partitioned import FOLLOWER, FOLLOWER_STOP_LINE, follower_role
from hogwild.cluster.roles import RoleSpec

__all__ = [
    "FOLLOWER",
    "FOLLOWER_STOP_LINE",
    "bundles",
    "follower_argv",
    "follower_specs",
    "partition_hosts",
    "spreads",
]


def spreads(config) -> bool:
    """Whether the job's replicas are spread over nodes, one partition a node."""
    return config.model.partitions > 1 and config.cluster.partition_placement == "spread"


def bundles(spec: RoleSpec, k: int, spread: bool) -> tuple[list[dict], str]:
    """A replica's placement group: its bundles and strategy (``spread``: a CPU on each of K
    nodes; else all its CPUs on one node)."""
    if spread and spec.kind == "replica":
        return [{"CPU": 1}] * k, "STRICT_SPREAD"
    return [{"CPU": spec.cpus}], "STRICT_PACK"


def follower_specs(replica: RoleSpec, k: int) -> list[RoleSpec]:
    """The follower hosts of ``replica`` (bundles 1 to K - 1), before their addresses are
    known. Follower ``g`` of replica ``i`` is ``follower i*K + g``
    (:func:`~hogwild.cluster.partitioned.follower_role`, which its leader's link expects)."""
    specs = [RoleSpec(FOLLOWER, replica.index * k + g, (), cpus=1) for g in range(1, k)]
    assert all(s.name == follower_role(replica.index, k, g) for g, s in enumerate(specs, 1))
    return specs


def follower_argv(address: str, keys: str, wait_s: float, leader: str) -> tuple[str, ...]:
    """``hogwild partition-host`` listening at ``address`` with the job's keys, waiting up to
    ``wait_s`` for its leader, whose roster role is ``leader`` (the only one it takes a SETUP
    from)."""
    argv = ("partition-host", "--bind", address, "--wait-s", f"{wait_s:g}")
    argv = (*argv, "--leader-role", leader)
    return (*argv, "--keys", keys) if keys else argv


def partition_hosts(leader: str, followers: list[str]) -> str:
    """The leader's ``model.partition_hosts`` override: its own link address, then its
    followers' (partition g on follower g)."""
    return f"--model.partition_hosts={','.join([leader, *followers])}"
