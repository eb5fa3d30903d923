"""Topology, placement, pinning and the machine report, against fake sysfs trees and this host."""

import mmap
import os
import threading

import numpy as np
import pytest

from hogwild.numa.pinning import (
    PinningError,
    bind_memory,
    first_touch,
    helper_cpus,
    helpers_on,
    interleave_memory,
    libnuma_available,
    memory_nodes,
    pin_to_cpus,
    pin_worker,
)
from hogwild.numa.placement import (
    PlacementError,
    cpu_order,
    default_worker_count,
    plan_parameters,
    plan_workers,
)
from hogwild.numa.report import format_machine_report
from hogwild.numa.topology import (
    TopologyError,
    format_cpulist,
    parse_cpulist,
    read_topology,
)
from tests.fake_sysfs import make_sysfs


@pytest.fixture
def two_socket(tmp_path):
    """2 sockets x 4 cores x 2 threads; Linux numbering: 0-7 first threads, 8-15 siblings."""
    cpus = {}
    for cpu in range(16):
        package = (cpu % 8) // 4
        cpus[cpu] = (package, cpu % 4)
    nodes = {0: [0, 1, 2, 3, 8, 9, 10, 11], 1: [4, 5, 6, 7, 12, 13, 14, 15]}
    mem = {0: (64 * 2**20, 60 * 2**20), 1: (64 * 2**20, 10 * 2**20)}
    return read_topology(make_sysfs(tmp_path / "two_socket", nodes, cpus, mem))


@pytest.fixture
def four_node(tmp_path):
    """One socket split in 4 NUMA nodes (like EPYC NPS4), 4 cores each, no SMT, plus a
    memory-only node 4."""
    cpus = {cpu: (0, cpu) for cpu in range(16)}
    nodes = {n: list(range(4 * n, 4 * n + 4)) for n in range(4)}
    nodes[4] = []
    return read_topology(make_sysfs(tmp_path / "four_node", nodes, cpus))


def test_cpulist_round_trip():
    assert parse_cpulist("0-3,8-11\n") == [0, 1, 2, 3, 8, 9, 10, 11]
    assert parse_cpulist("5") == [5] and parse_cpulist("") == [] and parse_cpulist("\n") == []
    assert parse_cpulist("0-6:2") == [0, 2, 4, 6]
    assert format_cpulist([11, 0, 1, 2, 3, 8, 9, 10]) == "0-3,8-11"
    assert format_cpulist([4]) == "4" and format_cpulist([]) == ""
    with pytest.raises(TopologyError):
        parse_cpulist("zero-three")


def test_two_socket_topology(two_socket):
    t = two_socket
    assert (t.n_nodes, t.n_cpus, t.n_physical_cores, t.n_packages) == (2, 16, 8, 2)
    assert t.nodes[0].cpus == (0, 1, 2, 3, 8, 9, 10, 11)
    assert t.nodes[1].mem_total == 64 * 2**30 and t.nodes[1].mem_free == 10 * 2**30
    assert t.mem_total == 128 * 2**30
    assert [c.cpus for c in t.cores_of(0)] == [(0, 8), (1, 9), (2, 10), (3, 11)]
    assert [c.cpus for c in t.cores_of(1)] == [(4, 12), (5, 13), (6, 14), (7, 15)]
    assert t.node_of(13) == 1 and t.node_of(8) == 0
    with pytest.raises(KeyError):
        t.node_of(99)
    assert default_worker_count(t) == 8


def test_two_socket_fill_takes_physical_cores_node_by_node_then_siblings(two_socket):
    cpus = [p.cpu for p in plan_workers(two_socket, 10, "fill")]
    assert cpus == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    plan = plan_workers(two_socket, 10, "fill")
    assert [p.node for p in plan[:4]] == [0] * 4 and plan[4].node == 1
    assert [p.thread for p in plan] == [0] * 8 + [1, 1]
    assert not any(p.shared for p in plan)
    assert [p.cpu for p in plan_workers(two_socket, 3)] == [0, 1, 2]  # fill is the default


def test_two_socket_spread_alternates_nodes(two_socket):
    plan = plan_workers(two_socket, 6, "spread")
    assert [p.cpu for p in plan] == [0, 4, 1, 5, 2, 6]
    assert [p.node for p in plan] == [0, 1, 0, 1, 0, 1]
    every = [p.cpu for p in plan_workers(two_socket, 16, "spread")]
    assert sorted(every) == list(range(16))
    assert every[8:10] == [8, 12]  # siblings only after every physical core


def test_default_count_and_cpu_order_cover_every_cpu_once(two_socket, four_node):
    for topo in (two_socket, four_node):
        for policy in ("fill", "spread"):
            order = [cpu for cpu, _, _ in cpu_order(topo, policy)]
            assert sorted(order) == list(topo.cpu_ids)
        assert len(plan_workers(topo, None)) == topo.n_physical_cores
        assert len(plan_workers(topo, 0)) == topo.n_physical_cores


def test_oversubscription_wraps_or_errors(two_socket):
    plan = plan_workers(two_socket, 20)
    assert [p.cpu for p in plan[16:]] == [0, 1, 2, 3]
    assert [p.shared for p in plan] == [True] * 4 + [False] * 12 + [True] * 4
    with pytest.raises(PlacementError, match="20 workers requested but only 16 CPUs"):
        plan_workers(two_socket, 20, oversubscribe="error")
    assert len(plan_workers(two_socket, 16, oversubscribe="error")) == 16
    assert all(p.shared for p in plan_workers(two_socket, 40))


def test_bad_policy_values_are_config_errors(two_socket):
    with pytest.raises(PlacementError):
        plan_workers(two_socket, 2, policy="pack")
    with pytest.raises(PlacementError):
        plan_workers(two_socket, 2, oversubscribe="never")
    with pytest.raises(PlacementError):
        plan_workers(two_socket, -1)
    with pytest.raises(PlacementError):
        plan_parameters(plan_workers(two_socket, 2), "mirror")


def test_four_node_machine(four_node):
    t = four_node
    assert t.n_nodes == 5 and t.n_physical_cores == 16 and t.nodes[4].cpus == ()
    spread = plan_workers(t, 4, "spread")
    assert [p.cpu for p in spread] == [0, 4, 8, 12]
    assert [p.node for p in spread] == [0, 1, 2, 3]
    fill = plan_workers(t, 6, "fill")
    assert [p.node for p in fill] == [0, 0, 0, 0, 1, 1]


def test_parameters_interleaved_or_replicated(four_node):
    plan = plan_workers(four_node, 6, "fill")
    inter = plan_parameters(plan)
    assert inter.mode == "interleave" and inter.nodes == (0, 1) and inter.n_copies == 1
    assert set(inter.replica_of_worker) == {0}
    rep = plan_parameters(plan, "replicate")
    assert rep.n_copies == 2 and rep.replica_of_worker == (0, 0, 0, 0, 1, 1)


def test_machine_without_node_directory_is_one_node(tmp_path):
    cpus = {cpu: (0, cpu % 2) for cpu in range(4)}  # 2 cores x 2 threads
    t = read_topology(make_sysfs(tmp_path, None, cpus))
    assert t.n_nodes == 1 and t.nodes[0].cpus == (0, 1, 2, 3)
    assert [c.cpus for c in t.cores] == [(0, 2), (1, 3)]
    assert "no node directory" in t.source
    assert [p.cpu for p in plan_workers(t, 3)] == [0, 1, 2]


def test_missing_topology_files_make_each_cpu_a_core(tmp_path):
    cpus = {cpu: (0, 0) for cpu in range(3)}
    t = read_topology(make_sysfs(tmp_path, {0: [0, 1, 2]}, cpus, with_topology=False))
    assert t.n_physical_cores == 3


def test_allowed_cpus_restrict_the_topology(tmp_path):
    cpus = {cpu: (0, cpu) for cpu in range(8)}
    root = make_sysfs(tmp_path, {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}, cpus)
    t = read_topology(root, allowed_cpus={1, 5, 6})
    assert t.cpu_ids == (1, 5, 6) and t.nodes[1].cpus == (5, 6)
    with pytest.raises(TopologyError):
        read_topology(root, allowed_cpus={42})


def test_report_on_fake_machines(two_socket, four_node):
    text = format_machine_report(two_socket, plan_workers(two_socket, 10), policy="fill")
    assert "NUMA nodes: 2" in text and "sockets: 2" in text and "physical cores: 8" in text
    assert "node 1: CPUs 4-7,12-15, 4 cores, memory 64.0 GiB (10.0 GiB free)" in text
    assert "worker 8: CPU 8 (node 0, socket 0 core 0, hyperthread 1)" in text
    assert "interleaved over nodes 0,1" in text
    plan = plan_workers(four_node, 40, "spread")
    text = format_machine_report(four_node, plan, plan_parameters(plan, "replicate"), max_rows=5)
    assert "... 35 more" in text and "replicated, one copy per node (0,1,2,3)" in text
    assert "40 share a CPU" in text and "node 4: CPUs (none)" in text


# ------------------------------------------------------------------------------ this machine


def test_real_machine_topology_plan_and_report():
    t = read_topology()
    allowed = os.sched_getaffinity(0)
    assert t.n_cpus >= 1 and set(t.cpu_ids) <= allowed
    assert sum(len(c.cpus) for c in t.cores) == t.n_cpus
    assert sorted(c for n in t.nodes for c in n.cpus) == sorted(t.cpu_ids)
    plan = plan_workers(t)
    assert len(plan) == default_worker_count(t) == t.n_physical_cores
    assert len({p.cpu for p in plan}) == len(plan)  # one physical core each
    text = format_machine_report(t, plan)
    assert "Worker plan" in text and f"NUMA nodes: {t.n_nodes}" in text


def test_pinning_this_process_and_restoring():
    before = os.sched_getaffinity(0)
    t = read_topology()
    placement = plan_workers(t)[-1]
    try:
        previous = pin_worker(placement)
        assert previous == before
        assert os.sched_getaffinity(0) == {placement.cpu}
        pin_worker(placement, t, scope="node")
        node_cpus = next(n.cpus for n in t.nodes if n.node == placement.node)
        assert os.sched_getaffinity(0) == set(node_cpus)
        with pytest.raises(PinningError):
            pin_to_cpus([])
        with pytest.raises(PinningError):
            pin_to_cpus([max(before) + 4096])
        with pytest.raises(PinningError):
            pin_worker(placement, scope="socket")
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_threads_started_among_helpers_run_on_the_node_while_the_worker_stays_pinned():
    before = os.sched_getaffinity(0)
    t = read_topology()
    placement = plan_workers(t)[0]
    seen: list[set[int]] = []
    try:
        allowed = pin_worker(placement)
        wide = helper_cpus(placement, allowed, t)
        node_cpus = next(n.cpus for n in t.nodes if n.node == placement.node)
        assert wide == set(allowed) & set(node_cpus) and len(wide) >= 2
        ended = threading.Event()

        def helper_main() -> None:
            ended.wait(10)
            seen.append(os.sched_getaffinity(0))

        with helpers_on(wide):
            helper = threading.Thread(target=helper_main)
            helper.start()
            # the worker never leaves its CPU, not even here: another job reads it from this
            # thread (numa.claims) and would plan over a worker it saw unpinned
            assert os.sched_getaffinity(0) == {placement.cpu}
        ended.set()
        helper.join(10)
        assert seen == [wide]  # the helper may use the node
        assert os.sched_getaffinity(0) == {placement.cpu}
        # nothing of the node allowed: the helpers stay on the worker's CPU
        assert helper_cpus(placement, [], t) == {placement.cpu}
    finally:
        os.sched_setaffinity(0, before)


def test_first_touch_and_libnuma_placement():
    buf = np.frombuffer(mmap.mmap(-1, 4 * 4096), np.uint8)  # whole pages, as a region's
    first_touch(buf)
    assert not buf.any()
    if not libnuma_available():
        assert bind_memory(buf, 0) is False and memory_nodes(buf) is None
        pytest.skip("libnuma not installed: first touch only")
    node = read_topology().node_of(os.sched_getaffinity(0).pop())
    assert bind_memory(buf, node) is True
    nodes = memory_nodes(buf)
    assert nodes is not None and set(nodes) == {node}
    assert interleave_memory(buf, [node]) is True
    assert bind_memory(buf, 10_000) is False  # no such node: refused, not an error
    assert interleave_memory(buf, [10_000]) is False
    assert interleave_memory(buf, [node, 10_000]) is False  # spread over fewer nodes than asked
