"""What a partitioned cluster replica relies on, without processes.

Two exchangers that own disjoint ranges of one shared copy (two partitions' rows of one arena)
push only their own progress home and merge only their own rows back: another partition's rows
are never overwritten by a pull. A cluster job plans one role per partitioned replica asking for
its K CPUs on one node (the local and Ray launchers both read it), and refuses what partitioned
replicas cannot run, naming the setting. (The Fig. 10 benchmark's wide-model verdict is
``tests/unit/test_bench_fig10_wide.py``'s.)
"""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.cluster.partitioned import check_partitioned_job
from hogwild.cluster.roles import plan_roles, replica_cpus
from hogwild.config import load_config
from hogwild.config.topology import resolve_topology
from hogwild.errors import ConfigError
from hogwild.store.exchange import Exchanger
from hogwild.store.replicate import ArenaHome


def _exchanger(home, copy, base, owned):
    return Exchanger(
        ArenaHome(home), copy, base, n_push=2, n_fetch=2, unit=1,
        owned=np.array(owned, dtype=np.int64), name="partition",
    )  # fmt: skip


def test_exchangers_of_owned_ranges_push_and_pull_only_their_rows():
    n = 12
    home = np.arange(n, dtype=np.float32)
    copy, base = home.copy(), home.copy()
    first = _exchanger(home, copy, base, [(0, 3), (6, 9)])
    second = _exchanger(home, copy, base, [(3, 6), (9, 12)])
    try:
        copy[[0, 7]] += 1.0  # the first partition's own rows
        copy[[4, 10]] -= 2.0  # the second's
        home[5] += 10.0  # another replica's progress, in the second's rows
        first.trained(2, None)
        first.finish()
        np.testing.assert_array_equal(home[[0, 7]], [1.0, 8.0])  # the first's progress is home
        np.testing.assert_array_equal(home[[4, 10]], [4.0, 10.0])  # not the second's yet
        assert copy[5] == 5.0  # the first never merges a row it does not own
        second.trained(2, None)
        second.finish()
        np.testing.assert_array_equal(home[[4, 10]], [2.0, 8.0])
        expected = np.arange(n, dtype=np.float32)
        expected[[0, 7]] += 1.0
        expected[[4, 10]] -= 2.0
        expected[5] += 10.0
        np.testing.assert_array_equal(home, expected)
        first.trained(2, None)  # a push and a pull of nothing new: the rows stay as they are
        first.finish()
        second.trained(2, None)
        second.finish()
        np.testing.assert_array_equal(copy, expected)  # each pulled its own rows, 5 included
        np.testing.assert_array_equal(base, expected)
    finally:
        first.close()
        second.close()


def test_owned_ranges_move_deltas_only():
    home = np.zeros(4, dtype=np.float32)
    with pytest.raises(ValueError, match="deltas only"):
        Exchanger(
            ArenaHome(home), home.copy(), home.copy(), 1, 1, 1, layers=(object(),),
            buffers=(np.zeros(8, np.float32), np.zeros(8, np.float32)),
            owned=np.array([[0, 2]], dtype=np.int64),
        )  # fmt: skip


def test_a_partitioned_replica_asks_for_its_partitions_cpus_on_one_node():
    config = load_config(None, {"model.partitions": 3, "cluster.replicas": 2})
    assert replica_cpus(config) == 3
    plan = plan_roles(config, "job.json", "mnist", "127.0.0.1")
    assert [spec.cpus for spec in plan.replicas] == [3, 3]
    assert all(spec.group for spec in plan.replicas)  # one placement group: one node
    assert replica_cpus(load_config(None, {"cluster.workers_per_replica": 2})) == 2


@pytest.mark.parametrize(
    "overrides, data_servers, named",
    [
        ({"cluster.framework": "sandblaster"}, 0, "Downpour"),
        ({}, 1, "cluster.data_servers = 0"),
        ({"train.batch": 8}, 0, "train.batch = 1"),
        (
            {"model.partition_hosts": ["127.0.0.1:7001", "127.0.0.1:7002"]},
            0,
            "places each replica's partitions itself",
        ),
        ({"cluster.partition_placement": "spread"}, 0, "set cluster.launcher = 'ray'"),
        (
            {"cluster.partition_placement": "spread", "cluster.launcher": "ray"},
            0,
            "set cluster.host to this host's address beyond loopback",
        ),
        (
            {
                "cluster.partition_placement": "spread",
                "cluster.launcher": "ray",
                "cluster.host": "10.0.0.1",
                "cluster.copies": 3,
                "cluster.ps": 3,
                "cluster.etcd": "job",
            },
            0,
            "runs with cluster.copies = 1",
        ),  # fmt: skip
    ],
)
def test_what_partitioned_replicas_cannot_run_is_refused_by_name(overrides, data_servers, named):
    config = load_config(None, {"model.partitions": 2, **overrides})
    topology = resolve_topology(config.cluster, config.ps.rule)
    with pytest.raises(ConfigError, match=named):
        check_partitioned_job(config, topology, data_servers)


def test_a_cluster_job_refuses_a_smooth_rate_it_would_not_apply():
    from hogwild.cluster.driver import ClusterDriver

    with pytest.raises(ConfigError, match="optim.smooth: a cluster job trains each epoch"):
        ClusterDriver(load_config(None, {"optim.smooth": True}), None)


def test_a_spread_replica_asks_a_cpu_on_each_of_k_nodes_and_names_its_followers():
    from hogwild_plugins.ray.spread import bundles, follower_argv, follower_specs, partition_hosts

    from hogwild.cluster.partitioned import follower_role

    config = load_config(None, {"model.partitions": 3, "cluster.replicas": 2})
    replica = plan_roles(config, "job.json", "mnist", "10.0.0.1").replicas[1]
    assert bundles(replica, 3, spread=True) == ([{"CPU": 1}] * 3, "STRICT_SPREAD")
    assert bundles(replica, 3, spread=False) == ([{"CPU": 3}], "STRICT_PACK")
    assert [f.name for f in follower_specs(replica, 3)] == ["follower 4", "follower 5"]
    assert follower_role(1, 3, 2) == "follower 5"  # whose messages replica 1's link takes
    argv = follower_argv("10.0.0.2:5701", "/run/keys", 300.0, "replica 1")
    assert argv[:3] == ("partition-host", "--bind", "10.0.0.2:5701")
    assert argv[-4:] == ("--leader-role", "replica 1", "--keys", "/run/keys")
    override = partition_hosts("10.0.0.1:5700", ["10.0.0.2:5701", "10.0.0.3:5702"])
    assert override == "--model.partition_hosts=10.0.0.1:5700,10.0.0.2:5701,10.0.0.3:5702"


def test_a_partition_placement_other_than_pack_or_spread_is_refused_by_name():
    with pytest.raises(ConfigError, match="cluster.partition_placement must be one of pack"):
        load_config(None, {"cluster.partition_placement": "scatter"})


def test_a_follower_rebuilds_where_its_servers_are_from_the_jobs_config_not_the_wire():
    from hogwild.model.network import build_network
    from hogwild.partition.follower import FollowerHost

    config = load_config(None, {"ps.servers": ["10.0.0.7:5500"], "ps.job": "j", "ps.token": 3})
    network = build_network(config.model)
    host = FollowerHost("127.0.0.1:1", None, print)
    home = host._home({"store": "ps"}, config, network)
    assert home["values"]["servers"] == ["10.0.0.7:5500"] and home["values"]["token"] == 3
    assert home["n_push"] >= 1 and home["n_fetch"] >= 1
    forged = {"store": "ps", "values": {"servers": ["10.9.9.9:1"], "etcd": "http://x:2379"}}
    for bad in (forged, {"store": "one"}, {"store": 3}, ["ps"]):
        with pytest.raises(ConfigError, match="the leader's setup: home"):
            host._home(bad, config, network)
