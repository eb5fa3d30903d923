"""The cluster topology (SINGA section 5.2): every framework resolves, every rejection says why.

:func:`hogwild.config.topology.resolve_topology` is pure: these tests give it ``[cluster]``
sections (and ``ps.rule``) and read the :class:`JobTopology` or the error. The config tests at the
end check that the bundled config still resolves to Adam's Downpour and that a config rejects a
topology when it is loaded.
"""

from __future__ import annotations

import pytest

from hogwild.config import ClusterConfig, load_config
from hogwild.config.topology import (
    BUILT,
    DEFAULT_SYNC_EVERY,
    FRAMEWORKS,
    JobTopology,
    TopologyError,
    etcd_group,
    require_built,
    resolve_topology,
)
from hogwild.errors import ConfigError


def resolve(ps_rule: str = "auto", **cluster) -> JobTopology:
    return resolve_topology(ClusterConfig(**cluster), ps_rule)


def rejected(ps_rule: str = "auto", **cluster) -> str:
    with pytest.raises(TopologyError) as caught:
        resolve(ps_rule, **cluster)
    return str(caught.value)


def same_after_rewrite(topology: JobTopology, ps_rule: str = "auto", **cluster) -> bool:
    """Today's keys written back from the topology resolve to the same topology."""
    rewritten = {k.removeprefix("cluster."): v for k, v in topology.cluster_overrides().items()}
    return resolve(ps_rule, **{**cluster, **rewritten}) == topology


# -- every framework ------------------------------------------------------------------------


def test_the_defaults_are_adams_downpour_with_adagrad():
    t = resolve()
    assert t == JobTopology("downpour", 2, 1, 1, 1, 0, "adagrad", "hogwild")
    assert t.servers == 1 and t.workers == 2
    assert same_after_rewrite(t)


@pytest.mark.parametrize(
    ("cluster", "want"),
    [
        # today's keys: replicas are worker groups, workers_per_replica workers per group, ps
        # the servers of the one server group; one replica trains plain SGD through the servers
        ({"replicas": 4, "workers_per_replica": 2, "ps": 3}, (4, 2, 1, 3, "adagrad")),
        ({"replicas": 1}, (1, 1, 1, 1, "sgd")),
        # the new keys say the same
        (
            {"worker_groups": 4, "workers_per_group": 2, "servers_per_group": 3},
            (4, 2, 1, 3, "adagrad"),
        ),
        ({"framework": "downpour", "worker_groups": 3, "optimizer": "sgd"}, (3, 1, 1, 1, "sgd")),
        # a new key agreeing with today's key set away from its default
        ({"replicas": 3, "worker_groups": 3}, (3, 1, 1, 1, "adagrad")),
    ],
)
def test_downpour(cluster, want):
    t = resolve(**cluster)
    assert t.framework == "downpour" and t.within_group == "hogwild" and t.sync_every == 0
    assert (t.worker_groups, t.workers_per_group, t.server_groups, t.servers_per_group) == want[:4]
    assert t.optimizer == want[4]
    assert same_after_rewrite(t, **cluster)


@pytest.mark.parametrize(
    ("ps_rule", "optimizer"),
    [("sgd", "sgd"), ("momentum", "sgd"), ("staleness", "sgd"), ("adagrad", "adagrad")],
)
def test_the_servers_rule_names_the_optimizer_and_stays_the_servers_rule(ps_rule, optimizer):
    t = resolve(ps_rule)
    assert t.optimizer == optimizer and t.server_rule(ps_rule) == ps_rule
    assert resolve(optimizer="sgd").server_rule("auto") == "sgd"
    assert resolve().server_rule("auto") == "adagrad"


@pytest.mark.parametrize(
    "cluster",
    [
        {"framework": "sandblaster"},
        {"framework": "sandblaster", "workers_per_group": 3, "servers_per_group": 2},
        {"optimizer": "lbfgs", "workers_per_replica": 3, "ps": 2},  # inferred from lbfgs
        {"framework": "sandblaster", "replicas": 1, "optimizer": "lbfgs"},
    ],
)
def test_sandblaster_is_one_synchronous_group_running_lbfgs(cluster):
    t = resolve(**cluster)
    assert t.framework == "sandblaster" and t.optimizer == "lbfgs"
    assert t.worker_groups == t.server_groups == 1 and t.within_group == "synchronous"
    assert t.workers_per_group == cluster.get(
        "workers_per_group", cluster.get("workers_per_replica", 1)
    )
    assert t.server_rule("auto") == "sgd"  # the vectors bypass the rule; any will do
    assert same_after_rewrite(t, **cluster)


def test_allreduce_binds_a_server_to_every_worker():
    t = resolve(framework="allreduce", workers_per_group=4)
    assert t == JobTopology("allreduce", 1, 4, 1, 4, 0, "sgd", "synchronous")
    assert resolve(framework="allreduce", workers_per_group=4, servers_per_group=4) == t
    assert same_after_rewrite(t, framework="allreduce", workers_per_group=4)


def test_distributed_hogwild_has_a_server_group_per_worker_group():
    t = resolve(framework="hogwild", worker_groups=4)
    assert t == JobTopology("hogwild", 4, 1, 4, 1, DEFAULT_SYNC_EVERY, "sgd", "hogwild")
    # inferred from several server groups; worker groups may share them evenly
    t = resolve(worker_groups=4, server_groups=2, sync_every=500)
    assert (t.framework, t.server_groups, t.sync_every) == ("hogwild", 2, 500)
    assert same_after_rewrite(t, worker_groups=4, server_groups=2, sync_every=500)


def test_hybrid_has_asynchronous_groups_of_synchronous_workers():
    t = resolve(framework="hybrid")
    assert t == JobTopology("hybrid", 2, 2, 1, 1, 0, "sgd", "synchronous")
    t = resolve(framework="hybrid", worker_groups=4, workers_per_group=3, server_groups=2)
    assert (t.server_groups, t.sync_every) == (2, DEFAULT_SYNC_EVERY)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_framework_is_built_on_unreplicated_servers(framework):
    assert framework in BUILT
    require_built(resolve(framework=framework))


def test_replicated_servers_run_lbfgs_and_every_asynchronous_framework():
    # the servers replicate the named pushes and vector operations L-BFGS keeps its history in
    t = resolve(framework="sandblaster", ps=3, copies=3)
    assert t.optimizer == "lbfgs"
    require_built(t)
    require_built(resolve(framework="downpour", servers_per_group=3))
    # several server groups with copies: each group's replication keys in a namespace of its
    # own (etcd_group); that they run is the end-to-end tests' (tests/cluster/test_frameworks.py)
    require_built(resolve(framework="hogwild", servers_per_group=3))


def test_a_roles_etcd_namespace_is_its_server_group_only_with_several():
    one = load_config(None).override({"ps.server_group": 0})
    assert etcd_group(one) is None  # a job of one server group: the job's own keys
    several = load_config(None).override({"cluster.server_groups": 2, "ps.server_group": 1})
    assert etcd_group(several) == 1
    with pytest.raises(ConfigError, match="ps.server_group must be 0 to cluster.server_groups"):
        load_config(None).override({"cluster.server_groups": 2, "ps.server_group": 2})
    with pytest.raises(ConfigError, match="ps.server_group must be 0 to"):
        load_config(None).override({"ps.server_group": 1})  # one server group: only 0


def test_the_coordinated_frameworks_run_sgd_only():
    coordinated = [f for f in FRAMEWORKS if resolve(framework=f).coordinated]
    assert coordinated == ["sandblaster", "allreduce", "hybrid"]
    for framework in ("allreduce", "hybrid"):
        t = resolve(framework=framework, optimizer="adagrad")
        with pytest.raises(ConfigError, match="not built: Adagrad through the shards' vector"):
            require_built(t)
    # a hybrid on several server groups: each pair of synchronous groups on its own server group
    require_built(resolve(framework="hybrid", worker_groups=4, server_groups=2))


# -- every rejection ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cluster", "ps_rule", "says"),
    [
        ({"framework": "singa"}, "auto", "cluster.framework must be one of"),
        ({"optimizer": "adam"}, "auto", "cluster.optimizer must be one of"),
        ({"worker_groups": -1}, "auto", "cluster.worker_groups must be >= 0"),
        ({"sync_every": -5}, "auto", "cluster.sync_every must be >= 0"),
        # more server groups than worker groups, or an uneven split
        ({"server_groups": 3}, "auto", "3 server groups for 2 worker group"),
        ({"framework": "hogwild", "worker_groups": 2, "server_groups": 4}, "auto", "nobody trains"),
        ({"worker_groups": 3, "server_groups": 2}, "auto", "do not split evenly"),
        # L-BFGS with several asynchronous worker groups, whichever key says so
        ({"optimizer": "lbfgs", "worker_groups": 3}, "auto", "worker groups are asynchronous"),
        ({"optimizer": "lbfgs", "replicas": 4}, "auto", "cluster.replicas = 4: worker groups"),
        ({"framework": "downpour", "optimizer": "lbfgs"}, "auto", "framework 'sandblaster'"),
        ({"framework": "hybrid", "optimizer": "lbfgs"}, "auto", "framework 'sandblaster'"),
        ({"framework": "allreduce", "optimizer": "lbfgs"}, "auto", "framework 'sandblaster'"),
        ({"framework": "sandblaster", "optimizer": "sgd"}, "auto", "is framework 'allreduce'"),
        # a framework that conflicts with explicit keys
        (
            {"framework": "sandblaster", "replicas": 3},
            "auto",
            "cluster.replicas = 3 says otherwise",
        ),
        ({"framework": "sandblaster", "worker_groups": 2}, "auto", "has worker_groups = 1"),
        ({"framework": "downpour", "server_groups": 2}, "auto", "has server_groups = 1"),
        ({"framework": "allreduce", "worker_groups": 2}, "auto", "has worker_groups = 1"),
        (
            {"framework": "allreduce", "workers_per_group": 4, "servers_per_group": 2},
            "auto",
            "has servers_per_group = 4 (every worker is bound to a server on its node)",
        ),
        ({"framework": "hogwild", "worker_groups": 1}, "auto", "two or more of each"),
        ({"framework": "hogwild", "server_groups": 1}, "auto", "one server group is 'downpour'"),
        ({"framework": "hybrid", "workers_per_group": 1}, "auto", "one worker per group"),
        ({"framework": "hybrid", "worker_groups": 1}, "auto", "two or more asynchronous"),
        # new and today's keys saying different things
        ({"replicas": 3, "worker_groups": 4}, "auto", "say different things"),
        ({"ps": 2, "servers_per_group": 3}, "auto", "cluster.ps is the servers per group"),
        # keys that do nothing, or that the servers cannot do
        ({"sync_every": 100}, "auto", "does nothing with one server group"),
        ({"optimizer": "sgd"}, "adagrad", "ps.rule = 'adagrad' and cluster.optimizer = 'sgd'"),
        ({"optimizer": "adagrad"}, "momentum", "say different things"),
        ({"framework": "sandblaster"}, "adagrad", "does nothing with cluster.optimizer = 'lbfgs'"),
        ({"framework": "sandblaster", "warm_start": 100}, "auto", "one worker group"),
        ({"ps": 2, "copies": 3}, "auto", "up to the servers of a server group"),
    ],
)
def test_a_topology_that_cannot_work_is_rejected_saying_why(cluster, ps_rule, says):
    assert says in rejected(ps_rule, **cluster)


# -- through the config -----------------------------------------------------------------------


def test_the_bundled_config_resolves_to_downpour_and_rejects_bad_topologies_at_load():
    config = load_config()
    assert resolve_topology(config.cluster, config.ps.rule).framework == "downpour"
    sandblaster = config.override({"cluster.framework": "sandblaster"})
    assert resolve_topology(sandblaster.cluster, sandblaster.ps.rule).optimizer == "lbfgs"
    with pytest.raises(ConfigError, match="adam_mnist.toml: 3 server groups for 2"):
        config.override({"cluster.server_groups": 3})


def test_lbfgs_keys_are_checked_and_refused_without_lbfgs():
    config = load_config()
    keys = {"cluster.lbfgs_batch": 5000, "cluster.lbfgs_iterations": 3, "cluster.lbfgs_history": 20}
    minibatch = config.override({"cluster.framework": "sandblaster", **keys})
    assert (minibatch.cluster.lbfgs_batch, minibatch.cluster.lbfgs_iterations) == (5000, 3)
    with pytest.raises(ConfigError, match="cluster.optimizer is 'adagrad'; remove them"):
        config.override({"cluster.lbfgs_batch": 5000})  # Downpour with Adagrad
    for key, value in (("lbfgs_batch", -1), ("lbfgs_iterations", 0), ("lbfgs_history", 0)):
        with pytest.raises(ConfigError, match="cluster.lbfgs_batch must be >= 0"):
            config.override({"cluster.framework": "sandblaster", f"cluster.{key}": value})
    with pytest.raises(ConfigError, match="cluster.lbfgs_warm_start must be >= 0"):
        config.override({"cluster.framework": "sandblaster", "cluster.lbfgs_warm_start": -1})
    with pytest.raises(ConfigError, match="cluster.optimizer is 'adagrad'; remove them"):
        config.override({"cluster.lbfgs_warm_start": 5000})
    warm = config.override({"cluster.framework": "sandblaster", "cluster.lbfgs_warm_start": 5000})
    assert warm.cluster.lbfgs_warm_start == 5000
    growing = {"cluster.framework": "sandblaster", "cluster.lbfgs_batch_growth": 1.5}
    with pytest.raises(ConfigError, match="cluster.lbfgs_batch = 0 is the full batch"):
        config.override(growing)
    grown = config.override({**growing, "cluster.lbfgs_batch": 5000})
    assert grown.cluster.lbfgs_batch_growth == 1.5
    with pytest.raises(ConfigError, match="cluster.lbfgs_batch_growth must be >= 1"):
        config.override({**growing, "cluster.lbfgs_batch": 5000, "cluster.lbfgs_batch_growth": 0.5})
    with pytest.raises(ConfigError, match="cluster.optimizer is 'adagrad'; remove them"):
        config.override({"cluster.lbfgs_batch_growth": 2.0})
