"""Shared parameters placed per ``train.parameters``: one interleaved copy, or one per node.

Checks the exchange between a node's copy and the home copy against the arithmetic it must do
(each node's progress lands in the home copy exactly once, and every node receives the others'),
the arena layout (every copy on pages of its own), the clock that schedules a leader's exchanges,
and the placement of pages through libnuma on this machine.
"""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from hogwild.config import load_config
from hogwild.errors import ConfigError
from hogwild.model.network import build_network
from hogwild.numa.pinning import libnuma_available, memory_nodes
from hogwild.numa.placement import WorkerPlacement, plan_parameters
from hogwild.optim.exchange import exchange_deltas
from hogwild.shm.arena import Arena
from hogwild.train.job import job_layout
from hogwild.train.parameters import ExchangeClock, SharedParameters


def placements(nodes: list[int]) -> list[WorkerPlacement]:
    return [WorkerPlacement(w, w, node, 0, w, 0) for w, node in enumerate(nodes)]


@pytest.fixture
def network():
    return build_network(load_config().model, 10)


def make_arena(network, worker_nodes, mode):
    plan = plan_parameters(placements(worker_nodes), mode)
    layout = job_layout(network, len(worker_nodes), 4, 4, parameters=plan)
    return Arena.create("test-params", layout), plan


def test_exchange_pushes_each_nodes_progress_once_and_pulls_the_others():
    rng = np.random.default_rng(0)
    start = rng.standard_normal(1000).astype(np.float32)
    home = start.copy()
    copies = [start.copy(), start.copy()]
    bases = [start.copy(), start.copy()]
    steps = [rng.standard_normal(1000).astype(np.float32) * 0.01 for _ in range(4)]
    copies[0] += steps[0]
    copies[1] += steps[1]
    exchange_deltas(home, copies[0], bases[0])
    np.testing.assert_allclose(home, start + steps[0], atol=1e-6)
    exchange_deltas(home, copies[1], bases[1])
    np.testing.assert_allclose(home, start + steps[0] + steps[1], atol=1e-6)
    np.testing.assert_allclose(copies[1], home, atol=1e-6)  # it received node 0's progress
    copies[0] += steps[2]
    exchange_deltas(home, copies[0], bases[0])
    expected = start + steps[0] + steps[1] + steps[2]
    np.testing.assert_allclose(home, expected, atol=1e-6)
    np.testing.assert_allclose(copies[0], expected, atol=1e-6)
    np.testing.assert_array_equal(bases[0], home)


def test_replicated_layout_puts_every_copy_on_its_own_pages(network):
    arena, plan = make_arena(network, [0, 0, 1, 1], "replicate")
    with arena:
        shared = SharedParameters.attach(arena, plan)
        assert shared.replicated and plan.n_copies == 2
        rows = [shared.for_worker(w)[0] for w in range(4)]
        assert rows[0].ctypes.data == rows[1].ctypes.data  # workers 0, 1 share node 0's copy
        assert rows[2].ctypes.data == rows[3].ctypes.data
        assert rows[0].ctypes.data != rows[2].ctypes.data
        for array in (*rows, shared.params, shared.velocity, *shared.for_worker(2)):
            assert array.ctypes.data % mmap.PAGESIZE == 0
            assert array.shape == (network.n_params,)
        assert [shared.is_leader(w) for w in range(4)] == [True, False, True, False]
        del shared, rows, array


def test_interleaved_or_one_node_layout_has_a_single_copy(network):
    for nodes, mode in (([0, 1], "interleave"), ([0, 0], "replicate")):
        arena, plan = make_arena(network, nodes, mode)
        with arena:
            assert "copy_params" not in arena.layout.regions
            shared = SharedParameters.attach(arena, plan)
            assert not shared.replicated and not shared.is_leader(0)
            assert shared.for_worker(1)[0].ctypes.data == shared.params.ctypes.data
            shared.merge()  # nothing to merge: no error
            del shared


def test_spread_then_merge_gives_every_node_the_sum_of_the_progress(network):
    arena, plan = make_arena(network, [0, 1], "replicate")
    with arena:
        shared = SharedParameters.attach(arena, plan)
        rng = np.random.default_rng(1)
        shared.params[:] = rng.standard_normal(network.n_params)
        shared.velocity[:] = 0.5
        start = shared.params.copy()
        shared.spread()
        (p0, v0), (p1, v1) = shared.for_worker(0), shared.for_worker(1)
        np.testing.assert_array_equal(p0, start)
        np.testing.assert_array_equal(v1, 0.5)
        d0 = rng.standard_normal(network.n_params).astype(np.float32) * 0.01
        d1 = rng.standard_normal(network.n_params).astype(np.float32) * 0.01
        p0 += d0
        shared.exchange(0)  # node 0's leader exchanges mid-epoch
        p1 += d1
        v0[:] = 1.0
        v1[:] = 3.0
        shared.merge()
        np.testing.assert_allclose(shared.params, start + d0 + d1, atol=1e-6)
        np.testing.assert_array_equal(p0, shared.params)
        np.testing.assert_array_equal(p1, shared.params)
        np.testing.assert_array_equal(shared.velocity, 2.0)  # the nodes' mean
        np.testing.assert_array_equal(v0, 2.0)  # ... in every copy too: what a resume restores
        np.testing.assert_array_equal(v1, 2.0)
        del shared, p0, p1, v0, v1


def test_one_copy_per_worker_on_one_node(network):
    plan = plan_parameters(placements([0, 0, 0]), "replicate", per="worker")
    assert plan.n_copies == 3 and plan.nodes == (0, 0, 0) and plan.replica_of_worker == (0, 1, 2)
    arena = Arena.create("test-params", job_layout(network, 3, 4, 4, parameters=plan))
    with arena:
        shared = SharedParameters.attach(arena, plan)
        assert [shared.is_leader(w) for w in range(3)] == [True, True, True]
        addresses = {shared.for_worker(w)[0].ctypes.data for w in range(3)}
        assert len(addresses) == 3
        del shared


def test_unknown_replica_granularity_is_refused():
    with pytest.raises(ConfigError, match="replica granularity must be one of node, worker"):
        plan_parameters(placements([0]), "replicate", per="socket")


def test_exchange_clock_splits_a_leaders_work_at_the_exchange_points(network):
    arena, plan = make_arena(network, [0, 0, 1], "replicate")
    with arena:
        shared = SharedParameters.attach(arena, plan)
        leader = ExchangeClock(shared, 0, every=64)
        follower = ExchangeClock(shared, 1, every=64)
        assert follower.span(256) == 256 and not follower.active
        spans, left = [], 256
        leader.trained(40)
        while left:
            spans.append(leader.span(left))
            leader.trained(spans[-1])
            left -= spans[-1]
        assert spans == [24, 64, 64, 64, 40] and leader.pending == 40
        # Minibatches of 32 with an exchange due every 100 examples: never cut a minibatch.
        batched = ExchangeClock(shared, 0, every=100, unit=32)
        spans, left = [], 256
        while left:
            spans.append(batched.span(left))
            batched.trained(spans[-1])
            left -= spans[-1]
        assert spans == [128, 128] and all(s % 32 == 0 for s in spans)
        del shared, leader, follower, batched


@pytest.mark.skipif(not libnuma_available(), reason="libnuma is not installed")
def test_place_moves_the_reserved_pages_onto_the_node(network):
    arena, plan = make_arena(network, [0, 0], "interleave")
    with arena:
        shared = SharedParameters.attach(arena, plan)
        assert shared.place() is True
        assert set(memory_nodes(shared.params)) == {0}
        del shared


def test_place_reports_nodes_the_kernel_does_not_know(network):
    arena, plan = make_arena(network, [0, 7], "replicate")  # node 7 exists only in the plan
    with arena:
        shared = SharedParameters.attach(arena, plan)
        assert shared.place() is False
        del shared
