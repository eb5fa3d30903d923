"""Which server group a worker group trains against and whether it synchronises it
(:class:`hogwild.cluster.group_sync.GroupSync`), for distributed Hogwild and the hybrid: the
driver's binding, one synchroniser per server group, none with one server group."""

from __future__ import annotations

import pytest

from hogwild.cluster.group_sync import GroupSync
from hogwild.config import load_config
from hogwild.config.topology import resolve_topology


def roles(**cluster) -> list[tuple[int, int]]:
    config = load_config(None).override({f"cluster.{k}": v for k, v in cluster.items()})
    topology = resolve_topology(config.cluster, config.ps.rule)
    syncs = [GroupSync(config, i) for i in range(topology.worker_groups)]
    return [(s.server_group, s.sync_every) for s in syncs]


@pytest.mark.parametrize("framework", ["hybrid", "hogwild"])
def test_the_first_worker_group_of_each_server_group_synchronises_it(framework):
    more = {"workers_per_group": 2} if framework == "hybrid" else {}
    bound = roles(framework=framework, worker_groups=4, server_groups=2, sync_every=300, **more)
    assert bound == [(0, 300), (0, 0), (1, 300), (1, 0)]  # worker groups in order, two each
    assert roles(framework=framework, worker_groups=2, server_groups=2, **more) == [
        (0, 10_000),  # the default cadence
        (1, 10_000),
    ]


def test_on_one_server_group_nobody_synchronises_and_nothing_is_opened():
    bound = roles(framework="hybrid", worker_groups=2, workers_per_group=2)
    assert bound == [(0, 0), (0, 0)]
    sync = GroupSync(load_config(None), 0)  # Downpour: one server group
    sync.open("job")  # nothing to open: no client, no connection attempted
    sync.when_due(1e9)
    assert sync.groups is None and sync.status() == {}
    sync.close()
