"""A live copy of a replicated bucket under hostile peers: a stranger gets nothing, a key holder
gets an error for every hostile value, and honest updates still land exactly on both copies.

Two parameter servers keep two copies of every bucket (a real etcd, CURVE keys on loopback). A
client without the job's keys sends ``PREPARE``, ``COMMIT`` and ``SNAPSHOT``: none reaches the
copy. A client with the keys speaks as the bucket's primary (its epoch, lease and sender id:
a key holder can read them from a status) and sends hostile values: a prepare far ahead of the
log, one whose forwarded client header is garbage, of another shard, of NaN deltas or with
frames missing; a commit beyond anything prepared; snapshots of the wrong size; then a few
hundred seeded mutations of those. Each is answered with an error naming it, none as
``INTERNAL``; the copy's logs and values are what they were, its request tables within their
bounds, it answers ``STATUS``, and an honest push afterwards is on both copies exactly.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hogwild_plugins.ps.replication.frames import snapshot_frames
from hogwild_plugins.ps.replication.peer_link import PEER_SENDER

from bench.support.hostile_frames import mutate
from hogwild.net.auth import make_keys
from hogwild.net.wire import (
    NO_BASIS,
    U64_MAX,
    DType,
    ErrorCode,
    Header,
    MsgType,
    job_id,
    pack_header,
    unpack_header,
)
from tests.adversarial.copies import SHARD, N, held_everywhere, primary_and_copy, two_copies
from tests.adversarial.hostile import RawClient

pytestmark = pytest.mark.ps_kernels

JOB = "hostile-copy"
MUTATIONS = 300


def hostile_messages(job: int, primary, copy) -> list[tuple[list[bytes], set[ErrorCode]]]:
    """Messages a key holder sends as shard 0's primary, each with the refusals it may get."""
    role = primary.replication.roles[primary.layout.bucket_of(0)]
    peer = Header(MsgType.PREPARE, job=job, sender=PEER_SENDER + primary.options.index, target=0,
                  lease=role.record.lease, aux=role.record.epoch, a=1.0, frames=2)  # fmt: skip
    ahead = copy.replication.copy_side.logs[0].last + 1_000_000
    delta = np.ones(SHARD, np.float32)
    push = Header(MsgType.PUSH_DELTAS, job=job, sender=99, seq=1, target=0, shape=(SHARD,),
                  dtype=DType.FLOAT32, frames=1, flags=NO_BASIS)  # fmt: skip
    nan = delta.copy()
    nan[7] = np.nan
    values = np.zeros(SHARD - 1, np.float32)  # one float short of the shard
    snapshot = snapshot_frames(values, np.zeros(0, np.float32), [], {})
    snap = peer._replace(type=MsgType.SNAPSHOT, version=ahead, dtype=DType.FLOAT32,
                         shape=(SHARD,), frames=5)  # fmt: skip
    gap, bad = {ErrorCode.NEED_SYNC}, {ErrorCode.BAD_HEADER, ErrorCode.BAD_FRAMES}
    return [
        ([pack_header(peer._replace(version=ahead)), pack_header(push), delta.tobytes()], gap),
        ([pack_header(peer._replace(version=ahead)), b"\x00" * 40, delta.tobytes()], bad),
        (
            [
                pack_header(peer._replace(version=ahead)),
                pack_header(push._replace(target=1)),
                delta.tobytes(),
            ],
            bad,
        ),
        (
            [pack_header(peer._replace(version=ahead)), pack_header(push), nan.tobytes()],
            {ErrorCode.BAD_VALUE},
        ),
        ([pack_header(peer._replace(version=ahead, frames=1)), pack_header(push)], bad),
        ([pack_header(peer._replace(type=MsgType.COMMIT, version=U64_MAX, frames=0))], gap),
        (  # a catch-up (a SNAPSHOT without frames) of a state this copy does not hold
            [
                pack_header(
                    snap._replace(frames=0, offset=role.record.epoch, shape=(), dtype=DType.NONE)
                )
            ],
            gap,
        ),
        ([pack_header(snap), *(bytes(memoryview(f)) for f in snapshot)], bad),
        (
            [
                pack_header(snap._replace(shape=(SHARD - 1,))),
                *(bytes(memoryview(f)) for f in snapshot),
            ],
            bad,
        ),
    ]


def state_of(server) -> tuple:
    logs = server.replication.copy_side.logs
    return (
        [(log.committed, log.epoch, len(log.prepared)) for log in logs.values()],
        [shard.values.copy() for shard in server.shards],
    )


def test_a_live_copy_refuses_hostile_peers_and_keeps_the_honest_updates(tmp_path):
    keys, strangers = str(make_keys(tmp_path / "keys")), str(make_keys(tmp_path / "strangers"))
    job = job_id(JOB)
    with two_copies(JOB, keys) as (servers, client):
        client.push_deltas(np.ones(N, np.float32))
        primary, copy = primary_and_copy(servers, 0)
        held_everywhere(servers, np.ones(N, np.float32))  # the copy's COMMIT applied, too
        cases = hostile_messages(job, primary, copy)
        before = state_of(copy)

        # no keys, or keys the servers do not admit: nothing reaches the copy. Every one of these
        # messages would be answered with an error had it arrived (below, with the job's keys);
        # counting errors, not messages, leaves out the primary's honest traffic meanwhile.
        errors = sum(copy.router.errors.values())
        for other in (None, strangers):
            with RawClient(copy.address.endpoint, keys=other) as raw:
                for message, _ in cases:
                    if not raw.send(message, may_drop=True):  # refused: no peer to queue for
                        break
                assert not raw.socket.poll(500)
        assert sum(copy.router.errors.values()) == errors

        # the job's keys: every hostile value refused by name, then seeded mutations of them
        rng = np.random.default_rng(39)
        with RawClient(copy.address.endpoint, keys=keys) as raw:
            for message, refusals in cases:
                raw.send(message)
                head, *text = raw.reply()
                reply = unpack_header(head)
                assert reply.type == MsgType.ERROR and reply.code in refusals, (reply, text)
                assert text and text[0]  # says what was wrong
            codes = set()
            for k in range(MUTATIONS):
                raw.send(mutate(cases[k % len(cases)][0], rng))
                codes.add(unpack_header(raw.reply()[0]).code)
            assert ErrorCode.INTERNAL not in codes and len(codes) > 3
            raw.send([pack_header(Header(MsgType.STATUS, job=job))])
            head, text = raw.reply()
            assert unpack_header(head).type == MsgType.JSON
            status = json.loads(text)
        after = state_of(copy)
        assert after[0] == before[0]
        for was, now in zip(before[1], after[1], strict=True):
            np.testing.assert_array_equal(was, now)
        copy.replication.copy_side.validate_state()  # logs in order, request tables bounded
        assert status["failures"] == [] and "INTERNAL" not in status["errors"]
        assert status["replication"]["failure"] is None

        # an honest push lands on both copies, exactly
        client.push_deltas(np.full(N, 2.0, np.float32))
        deadline = time.monotonic() + 30
        while not all(
            np.array_equal(shard.values, np.full(SHARD, 3.0, np.float32))
            for server in servers
            for shard in server.shards
        ):
            assert time.monotonic() < deadline, [s.shards[0].values[:3] for s in servers]
            time.sleep(0.05)
        out = np.zeros(N, np.float32)
        client.pull(out)
        np.testing.assert_array_equal(out, np.full(N, 3.0, np.float32))
