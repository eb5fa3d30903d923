"""A partition host takes from the parameter servers only the shards its partitions' rows lie in.

A spread replica's follower host with partition 1 of 3 opens its home at its start without
pulling (nothing reads the model before the leader's first FETCH round), then takes the servers'
model in every FETCH round (round 1 at the leader's start, then one before each new epoch): it
must pull exactly the shards partition 1's rows lie in (counted by a real in-process parameter
server: one pull request per shard), write those rows into its arena's ``params`` and ``base``,
leave every other row as it was, and say what it pulled (less than the model). The spread
leader's host (partition 0 of 3) pulls exactly partition 0's shards; a host holding all K
partitions (``pack``) pulls every shard. The follower is
:class:`~hogwild.partition.follower.FollowerHost` itself, with its arena, its store and its home
built as its ``start`` builds them, and the leader's home is opened as
:class:`~hogwild.cluster.partitioned.PartitionedReplica` opens it (:meth:`HostRows.open`), with
no partition processes (a take is made with every partition idle), against a parameter server in
this process on loopback.
"""

from __future__ import annotations

import numpy as np
import pytest
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.config import load_config
from hogwild.model.network import build_network
from hogwild.partition.follower import FollowerHost
from hogwild.partition.host_rows import HostRows
from hogwild.partition.plan import plan_partitions
from hogwild.partition.runtime import arena_layout
from hogwild.shm.arena import Arena
from hogwild.store.protocol import WorkerSpec
from hogwild.store.registry import store_class

pytestmark = pytest.mark.ps_kernels  # a parameter server in this process, nothing that trains

K, HERE = 3, 1  # the follower holds partition 1 of 3
SHARD_KIB = 4  # 1,024 floats a shard: the default model's 298,128 parameters in 292 shards
SHARD_FLOATS = SHARD_KIB * 1024 // 4
JOB = "host-rows"


def _shards_of(rows) -> set[int]:
    return {s for lo, hi in rows for s in range(lo // SHARD_FLOATS, (hi - 1) // SHARD_FLOATS + 1)}


def _pulls_at_once(server) -> int:
    """Pulls the server answered at once: every pull, while no write was ever queued."""
    return server.engine.pulls_at_once


def _received(server) -> int:
    """Requests the server received: every pull, while only a connected home asks."""
    return server.router.received


def test_a_host_with_partition_1_of_3_pulls_only_its_rows_shards_at_start_and_each_fetch():
    rng = np.random.default_rng(36)
    config = load_config(None, {"model.partitions": K})
    network = build_network(config.model, 10)
    plan = plan_partitions(network, K)
    rows = plan.param_rows(HERE)
    wanted = _shards_of(rows)
    n_shards = -(-network.n_params // SHARD_FLOATS)
    assert 0 < len(wanted) < n_shards  # a test that could tell a subset from the whole
    first = rng.standard_normal(network.n_params).astype(np.float32)
    geometry = ModelGeometry.from_network(network)
    with local_server(geometry, job=JOB, initial=first, shard_kib=SHARD_KIB) as server:
        config = config.override(
            {"ps.servers": [str(server.address)], "ps.job": JOB, "ps.shard_kib": SHARD_KIB}
        )
        host = FollowerHost("127.0.0.1:0", None, say=print)
        host.local = (HERE,)
        words = store_class("ps").version_words(network.n_params)  # as the follower sizes it
        layout = arena_layout(network, plan, 1, (1, network.input_size), True, words)
        host.arena = Arena.create(JOB, layout)
        try:
            params, base = host.arena.array("params"), host.arena.array("base")
            params[:], base[:] = -1.0, -1.0  # the leader's SETUP values, say
            home = host._home({"store": "ps"}, config, network)

            before = _pulls_at_once(server)
            host._open_home(home, network, plan, config)  # its start: it pulls nothing yet
            assert _pulls_at_once(server) == before and host.home.takes == 0
            assert (params == -1.0).all() and (base == -1.0).all()

            before = _pulls_at_once(server)
            host._take_the_servers_model()  # FETCH round 1, which the leader's start asks
            assert _pulls_at_once(server) - before == len(wanted)
            mine = np.zeros(network.n_params, bool)
            for lo, hi in rows:
                mine[lo:hi] = True
            np.testing.assert_array_equal(params[mine], first[mine])
            np.testing.assert_array_equal(base[mine], first[mine])
            assert (params[~mine] == -1.0).all() and (base[~mine] == -1.0).all()

            second = rng.standard_normal(network.n_params).astype(np.float32)
            server_client = store_class("ps").open_home(
                WorkerSpec("ps", -1, home["values"]), host.arena, network, config
            )
            try:
                server_client.client.assign(second)  # the other replicas trained an epoch
            finally:
                server_client.close()
            before = _received(server)
            host._take_the_servers_model()  # FETCH round 2: a new epoch
            assert _received(server) - before == len(wanted)
            np.testing.assert_array_equal(params[mine], second[mine])
            np.testing.assert_array_equal(base[mine], second[mine])
            assert (params[~mine] == -1.0).all()

            bytes_per_take = 4 * sum(
                min(network.n_params, (s + 1) * SHARD_FLOATS) - s * SHARD_FLOATS for s in wanted
            )
            pulled = host.home.facts()
            assert pulled == {
                "partitions": [HERE],
                "takes": 2,
                "bytes": 2 * bytes_per_take,
                "model_bytes": 4 * network.n_params,
            }
            assert bytes_per_take < 4 * network.n_params / 2  # about a third, not the model
            assert f"{2 * bytes_per_take:,} bytes" in host.home.said()

            # the spread leader's host (partition 0 of 3), its home opened as the leader's is
            leader = HostRows.open("ps", home["values"], host.arena, network, config, plan, (0,))
            try:
                zero = _shards_of(plan.param_rows(0))
                assert 0 < len(zero) < n_shards
                params[:], base[:] = -1.0, -1.0
                before = _received(server)
                leader.take(params, base)
                assert _received(server) - before == len(zero)
                ours = np.zeros(network.n_params, bool)
                for lo, hi in plan.param_rows(0):
                    ours[lo:hi] = True
                np.testing.assert_array_equal(params[ours], second[ours])
                np.testing.assert_array_equal(base[ours], second[ours])
                assert (params[~ours] == -1.0).all() and (base[~ours] == -1.0).all()
                assert leader.facts()["bytes"] == 4 * sum(
                    min(network.n_params, (s + 1) * SHARD_FLOATS) - s * SHARD_FLOATS for s in zero
                )
            finally:
                leader.close()

            # a host holding every partition (pack) pulls every shard, as a whole copy
            every = HostRows.open("ps", home["values"], host.arena, network, config, plan, range(K))
            try:
                before = _received(server)
                every.take(params, base)
                assert _received(server) - before == n_shards
                assert every.pulled_bytes == 4 * network.n_params
                for lo, hi in every.rows:  # every partition's rows (not the layers' padding)
                    np.testing.assert_array_equal(params[lo:hi], second[lo:hi])
                    np.testing.assert_array_equal(base[lo:hi], second[lo:hi])
            finally:
                every.close()
        finally:
            host.shutdown()


def test_a_partitions_pushes_after_a_take_carry_the_takes_versions():
    """A take rewrites a partition's rows' ``base``; its next pushes are computed against it and
    must be stamped with the versions the take pulled, not with those of the partition's own
    last pull. Partition 0 of 2 pulls (versions 1), other replicas push its shards three times,
    the host takes (versions 4) and the partition pushes an epoch's first progress: under
    ``ps.max_staleness = 2`` the push is accepted (stamped 4: staleness 0), where the versions
    of its own pull (staleness 3) would have it refused. The partition's side is the partition
    process's (:func:`~hogwild.partition.process.count_example`): the take's versions seen
    before the example is counted, its exchanger told to adopt them."""
    from hogwild.partition.process import TAKEN, count_example
    from hogwild.partition.takes import Takes
    from hogwild.store.exchange import Exchanger

    config = load_config(None, {"model.partitions": 2})
    network = build_network(config.model, 10)
    plan = plan_partitions(network, 2)
    rows = plan.param_rows(0)
    shards = sorted(_shards_of(rows))
    first = np.random.default_rng(37).standard_normal(network.n_params).astype(np.float32)
    geometry = ModelGeometry.from_network(network)
    job = JOB + "-versions"
    with local_server(
        geometry, job=job, initial=first, shard_kib=SHARD_KIB, max_staleness=2
    ) as server:
        config = config.override(
            {"ps.servers": [str(server.address)], "ps.job": job, "ps.shard_kib": SHARD_KIB}
        )
        kind = store_class("ps")
        values = kind(config, network, ()).home_spec(0)
        words = kind.version_words(network.n_params)
        layout = arena_layout(network, plan, 1, (1, network.input_size), True, words)
        arena = Arena.create(job, layout)
        host = exchanger = other = None
        try:
            params, base = arena.array("params"), arena.array("base")
            host = HostRows.open("ps", values, arena, network, config, plan, (0,))
            own = kind.open_home(WorkerSpec("ps", 0, values), arena, network, config)
            owned = np.array(rows, dtype=np.int64).reshape(-1, 2)
            exchanger = Exchanger(own, params, base, 1, 1, 1, name="partition 0", owned=owned)
            takes = Takes(arena, TAKEN)

            def train_one_example() -> None:  # an example's update, counted as the process does
                for lo, hi in rows:
                    params[lo:hi] += 1.0
                count_example(exchanger, takes)
                exchanger.finish()

            host.take(params, base)  # the leader's start: versions 0
            train_one_example()  # pushes (versions 1) and pulls: its own basis is 1
            other = kind.open_home(WorkerSpec("ps", 1, values), arena, network, config).client
            ones = np.ones(network.n_params, np.float32)
            for _ in range(3):  # the other replicas' epoch: the shards move to version 4
                other.push_deltas(ones)
            host.take(params, base)  # a new epoch: the take pulls versions 4
            taken = params.copy()
            train_one_example()  # its first push of the epoch: stamped 4, not 1
            status = other.status()[0]
            assert status["refused_stale"] == 0, status
            now = np.empty(network.n_params, np.float32)
            other.pull(now, shards=shards)
            for lo, hi in rows:  # the push was applied, not refused
                np.testing.assert_allclose(now[lo:hi], taken[lo:hi] + 1.0, rtol=0, atol=1e-5)
        finally:
            if other is not None:
                other.close()
            if exchanger is not None:
                exchanger.close()
            if host is not None:
                host.close()
            arena.close()
            arena.unlink()
