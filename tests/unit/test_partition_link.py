"""Where a partition's blocks go between hosts, and what a host's receiver takes from the network.

Routing: with three partitions on two hosts (0 and 2 on the leader, 1 on a follower) a block
leaves a host only for a host where a partition reads it, and the leader's two slices of a
partial error travel in one message. The receiver (a real PULL socket on loopback and a real
arena, a PUSH socket in this test as the other host): a block lands in the row and advances the
counter exactly as a partition next door would; a block that overtook its example's LOAD waits
for it; messages that are not the plan's (a payload of the wrong size, a block claimed by a
partition of this host, a kind this host never receives, a slot out of range, a stale example,
a label or rate that is none, more early blocks than the plan can send)
are refused and counted, and no counter moves for them (a short frame may have been read into
its row, which nobody reads before the counter says so).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from hogwild.config import load_config
from hogwild.errors import ConfigError
from hogwild.model.network import build_network
from hogwild.net.ports import free_ports
from hogwild.partition import frames as fr
from hogwild.partition.hosts import HostGroups, host_groups
from hogwild.partition.link import Receiver, bind_receiver
from hogwild.partition.plan import plan_partitions
from hogwild.partition.process import GEN, fwd_column, slot_width
from hogwild.partition.runtime import arena_layout
from hogwild.shm.arena import Arena

WITHIN_S = 10.0


@pytest.fixture(scope="module")
def plan():
    return plan_partitions(build_network(load_config(None).model), 3)


def test_blocks_leave_a_host_only_for_a_host_that_reads_them(plan):
    groups = HostGroups.from_hosts(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"], 3)
    assert groups.group_of == (0, 1, 0) and groups.members(0) == (0, 2)
    softmax = len(plan.boundaries) - 1  # the scores meet at partition 0, on the leader
    for b in range(softmax):
        assert groups.forward_targets(plan, b, 0) == (1,)
        assert groups.forward_targets(plan, b, 1) == (0,)
        assert groups.backward_targets(plan, b, 1) == ((0, (0, 2)),)  # both slices, one message
        assert groups.backward_targets(plan, b, 2) == ((1, (1,)),)
    assert groups.forward_targets(plan, softmax, 1) == (0,)
    assert groups.forward_targets(plan, softmax, 2) == ()  # partition 0 is next door
    assert groups.backward_targets(plan, softmax, 0) == ((1, (1,)),)  # its scores' errors


def test_hosts_beyond_loopback_need_keys_and_one_address_per_partition(plan):
    two_hosts = ["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.1:7000"]
    config = load_config(None, {"model.partitions": 3, "model.partition_hosts": two_hosts})
    with pytest.raises(ConfigError, match="cluster.keys"):
        host_groups(config, plan)
    keyed = config.override({"cluster.keys": "/somewhere"})
    assert host_groups(keyed, plan).addresses == ("10.0.0.1:7000", "10.0.0.2:7000")
    with pytest.raises(ConfigError, match="one per partition"):
        load_config(None, {"model.partitions": 3, "model.partition_hosts": two_hosts[:2]})
    one_host = config.override({"model.partition_hosts": ["127.0.0.1:7000"] * 3})
    assert host_groups(one_host, plan) is None  # one arena: shared memory, no frames


def _until(condition) -> None:
    deadline = time.monotonic() + WITHIN_S
    while not condition():
        assert time.monotonic() < deadline, "the receiver did not get there in time"
        time.sleep(0.005)


def test_the_receiver_applies_the_plans_blocks_and_refuses_the_rest(plan):
    network = plan.network
    leader_at, here_at = (f"127.0.0.1:{port}" for port in free_ports(2))
    groups = HostGroups.from_hosts([leader_at, here_at, leader_at], 3)
    arena = Arena.create("partition", arena_layout(network, plan, 2, (1, network.input_size)))
    sock, security = bind_receiver(here_at, None)
    pull = zmq.Context.instance().socket(zmq.PULL)  # where the receiver's beats go
    pull.bind(f"tcp://{leader_at}")
    receiver = Receiver(sock, security, plan, groups, 1, arena, 2, 0.1307, 0.3081)
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"tcp://{here_at}")
    try:
        sync, act = arena.array("sync"), arena.array("act")
        width = slot_width(len(plan.segments))
        b = plan.boundaries[0]
        lo, hi = b.slices[0]
        block = np.arange(hi - lo, dtype=np.float32) + 1.0
        image = np.full(network.input_size, 255, dtype=np.uint8)

        def send(header, *payload):
            push.send_multipart([header, *payload])

        def counter(slot):
            return int(sync[slot * width + fwd_column(1)])

        # partition 0's block of example 1 overtakes example 1's LOAD: kept, not applied
        send(fr.encode(fr.FORWARD, 0, 1, 1, 1), block)
        send(fr.encode(fr.LOAD, 0, 1, 0, 1, 7, 0.01), image)
        _until(lambda: sync[1 * width + GEN] == 1)
        assert counter(1) == 1
        np.testing.assert_array_equal(act[1, b.block + lo : b.block + hi], block)
        assert arena.array("slot_label")[1] == 7
        assert act[1, 0] == pytest.approx((1.0 - 0.1307) / 0.3081)  # loaded as the engine does
        # after the LOAD, a block goes straight into the row
        send(fr.encode(fr.LOAD, 0, 0, 0, 1, 3, 0.01), image)
        send(fr.encode(fr.FORWARD, 2, 0, 1, 1), np.ones(b.slices[2][1] - b.slices[2][0], "f4"))
        _until(lambda: counter(0) == 1)
        assert receiver.refused == 0
        refused = [
            (fr.encode(fr.FORWARD, 0, 0, 1, 1), block[:-1]),  # a frame one float short
            (fr.encode(fr.FORWARD, 1, 0, 1, 1), block),  # partition 1 runs here
            (fr.encode(fr.FORWARD, 0, 5, 1, 1), block),  # slot 5 of 2
            (fr.encode(fr.FORWARD, 0, 0, 9, 1), block),  # no boundary 9
            (fr.encode(fr.DONE, 0, 0, 0, 1),),  # DONE goes to the leader
            (fr.encode(fr.FLUSHED, 0, a=1),),  # so do a cluster replica's answers
            (fr.encode(fr.FETCH, 0, a=1), block),  # a round's request has no payload
            (fr.encode(fr.LOAD, 0, 0, 0, 1, 3, 0.01), image),  # example 1 is there already
            (fr.encode(fr.LOAD, 0, 0, 0, 9, 10, 0.01), image),  # label 10 of 10 classes
            (fr.encode(fr.LOAD, 0, 0, 0, 9, 3, float("nan")), image),  # a rate that is no rate
            (fr.encode(fr.FORWARD, 0, 0, 1, 1), block, block),  # one frame too many
            (b"not a header",),
        ]
        for message in refused:
            send(*message)
        _until(lambda: receiver.refused == len(refused))
        assert counter(0) == 1 and counter(1) == 1  # no counter moved for them
        assert sync[GEN] == 1  # slot 0 still holds example 1
        # blocks ahead of their LOAD wait, one example a slot at most
        send(fr.encode(fr.FORWARD, 0, 0, 1, 3), block)
        send(fr.encode(fr.FORWARD, 0, 1, 1, 4), block)
        send(fr.encode(fr.FORWARD, 0, 0, 1, 5), block)  # a third example waiting: refused
        _until(lambda: receiver.refused == len(refused) + 1)
        assert sorted(receiver.pending) == [(0, 3), (1, 4)]
        np.testing.assert_array_equal(act[1, b.block + lo : b.block + hi], block)
        assert receiver.blocks == 6  # two LOADs and four FORWARDs taken (applied or kept)
        # a cluster replica's rounds: the leader's last request of each kind, for the parent
        send(fr.encode(fr.FLUSH, 0, a=2))
        send(fr.encode(fr.FETCH, 0, a=1))
        send(fr.encode(fr.FLUSH, 0, a=1))  # an older one changes nothing
        _until(lambda: receiver.round(fr.FETCH, 0) == 1)
        assert receiver.round(fr.FLUSH, 0) == 2 and receiver.round(fr.FLUSHED, 0) == 0
        assert pull.poll(int(WITHIN_S * 1000))  # it beats to the leader
        assert fr.decode(pull.recv()).kind == fr.BEAT
    finally:
        push.close(0)
        receiver.close()
        pull.close(0)
        arena.close()
        arena.unlink()


def test_what_crosses_between_hosts_is_the_plans_crossing_between_partitions_on_them(plan):
    two = plan_partitions(plan.network, 2)
    apart = HostGroups.from_hosts(["127.0.0.1:1", "127.0.0.1:2"], 2)
    assert apart.bytes_between_hosts(two) == two.bytes_per_example  # every partition apart
    mixed = HostGroups.from_hosts(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"], 3)
    assert 0 < mixed.bytes_between_hosts(plan) < plan.bytes_per_example  # 0 and 2 share a host
    assert "partitions 0, 2  (the leader" in mixed.describe(plan)
