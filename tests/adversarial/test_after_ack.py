"""No acknowledgement for a write that may still fail: what is acknowledged is applied.

- A push into a new named vector is acknowledged as soon as it is queued (``ack = "queued"``);
  its room among ``ps.max_vectors`` is held from then on, so two pushes into two new names with
  room for one are not both acknowledged while the update thread is busy: the second is refused
  at once, naming the limit, and the first lands.
- A push of activation and error vectors is acknowledged when queued too: its update thread's
  scratch holds at least one row of the widest layer, so a layer wider than the default scratch
  is applied rather than failing after the acknowledgement.
- A copy's ``COMMIT`` applies all of what it commits or none of it: with the copy's update queues
  full it refuses at once (``BUSY``), having committed nothing, and its network thread goes on
  answering; the primary drops it, re-syncs it once there is room, and both copies end equal.

- A copy's ``SNAPSHOT`` is answered once its values are in, from the replication thread: while
  the restore waits on a busy update thread, the copy's network thread answers ``STATUS``.
- A write that still fails after its acknowledgement (provoked: the shard's memory made
  unwritable, so the update rule's kernel raises) stops its bucket: every later request for the
  bucket is refused with ``STOPPED`` naming the failure, the stop is in the status and its
  gauges, and the server's other buckets go on serving, whether the push failed on the network
  thread (applied as its acknowledgement went out) or on its update thread (queued). With
  copies, a primary whose own application fails after its copies committed the write never
  acknowledges it: it stops the bucket and hands it to the copy, where the client's re-send is
  answered with the version committed there (the write lands once); the copy, now primary,
  re-syncs the stopped server from a snapshot once its memory can be written again, which lifts
  the stop. A write its applier refuses on every copy alike (a vector operation that would make
  the parameters infinite) is that request's refusal, not a failure: nothing stops.

The update thread is held busy for real (its shard's lock taken by the test, as the network
thread takes it to apply a push itself) and the queues filled for real (their slots taken).
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hogwild_plugins.ps import kernels
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.connection import PSRequestError
from hogwild_plugins.ps.layout import FcLayer, ModelGeometry
from hogwild_plugins.ps.serving.cli import format_status
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.errors import HogwildError
from hogwild.net.metrics import gauges
from hogwild.net.wire import Header, MsgType, job_id, pack_header, unpack_header
from tests.adversarial.copies import GEOMETRY, N, held_everywhere, primary_and_copy, two_copies
from tests.adversarial.hostile import RawClient

pytestmark = pytest.mark.ps_kernels


def test_two_new_names_with_room_for_one_are_not_both_acknowledged():
    with local_server(GEOMETRY, job="ack", shard_kib=4, threads=1, max_vectors=1) as server:
        with PSClient([str(server.address)], "ack", client_id=5, timeout_s=3.0) as client:
            busy = server.engine.claim_idle(0)  # the update thread waits before its next batch
            assert busy is not None
            try:
                client.push_deltas(np.ones(N, np.float32), into="a")  # acknowledged, queued
                with pytest.raises(HogwildError, match="1 named vectors"):
                    client.push_deltas(np.ones(N, np.float32), into="b")
            finally:
                busy.release()
            out = np.zeros(N, np.float32)
            deadline = time.monotonic() + 10
            while [sorted(s.vectors) for s in server.shards] != [["a"], ["a"]]:
                assert time.monotonic() < deadline, [sorted(s.vectors) for s in server.shards]
                time.sleep(0.01)
            for shard in server.shards:
                out[shard.lo : shard.lo + shard.values.size] = shard.vectors["a"]
            np.testing.assert_array_equal(out, np.ones(N, np.float32))
            status = client.status()[0]
            assert status["failures"] == [] and "INTERNAL" not in status["errors"]
            assert status["errors"]["BAD_NAME"] >= 1


def test_a_copys_commit_applies_whole_or_is_refused_with_nothing_committed():
    with two_copies("commit") as (servers, client):
        client.push_deltas(np.ones(N, np.float32))  # every bucket served, both copies in sync
        primary, copy = primary_and_copy(servers, 0)
        held_everywhere(servers, np.ones(N, np.float32))  # no apply holds a slot any more
        log = copy.replication.copy_side.logs[0]
        committed = log.committed
        held = []  # the copy's update queues: full (every slot taken)
        while (slot := copy.engine.reserve()) is not None:
            held.append(slot)
        try:
            # shard 0 only (this server may be the primary of the other shard's bucket):
            client.push_deltas(np.ones(N, np.float32), ranges=[(0, 1024)])  # acknowledged
            assert log.committed == committed  # its commit was refused whole, not half applied
            assert copy.replication.copy_side.counters["no_room"] >= 1
            # its network thread was never held up: it answers at once
            with RawClient(copy.address.endpoint) as raw:
                raw.send([pack_header(Header(MsgType.STATUS, job=job_id("commit")))])
                head, text = raw.reply(timeout_s=2.0)
                assert unpack_header(head).type == MsgType.JSON
                assert json.loads(text)["server"] == copy.options.index
        finally:
            for slot in held:
                copy.engine.unreserve(slot)
        # room again: the primary re-syncs the copy, and both hold exactly what was pushed
        deadline = time.monotonic() + 30
        while not all(
            np.array_equal(s.shards[s.local[x]].values, np.full(1024, want, np.float32))
            for s in servers
            for x, want in ((0, 2.0), (1, 1.0))
        ):
            assert time.monotonic() < deadline, "the copy was not re-synced"
            time.sleep(0.05)
        status = copy.status()
        assert status["failures"] == [] and "INTERNAL" not in status["errors"]


def test_a_vector_push_of_a_layer_wider_than_the_scratch_is_applied():
    wide = kernels.SCRATCH_FLOATS + 1000  # one row of W is more than the default scratch
    geometry = ModelGeometry(2 * wide, (FcLayer(0, 0, wide, 2),))
    with local_server(geometry, job="wide", threads=1, rule="sgd") as server:
        with PSClient([str(server.address)], "wide", client_id=6, timeout_s=5.0) as client:
            activations = np.ones((1, wide), np.float32)
            client.push_vectors(0, activations, np.array([[1.0, 2.0]], np.float32), lr=0.5)
            out = np.full(2 * wide, np.nan, np.float32)
            client.pull(out)  # queued behind the push on every shard: it sees it
            want = np.repeat(np.array([-0.5, -1.0], np.float32), wide)
            np.testing.assert_array_equal(out, want)
            assert client.status()[0]["failures"] == []


@pytest.mark.parametrize("thread", ["network", "update"])
def test_a_write_that_fails_after_its_acknowledgement_stops_its_bucket(thread):
    geometry = ModelGeometry(4 * 1024)  # four shards of 1024 floats, one bucket each
    with local_server(geometry, job="stop", shard_kib=4, threads=1, buckets=4) as server:
        with PSClient([str(server.address)], "stop", client_id=7, timeout_s=3.0) as client:
            client.push_deltas(np.ones(4 * 1024, np.float32))  # every shard: 1.0
            bucket = server.layout.bucket_of(0)
            assert {server.layout.bucket_of(s) for s in (1, 2, 3)} != {bucket}
            server.shards[server.local[0]].values.flags.writeable = False  # the kernel raises
            busy = server.engine.claim_idle(0) if thread == "update" else None
            try:  # acknowledged: queued (update) or applied as the ACK goes out (network)
                client.push_deltas(np.ones(4 * 1024, np.float32), ranges=[(0, 1024)])
            finally:
                if busy is not None:
                    busy.release()
            deadline = time.monotonic() + 30
            while not server.stops.buckets:
                assert time.monotonic() < deadline, "the failed write stopped nothing"
                time.sleep(0.01)
            with pytest.raises(PSRequestError, match=f"STOPPED.*bucket {bucket} is stopped"):
                client.push_deltas(np.ones(4 * 1024, np.float32), ranges=[(0, 1024)])
            with pytest.raises(PSRequestError, match="STOPPED.*failed to apply"):
                client.pull(np.zeros(4 * 1024, np.float32), shards=[0])
            # the other buckets serve on, and their acknowledged writes land exactly
            others = [s for s in (1, 2, 3) if server.layout.bucket_of(s) != bucket]
            ranges = [(1024 * s, 1024 * (s + 1)) for s in others]
            client.push_deltas(np.ones(4 * 1024, np.float32), ranges=ranges)
            out = np.zeros(4 * 1024, np.float32)
            client.pull(out, shards=others)
            for s in others:
                np.testing.assert_array_equal(out[1024 * s : 1024 * (s + 1)], 2.0)
            status = client.status()[0]
            assert status["failed_after_ack"] == 1 and status["buckets_stopped"] == 1
            assert "shard 0: PushDeltas 7:" in status["stopped_buckets"][str(bucket)]
            assert status["errors"]["STOPPED"] == 2
            found = {f.name: f.samples[0].value for f in gauges("ps", "ps 0", status)}
            assert found["hogwild_ps_buckets_stopped"] == 1.0
            assert found["hogwild_ps_failed_after_ack"] == 1.0
            assert f"BUCKET {bucket} STOPPED" in format_status(status)  # `hogwild ps status`


def test_a_copy_answers_status_while_a_snapshot_waits_for_its_update_thread():
    with two_copies("restore", client_id=4, timeout_s=5.0) as (servers, client):
        client.push_deltas(np.ones(N, np.float32))  # every bucket served, both copies in sync
        primary, copy = primary_and_copy(servers, 0)
        held = []  # the copy's queues full: its next commit is refused, the primary re-syncs it
        while (slot := copy.engine.reserve()) is not None:
            held.append(slot)
        busy = None
        try:
            client.push_deltas(np.ones(N, np.float32), ranges=[(0, 1024)])  # acknowledged
            assert copy.replication.copy_side.counters["no_room"] >= 1
            busy = copy.engine.claim_idle(copy.local[0])  # the update thread: busy from now on
            assert busy is not None
            for slot in held:  # room for the snapshot, which then waits for the thread
                copy.engine.unreserve(slot)
            held = []
            deadline = time.monotonic() + 30
            while not copy.replication.copy_adapter.restoring:
                assert time.monotonic() < deadline, "no snapshot came"
                time.sleep(0.01)
            with RawClient(copy.address.endpoint) as raw:  # the network thread answers at once
                raw.send([pack_header(Header(MsgType.STATUS, job=job_id("restore")))])
                head, text = raw.reply(timeout_s=2.0)
                assert unpack_header(head).type == MsgType.JSON
                assert json.loads(text)["server"] == copy.options.index
            assert copy.replication.copy_adapter.restoring  # still waiting for its values
        finally:
            for slot in held:
                copy.engine.unreserve(slot)
            if busy is not None:
                busy.release()
        deadline = time.monotonic() + 30
        while (
            not all(
                np.array_equal(s.shards[s.local[x]].values, np.full(1024, want, np.float32))
                for s in servers
                for x, want in ((0, 2.0), (1, 1.0))
            )
            or copy.replication.copy_adapter.restoring
        ):
            assert time.monotonic() < deadline, "the copy was not re-synced"
            time.sleep(0.05)
        for s in servers:
            assert s.status()["failures"] == [] and s.status()["failed_after_ack"] == 0


def test_a_primary_whose_write_fails_after_its_copies_committed_it_hands_the_bucket_over():
    with two_copies("handover", client_id=9, timeout_s=10.0) as (servers, client):
        client.push_deltas(np.ones(N, np.float32))  # every bucket served, both copies in sync
        primary, copy = primary_and_copy(servers, 0)
        bucket = primary.layout.bucket_of(0)
        values = primary.shards[primary.local[0]].values
        values.flags.writeable = False  # the primary's own application raises
        # answered once, by the copy the bucket went to (a re-send of what it committed)
        client.push_deltas(np.ones(N, np.float32), ranges=[(0, 1024)])
        assert primary.stops.stopped(bucket)
        assert str(bucket) in primary.status()["stopped_buckets"]
        # The copy may answer the re-send from what it committed before the hand-over is written
        # (its record read, its lease taken): the bucket goes to it within a failover's time.
        deadline = time.monotonic() + 30
        while not copy.replication.serving(0) or primary.replication.serving(0):
            assert time.monotonic() < deadline, (copy.status(), primary.status())
            time.sleep(0.05)
        np.testing.assert_array_equal(copy.shards[copy.local[0]].values, 2.0)
        out = np.zeros(N, np.float32)
        client.pull(out)
        np.testing.assert_array_equal(out[:1024], 2.0)
        values.flags.writeable = True  # its memory usable again: the new primary's snapshot
        deadline = time.monotonic() + 30  # replaces it and lifts the stop
        while primary.stops.stopped(bucket) or not np.array_equal(values, np.full(1024, 2.0)):
            assert time.monotonic() < deadline, primary.status()["stopped_buckets"]
            time.sleep(0.05)
        status = primary.status()
        assert status["failed_after_ack"] >= 1 and status["bucket_stops"] == 1
        assert status["buckets_stopped"] == 0


def test_a_copy_whose_committed_write_fails_is_re_synced_before_it_takes_part_again():
    with two_copies("copyfail", client_id=8, timeout_s=10.0) as (servers, client):
        client.push_deltas(np.ones(N, np.float32))  # every bucket served, both copies in sync
        primary, copy = primary_and_copy(servers, 0)
        bucket = copy.layout.bucket_of(0)
        values = copy.shards[copy.local[0]].values
        values.flags.writeable = False  # the copy's application of what it committed raises
        client.push_deltas(np.ones(N, np.float32), ranges=[(0, 1024)])  # committed, acknowledged
        deadline = time.monotonic() + 30
        # stopped, and its role told (on the copy's replication thread's next turn: a push
        # answered before that turn would find the role not told yet)
        while not (copy.stops.stopped(bucket) and copy.replication.roles[bucket].stopped):
            assert time.monotonic() < deadline, "the copy's failure stopped nothing"
            time.sleep(0.01)
        # it takes no part until re-synced: its next prepare is refused, the primary drops it
        client.push_deltas(np.ones(N, np.float32), ranges=[(0, 1024)])
        assert copy.replication.copy_side.counters["stopped_refused"] >= 1
        assert copy.status()["replication"]["roles"][str(bucket)]["stopped"]
        values.flags.writeable = True  # its memory usable again: the primary's snapshot lands
        deadline = time.monotonic() + 30
        while copy.stops.stopped(bucket) or not np.array_equal(values, np.full(1024, 3.0)):
            assert time.monotonic() < deadline, copy.status()["stopped_buckets"]
            time.sleep(0.05)
        np.testing.assert_array_equal(primary.shards[primary.local[0]].values, 3.0)
        assert not copy.status()["replication"]["roles"][str(bucket)]["stopped"]


def test_with_copies_a_write_refused_alike_on_every_copy_is_refused_and_stops_nothing():
    with two_copies("refuse", client_id=6, timeout_s=10.0) as (servers, client):
        client.push_deltas(np.full(N, 1e30, np.float32))
        primary_and_copy(servers, 0)
        with pytest.raises(PSRequestError, match="BAD_VALUE"):
            client.vector_op("scale", "params", alpha=1e30, shards=[0])  # would be infinite
        client.push_deltas(np.full(N, 1e30, np.float32))  # the bucket goes on
        out = np.zeros(N, np.float32)
        client.pull(out)
        np.testing.assert_array_equal(out, np.float32(2e30))
        for s in servers:
            status = s.status()
            assert status["buckets_stopped"] == 0 and status["failed_after_ack"] == 0
