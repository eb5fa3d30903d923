"""Why a replicated server refuses a client's request (``Replication.not_primary``, the real
adapter of plugins/ps/replication/adapter.py on an unstarted real server: no etcd, no socket):
the reason and its counter follow the request's kind. A pull inside a takeover's wait for
reads is answered ``READS_WAITING`` (the client sends it again to the same server after a pause,
with no map read), a write short of copies ``NOT_PRIMARY`` naming ``ps.min_copies``, and either
one once the lease clock ran out as not the serving primary. A client's push queued for the
replication thread while the bucket's primary moved is answered ``NOT_PRIMARY`` by the thread's
next batch, naming the map's new primary."""

from __future__ import annotations

import time

import pytest
from hogwild_plugins.ps.failover import BucketRecord, lease_now
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.replication import Replication
from hogwild_plugins.ps.replication.bucket_role_events import CampaignAnswered, MapRead, Restored
from hogwild_plugins.ps.serving.options import ServerOptions
from hogwild_plugins.ps.serving.server import ParameterServer

from hogwild.net.wire import ErrorCode, Header, MsgType

LEASE_S = 30  # long enough that the wait for reads outlasts the test
ME, PREDECESSOR = 0, 1
MY_LEASE, ITS_LEASE = 0x70, 0x71


def primary_after_a_takeover(min_copies: int = 2) -> tuple[Replication, int]:
    """Server 0 of two, its bucket of shard 0 taken from server 1 (its lease revoked: a
    ``revoked/1`` marker in the read) a moment ago, alone in
    sync under ``min_copies`` (2: short of copies); its lease clock valid. The adapter and the
    shard."""
    options = ServerOptions(
        job="not-primary", servers=("127.0.0.1:1", "127.0.0.1:2"), index=ME, copies=2,
        etcd="127.0.0.1:1", min_copies=min_copies, lease_s=LEASE_S,
    )  # fmt: skip
    server = ParameterServer(ModelGeometry(600), options)
    replication = Replication(server, options.etcd, 2, LEASE_S, min_copies)
    shard = 0
    role = replication.roles[replication.layout.bucket_of(shard)]
    before = BucketRecord(3, PREDECESSOR, ITS_LEASE, (PREDECESSOR, ME), revision=9)
    both = {ME: MY_LEASE, PREDECESSOR: ITS_LEASE}
    role.handle(MapRead(before, both, MY_LEASE, True, stimulus_id="m"))
    role.handle(Restored(3, stimulus_id="r"))  # its primary's snapshot: a current copy
    gone = MapRead(before, {ME: MY_LEASE}, MY_LEASE, True, revoked_ttl=LEASE_S, stimulus_id="m2")
    [campaign] = role.handle(gone)
    won = BucketRecord(4, ME, MY_LEASE, campaign.record.in_sync, revision=10)
    now = lease_now()
    role.handle(CampaignAnswered(True, won, now, stimulus_id="c"))
    replication.clock.granted(MY_LEASE, LEASE_S, now)
    assert role.serving and role.writable == (min_copies == 1)
    assert not role.reads_open(lease_now())
    return replication, shard


def refused(replication: Replication, shard: int, read: bool) -> tuple[ErrorCode, str, dict]:
    kind = MsgType.PULL if read else MsgType.PUSH_DELTAS
    error = replication.not_primary(Header(kind, 1, 7, shard, 1), shard, read=read)
    counted = {k: replication.counters[k] for k in ("too_few_copies", "reads_waiting")}
    for k in counted:
        replication.counters[k] = 0
    return error.code, str(error), counted


def test_a_pull_in_the_wait_is_told_to_wait_and_a_write_short_of_copies_names_min_copies():
    replication, shard = primary_after_a_takeover()
    code, text, counted = refused(replication, shard, read=True)
    assert code == ErrorCode.READS_WAITING and "wait out that server's lease" in text
    assert counted == {"too_few_copies": 0, "reads_waiting": 1}
    code, text, counted = refused(replication, shard, read=False)
    assert code == ErrorCode.NOT_PRIMARY and "ps.min_copies = 2" in text
    assert counted == {"too_few_copies": 1, "reads_waiting": 0}


def test_once_its_lease_clock_ran_out_neither_kind_is_told_a_reason_that_no_longer_holds():
    replication, shard = primary_after_a_takeover()
    replication.clock.valid_until = float("-inf")  # its clock gave up on the lease
    for read in (True, False):
        code, text, counted = refused(replication, shard, read)
        assert code == ErrorCode.NOT_PRIMARY and "is not the serving primary" in text
        assert counted == {"too_few_copies": 0, "reads_waiting": 0}


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="Linux's CLOCK_BOOTTIME")
def test_every_lease_decision_reads_the_boot_clock(monkeypatch):
    """Review I3: on a machine that never suspended ``CLOCK_BOOTTIME`` equals
    ``CLOCK_MONOTONIC``, so a site reading ``time.monotonic()`` passes unseen. Here the boot
    clock reads 1000 s behind it (a suspend of that long, the other way round): the adapter's
    lease clock, serving and wait for reads must all follow it. A ``time.monotonic()`` in
    ``valid``/``serving`` would call the lease run out, one in ``answers_reads`` the wait over."""
    real = time.clock_gettime
    shift = [-1000.0]

    def clock_gettime(clock: int) -> float:
        return real(clock) + shift[0] if clock == time.CLOCK_BOOTTIME else real(clock)

    monkeypatch.setattr(time, "clock_gettime", clock_gettime)
    assert lease_now() < time.monotonic() - 999
    replication, shard = primary_after_a_takeover()
    assert replication.valid() and replication.serving(shard)
    assert not replication.answers_reads(shard)  # inside its wait, by the boot clock
    shift[0] += LEASE_S + 1  # past the wait; the lease renewed just now
    replication.clock.renewed(LEASE_S, lease_now())
    assert replication.valid() and replication.answers_reads(shard)


class _Replies:
    """The replication thread's replier (the router's, once started): the replies it sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[Header, list]] = []

    def send(self, header: Header, frames: list) -> None:
        self.sent.append((header, frames))


def test_a_push_queued_while_the_buckets_primary_moves_is_answered_not_primary():
    # Server 0 serves the bucket (min_copies 1: writable after its takeover) and takes a
    # client's push into its queue; before the replication thread's next batch, a map read
    # names server 1 primary under a newer epoch. The batch answers the queued push
    # NOT_PRIMARY naming the map's primary (nothing of it acknowledged), so the client
    # re-reads the map at once instead of waiting out its timeout.
    replication, shard = primary_after_a_takeover(min_copies=1)
    role = replication.roles[replication.layout.bucket_of(shard)]
    assert role.writable
    push = Header(MsgType.PUSH_DELTAS, 1, 7, shard, 1)
    replication.submit(push, shard, None, [])  # admitted: queued for the replication thread
    moved = BucketRecord(role.record.epoch + 1, PREDECESSOR, ITS_LEASE, (PREDECESSOR, ME),
                         revision=role.record.revision + 1)  # fmt: skip
    alive = {ME: MY_LEASE, PREDECESSOR: ITS_LEASE}
    role.handle(MapRead(moved, alive, MY_LEASE, True, stimulus_id="moved"))
    assert not role.serving
    replies = replication.replier = _Replies()
    replication._process(replication._take(0.0))
    [(header, frames)] = replies.sent
    assert header.type == MsgType.ERROR and header.code == ErrorCode.NOT_PRIMARY
    assert (header.sender, header.seq) == (push.sender, push.seq)  # the push's answer
    said = bytes(frames[0]).decode()
    assert "is not the serving primary" in said and "the map names server 1" in said
    assert replication.counters["not_primary"] == 1
