"""A server that decided to stop takes no replication message: once its replication failed (or the
driver replaced it: the same ``failure``), its copy side refuses a primary's message (here the
catch-up probe it answered ACK just before) with ``REPLACED`` naming why, before it reads the
message, and its log stays where it was; so does a message that waited for the refresher's read of
etcd while the decision was taken, and a snapshot whose values were being applied then (its flow,
resumed by ``finish_restores``, is refused ``REPLACED`` at its last step). The primary then drops
it as it would a dead copy, instead of counting memory that dies with the process (the simulator
takes a stopping server away at once, which this makes true of the real one)."""

from __future__ import annotations

import numpy as np
import pytest
from hogwild_plugins.ps.replication import PEER_SENDER
from hogwild_plugins.ps.replication.copy_adapter import PeerMessage
from hogwild_plugins.ps.replication.executor import receive
from hogwild_plugins.ps.replication.frames import snapshot_frames
from hogwild_plugins.ps.replication.local import Countdown

from hogwild.net.router import Incoming
from hogwild.net.wire import DType, ErrorCode, MsgType, WireError
from tests.adversarial.copies import N, held_everywhere, primary_and_copy, two_copies

SHARD = 0


def test_a_copy_that_decided_to_stop_refuses_its_primarys_catch_up():
    with two_copies("stopping") as (servers, client):
        client.push_deltas(np.ones(N, np.float32))  # every bucket served, both copies in sync
        primary, copy = primary_and_copy(servers, SHARD)
        held_everywhere(servers, np.ones(N, np.float32))  # every COMMIT applied
        replication = primary.replication
        role = replication.roles[primary.layout.bucket_of(SHARD)]
        log = replication.logs[SHARD]
        # the primary's catch-up probe (a SNAPSHOT without frames): a copy that holds its
        # committed state answers ACK, and the primary counts it in sync again
        header = replication.link.header(
            MsgType.SNAPSHOT, SHARD, log.committed, role, offset=log.epoch
        )._replace(sender=PEER_SENDER + primary.options.index)
        probe = Incoming(b"primary", header, [], 0.0)
        committed = copy.replication.logs[SHARD].committed
        assert copy.replication.handle_peer(probe).header.type == MsgType.ACK  # still going on
        # a probe of an epoch newer than the copy knows waits for the refresher's read of its
        # record (the network thread defers it here): the decision to stop comes meanwhile
        adapter = copy.replication.copy_adapter
        newer = PeerMessage.of(header._replace(aux=header.aux + 1), [], SHARD, role.bucket)
        waiting = receive(newer, adapter)
        assert next(waiting) == "read the record from etcd"
        # and a snapshot whose values the copy's update engine applies while the decision is
        # taken: its flow waits for them (the test holds back the count of the applied restore,
        # which the engine really applies, so that the flow is still paused when it decides)
        gates = _gate_restores(adapter)
        snapshot = _snapshot(replication, role, log.committed)
        assert copy.replication.handle_peer(snapshot) is None  # paused: finish_restores answers
        [(applied, paused)] = gates
        assert applied.wait(10.0)  # in the copy's memory, its flow not told yet
        copy.replication.failure = "the test's: the driver replaced it"
        with pytest.raises(WireError) as refused:
            copy.replication.handle_peer(probe)
        assert refused.value.code == ErrorCode.REPLACED
        assert "is stopping (the test's: the driver replaced it)" in str(refused.value)
        # the refresher's path: the gate it passes again after the read refuses it REPLACED
        # too (not as a message of an epoch the record does not name)
        reply = adapter._finish(newer, waiting)  # what the refresher thread runs
        assert reply.header.type == MsgType.ERROR and reply.header.code == ErrorCode.REPLACED
        assert b"is stopping (the test's: the driver replaced it)" in bytes(reply.frames[0])
        assert copy.replication.logs[SHARD].committed == committed
        # the snapshot's flow, resumed by the replication thread's finish_restores (the test's
        # own call: that thread ends on the decision), takes its last step after the decision:
        # refused REPLACED, the bucket not marked restored from it
        for thread in copy.replication._threads:
            if thread.name == "hogwild-replicate":
                thread.join(10.0)
                assert not thread.is_alive()
        paused.done()
        sent = []
        adapter.finish_restores(sent.append, lambda: None)
        [reply] = sent
        assert reply.header.type == MsgType.ERROR and reply.header.code == ErrorCode.REPLACED
        assert b"is stopping (the test's: the driver replaced it)" in bytes(reply.frames[0])
        assert not adapter.restoring


def _gate_restores(adapter) -> list:
    """Hold back the count of each snapshot's restore the copy's engine applies: the engine
    applies it (its own count, first of each pair), and the flow waiting for it resumes only
    once the test counts it (the second)."""
    gates, apply_held = [], adapter.local.apply_held

    def gated(works: list, slots: list, countdown=None) -> None:
        applied = Countdown(len(works))
        gates.append((applied, countdown))
        apply_held(works, slots, applied)

    adapter.local.apply_held = gated
    return gates


def _snapshot(replication, role, version: int) -> Incoming:
    """The primary's snapshot of ``SHARD`` at ``version`` (its values all ones, as held)."""
    values = np.ones(1024, np.float32)
    frames = snapshot_frames(values, np.zeros(0, np.float32), [], {})
    header = replication.link.header(
        MsgType.SNAPSHOT, SHARD, version, role, dtype=DType.FLOAT32, shape=(1024,), frames=5
    )._replace(sender=PEER_SENDER + replication.me)
    return Incoming(b"primary", header, [bytes(memoryview(f)) for f in frames], 0.0)
