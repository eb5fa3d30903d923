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
        # a cluster replica's rounds: only the leader's next request of each kind is taken, a
        # FETCH only once this host's partitions flushed and took no example since
        before = receiver.refused
        send(fr.encode(fr.FLUSH, 0, a=2))  # round 1 comes first
        send(fr.encode(fr.FLUSH, 1, a=1))  # from a follower's group, not the leader
        send(fr.encode(fr.FLUSH, 0, a=1))
        send(fr.encode(fr.FETCH, 0, a=1))  # round 1 is not flushed here yet
        _until(lambda: receiver.refused == before + 3)
        assert receiver.round(fr.FLUSH, 0) == 1 and receiver.round(fr.FETCH, 0) == 0
        receiver.flushed_round = 1  # as the follower does once its partitions pushed
        send(fr.encode(fr.FLUSH, 0, a=1))  # a stale request: not taken again
        send(fr.encode(fr.FETCH, 0, a=1))
        _until(lambda: receiver.round(fr.FETCH, 0) == 1)
        send(fr.encode(fr.FLUSH, 0, a=2))
        _until(lambda: receiver.round(fr.FLUSH, 0) == 2)
        receiver.flushed_round = 2
        send(fr.encode(fr.LOAD, 0, 1, 0, 4, 3, 0.01), image)  # an example in flight again
        send(fr.encode(fr.FETCH, 0, a=2))  # mid-portion: refused
        send(fr.encode(fr.FETCH, 0, a=9))
        _until(lambda: receiver.refused == before + 6)
        assert receiver.round(fr.FETCH, 0) == 1 and receiver.round(fr.FLUSH, 0) == 2
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


@pytest.fixture
def roster(tmp_path):
    """A spread replica's roster: its leader, its follower and another role of the job."""
    from hogwild.net.auth import make_identity, use_identity, write_roster

    keys = tmp_path / "keys"
    made = {name: make_identity(tmp_path / "own", name) for name in ("replica 0", "follower 1",
                                                                   "ps 0")}  # fmt: skip
    write_roster(keys, {name: {"key": public, "address": ""} for name, (_, public) in made.items()})
    yield keys, {name: path for name, (path, _) in made.items()}
    use_identity(None)


def _located(keys, role: str, address: str) -> None:
    from hogwild.net.auth import read_roster, write_roster

    roles = read_roster(keys)
    roles[role]["address"] = address
    write_roster(keys, roles)


def test_under_the_roster_a_follower_takes_only_its_leaders_messages_and_says_it_failed(
    plan, roster
):
    """Every role of the job may connect (the ZAP handler admits the roster); a follower takes
    a SETUP and the rounds only from its leader's role, the leader a group's answers only from
    that group's role; a follower that fails while starting reaches its leader by role."""
    from hogwild.net.auth import sender_role, use_identity
    from hogwild.partition.follower import FollowerHost, _wait_setup
    from hogwild.partition.sending import Outbox

    keys, identities = roster
    network = plan.network
    leader_at, here_at = (f"127.0.0.1:{port}" for port in free_ports(2))
    _located(keys, "follower 1", here_at)
    groups = HostGroups.from_hosts([leader_at, here_at, leader_at], 3)
    roles, senders = ("replica 0", ""), ("replica 0", "follower 1")
    arena = Arena.create("partition", arena_layout(network, plan, 2, (1, network.input_size)))
    use_identity(identities["follower 1"])
    sock, security = bind_receiver(here_at, str(keys))
    use_identity(identities["replica 0"])  # the leader's link (a ZAP handler a context)
    from hogwild.net.auth import secure_server

    leader_context = zmq.Context()
    leader_sock = leader_context.socket(zmq.PULL)
    leader_sock.setsockopt(zmq.LINGER, 0)
    leader_security = secure_server(leader_context, leader_sock, keys)
    leader_sock.bind(f"tcp://{leader_at}")
    outboxes, receiver, leader = {}, None, None
    try:
        for name in ("replica 0", "ps 0"):
            use_identity(identities[name])
            outboxes[name] = Outbox(groups.addresses, [1], str(keys), roles)
        setup = b'{"group": 1}', b"p", b"v"
        outboxes["ps 0"].send(1, fr.encode(fr.SETUP, 0), *setup)  # not the leader: dropped
        assert sock.poll(int(WITHIN_S * 1000))  # it is there first
        outboxes["replica 0"].send(1, fr.encode(fr.SETUP, 0), b'{"group": 2}', b"p", b"v")
        assert _wait_setup(sock, WITHIN_S, here_at, "replica 0")[0] == {"group": 2}
        with pytest.raises(ValueError, match="sender role"):
            Receiver(sock, security, plan, groups, 1, arena, 2, 0.1307, 0.3081, str(keys), roles)
        use_identity(identities["follower 1"])
        receiver = Receiver(
            sock, security, plan, groups, 1, arena, 2, 0.1307, 0.3081, str(keys), roles, senders
        )
        sock = security = None
        outboxes["ps 0"].send(1, fr.encode(fr.FLUSH, 0, a=1))  # another role: forged
        outboxes["ps 0"].send(1, fr.encode(fr.STOP, 0))
        _until(lambda: receiver.refused == 2)
        assert dict(receiver.forged) == {"ps 0": 2} and not receiver.stop
        outboxes["replica 0"].send(1, fr.encode(fr.FLUSH, 0, a=1))  # its leader: taken
        _until(lambda: receiver.round(fr.FLUSH, 0) == 1)
        use_identity(identities["follower 1"])  # a follower that could not start says so
        job = {"leader": leader_at, "group": 1, "roles": list(roles)}
        FollowerHost(here_at, str(keys), print, "replica 0").report(job, "could not start: x")
        heard = []  # the follower's beats, then its FAILED
        while not heard or heard[-1][1] != fr.FAILED:
            assert leader_sock.poll(int(WITHIN_S * 1000))
            message = leader_sock.recv_multipart(copy=False)
            heard.append((sender_role(message[0]), fr.decode(message[0].bytes).kind))
        assert {role for role, _ in heard} == {"follower 1"} and message[1].bytes.endswith(b"x")
        # the leader's link: a group's answers only from its role, only to the round asked
        use_identity(identities["replica 0"])
        made = time.monotonic()
        leader = Receiver(leader_sock, leader_security, plan, groups, 0, arena, 2, 0.1307,
                          0.3081, str(keys), roles, senders)  # fmt: skip
        leader_sock = leader_security = None
        # a beat heard after the leader's link was made: its beats' key pair is made, replica 0's
        _until(lambda: receiver.beats[0] > made)
        leader.await_round(fr.FLUSHED, 3)
        for name in ("ps 0", "follower 1"):
            use_identity(identities[name])
            outboxes[f"{name} up"] = Outbox(groups.addresses, [0], str(keys), roles)
        outboxes["ps 0 up"].send(0, fr.encode(fr.FLUSHED, 1, a=3))  # forged
        outboxes["follower 1 up"].send(0, fr.encode(fr.FLUSHED, 1, a=9))  # not the one asked
        _until(lambda: leader.refused == 2)
        assert dict(leader.forged) == {"ps 0": 1} and leader.round(fr.FLUSHED, 1) == 0
        outboxes["follower 1 up"].send(0, fr.encode(fr.FLUSHED, 1, a=3))
        _until(lambda: leader.round(fr.FLUSHED, 1) == 3)
    finally:
        use_identity(None)
        for outbox in outboxes.values():
            outbox.close()
        for link in (receiver, leader):
            if link is not None:
                link.close()
        for s in (sock, leader_sock):
            if s is not None:
                s.close(0)
        for sec in (security, leader_security):
            if sec is not None:
                sec.close()
        arena.close()
        arena.unlink()
        leader_context.term()
