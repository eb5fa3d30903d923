"""One shard's log on a replicated parameter server (plugins/ps/shard_log.py), with no socket.

Prepares after a gap refused, re-sent prepares held once, commits in order, snapshots that are
outdated and those that are not, a primary's own updates and a newer primary's snapshot, and the
request table that answers a client's re-sends. ``tests/unit/test_bucket_role_in_sync.py`` has
the log with the bucket role (a copy that missed a prepare is dropped, caught up and taken back).
"""

from __future__ import annotations

from hogwild_plugins.ps.shard_log import ShardLog

from hogwild.net.channel import Peers


def test_a_copy_refuses_a_prepare_after_a_gap_and_holds_nothing_of_it():
    log = ShardLog(committed=3, fence=1)  # caught up by the primary of epoch 1
    assert log.prepare(4, "u4", epoch=1)
    assert not log.prepare(6, "u6", epoch=1)  # 5 went missing
    assert log.last == 4 and log.prepared == [(4, "u4")]


def test_a_resent_prepare_is_accepted_once():
    log = ShardLog(committed=3, fence=1)
    assert log.prepare(4, "u4", epoch=1) and log.prepare(5, "u5", epoch=1)
    assert log.prepare(4, "u4 again", epoch=1) and log.prepare(5, "u5 again", epoch=1)
    assert log.prepare(3, "already committed", epoch=1)
    assert log.prepared == [(4, "u4"), (5, "u5")] and log.committed == 3


def test_commit_hands_out_the_prepared_items_in_order_up_to_the_version():
    log = ShardLog(committed=3, fence=1)
    for v in (4, 5, 6):
        log.prepare(v, f"u{v}", epoch=1)
    assert log.commit(5, epoch=2) == ["u4", "u5"]
    assert log.committed == 5 and log.last == 6 and log.epoch == 2
    assert log.commit(5, epoch=2) == []  # committed already: nothing twice
    assert log.committed == 5
    assert log.commit(6, epoch=2) == ["u6"] and log.committed == 6 and log.prepared == []


def test_a_late_snapshot_of_the_same_primary_is_outdated_and_a_newer_epochs_never_is():
    log = ShardLog()
    log.restore(10, [], epoch=3)  # the primary of epoch 3 synced this copy at version 10
    for v in (11, 12):
        log.prepare(v, f"u{v}", epoch=3)
    log.commit(12, epoch=3)
    # its first snapshot, sent before it gave up on an exchange, arrives late: version 8
    assert log.outdated(8, epoch=3) and log.outdated(11, epoch=3)
    assert not log.outdated(12, epoch=3)  # nothing newer here: restoring loses nothing
    assert not log.outdated(5, epoch=4)  # a newer primary's state is the bucket's
    log.restore(5, [], epoch=4)
    assert log.committed == 5 and log.epoch == 4 and not log.outdated(5, epoch=4)


def test_a_server_restarted_from_its_store_takes_any_snapshot():
    log = ShardLog(committed=500)  # recovered at 500: no primary's epoch yet
    assert not log.outdated(300, epoch=1)


def test_a_primarys_own_updates_move_its_log_to_its_epoch():
    log = ShardLog(committed=7, epoch=2)
    assert log.applied(sender=5, seq=1, version=8, epoch=3)
    assert log.committed == 8 and log.epoch == 3 and log.seen(5, 1) == 8
    assert log.applied(sender=5, seq=2, version=6, epoch=3)  # out of order: keeps the highest
    assert log.committed == 8 and log.seen(5, 2) == 6


def test_an_update_versioned_before_a_newer_primarys_snapshot_leaves_the_log_alone():
    """Primary of epoch 3 versions update 8 and sends it out; it steps down meanwhile, and the
    primary of epoch 4 syncs it at version 6. Recording 8 then would raise the log above the
    snapshot, and make that primary's next snapshot at 7 look outdated: a copy diverged but
    taken as synced."""
    log = ShardLog(committed=7, epoch=3)
    log.restore(6, [], epoch=4)
    assert not log.applied(sender=5, seq=1, version=8, epoch=3)
    assert log.committed == 6 and log.epoch == 4 and log.seen(5, 1) is None
    assert not log.outdated(7, epoch=4)


def test_a_snapshot_replaces_the_log_and_the_request_table():
    log = ShardLog(committed=3)
    log.prepare(4, "u4", epoch=1)
    log.record(sender=7, seq=1, version=3)
    log.restore(10, [(8, 2, 9), (8, 3, 10)], epoch=1)
    assert log.committed == 10 and log.prepared == [] and log.last == 10
    assert log.seen(7, 1) is None
    assert log.seen(8, 3) == 10
    assert log.table() == [(8, 2, 9), (8, 3, 10)]
    assert log.prepare(11, "u11", epoch=1)  # and it goes on from the snapshot


def test_the_request_table_answers_resends_and_forgets_the_version_of_a_clients_oldest():
    log = ShardLog(window=2)
    assert log.seen(1, 1) is None
    log.record(1, 1, version=1)
    log.record(1, 2, version=2)
    assert log.seen(1, 1) == 1 and log.seen(1, 2) == 2
    assert log.seen(2, 1) is None  # another client's seq 1 is another request
    log.record(1, 3, version=3)
    # beyond the window: its version forgotten, still known as answered (never applied again)
    assert log.seen(1, 1) == 0 and log.seen(1, 2) == 2 and log.seen(1, 3) == 3
    assert log.size() == 2


def test_no_other_clients_traffic_evicts_a_clients_requests():
    """A shared table bounded at 65,536 requests let another sender's flood push an honest
    client's acknowledged request out: its later re-send was applied again."""
    log = ShardLog()
    log.record(1, 7, version=1)
    for seq in range(70_000):
        log.record(2, seq, version=2 + seq)
    assert log.seen(1, 7) == 1
    assert log.size() == 1 + log.window


def test_beyond_its_clients_bound_the_least_recently_heard_of_client_is_forgotten():
    log = ShardLog(senders=2)
    log.record(1, 1, version=1)
    log.record(2, 1, version=2)
    log.record(1, 2, version=3)  # client 1 heard of again
    log.record(3, 1, version=4)
    assert log.seen(2, 1) is None and log.seen(1, 1) == 1 and log.seen(3, 1) == 4
    assert log.table() == [(1, 1, 1), (1, 2, 3), (3, 1, 4)]


def test_a_late_prepare_or_commit_of_a_deposed_primary_is_refused_after_its_successors_catch_up():
    """The primary of epoch 2 prepares version 6; before it lands, the primary of epoch 3 found
    this log holding its committed state (version 5 of epoch 2) and caught it up. Held, the old
    update would take version 6, which the new primary gives to another update: its re-send of
    6 would then count as held, and its commit of 6 would apply the deposed primary's update."""
    log = ShardLog()
    log.restore(5, [], epoch=2)
    log.catch_up(epoch=3)
    assert log.stale(2) and not log.stale(3)
    assert not log.prepare(6, "u6 of epoch 2", epoch=2)
    assert log.prepared == [] and log.last == 5
    assert log.prepare(6, "u6 of epoch 3", epoch=3)
    assert log.commit(6, epoch=2) == [] and log.committed == 5  # the deposed primary's commit
    assert log.commit(6, epoch=3) == ["u6 of epoch 3"] and (log.committed, log.epoch) == (6, 3)


def test_a_log_its_server_took_over_as_primary_refuses_the_old_primarys_late_prepare():
    """This server won epoch 3 and committed what was prepared (nothing): its log is the
    primary's now, and version 6 its own to give."""
    log = ShardLog(committed=5, epoch=2, fence=2)
    assert log.commit(5, epoch=3) == []
    assert not log.prepare(6, "u6 of epoch 2", epoch=2) and log.prepared == []
    assert log.applied(sender=1, seq=1, version=6, epoch=3) and log.committed == 6


def test_a_newer_primarys_prepare_is_refused_while_an_older_ones_are_held():
    """A new primary catches a copy up (or sends its snapshot) before it prepares there: a
    prepare of a newer epoch meeting the older primary's prepares asks for that first."""
    log = ShardLog(committed=5, epoch=2, fence=2)
    assert log.prepare(6, "u6 of epoch 2", epoch=2)
    assert not log.prepare(6, "u6 of epoch 3", epoch=3)
    assert log.prepared == [(6, "u6 of epoch 2")] and log.fence == 2


def test_an_update_applied_as_a_deposed_primary_leaves_a_log_a_successor_caught_up_alone():
    log = ShardLog(committed=7, epoch=3, fence=3)
    log.catch_up(epoch=4)  # the primary of epoch 4 holds version 7 of epoch 3 too
    assert not log.applied(sender=5, seq=1, version=8, epoch=3)
    assert (log.committed, log.epoch, log.seen(5, 1)) == (7, 3, None)


def test_a_request_older_than_the_clients_window_is_known_as_answered_not_new():
    """Issue 38's cut runs: a client's re-send held in a cut host's TCP buffers arrives seconds
    after the link returned, when that server is primary again and the client has had more than
    ``window`` later requests applied since. It was answered long ago; taken as new, it was
    applied twice, under two versions, on every copy."""
    log = ShardLog(window=4)
    for seq in range(1, 7):
        log.record(7, seq, version=seq)
    assert log.seen(7, 6) == 6 and log.seen(7, 3) == 3
    assert log.seen(7, 2) == 0 and log.seen(7, 1) == 0  # forgotten versions, but answered
    assert log.seen(7, 7) is None and log.seen(8, 1) is None  # new: its next, another client
    restored = ShardLog(window=4)
    restored.restore(6, log.table(), epoch=2)  # a snapshot carries the window, so the rule
    assert restored.seen(7, 1) == 0 and restored.seen(7, 7) is None


def test_a_client_started_again_under_its_sender_id_numbers_afresh_and_is_applied():
    """A request number's high 32 bits name the client's process (drawn at random): a process
    started again may number below the last one's window, and its requests are new."""
    old, new = 9 << 32, 3 << 32
    log = ShardLog(window=4)
    for n in range(1, 7):
        log.record(7, old | n, version=n)
    assert log.seen(7, old | 1) == 0  # the old process's late copy
    assert log.seen(7, new | 1) is None  # the new process's first request


def test_request_numbers_take_a_new_prefix_at_the_wrap_and_stay_new_to_the_log():
    """After 2**32 requests a client's numbers start again from 1: under the same high 32 bits
    each would be lower than the window the log remembers and be answered as a late copy (seen,
    version 0), never applied; under a new prefix the log takes them as new."""
    peers = Peers(["tcp://127.0.0.1:9"], sender=7)
    try:
        peers._next = 0xFFFFFFFF - 3  # four numbers before the wrap
        before = [peers.next_seq() for _ in range(4)]
        after = peers.next_seq()
    finally:
        peers.close()
    assert len({seq >> 32 for seq in before}) == 1 and after >> 32 != before[0] >> 32
    assert before[-1] & 0xFFFFFFFF == 0xFFFFFFFF and after & 0xFFFFFFFF == 1
    log = ShardLog(window=4)
    for version, seq in enumerate(before, 1):
        log.record(7, seq, version)
    assert log.seen(7, after) is None  # new: applied
    same_prefix = (before[0] >> 32 << 32) | 1  # the number the old wrap gave
    assert log.seen(7, same_prefix) == 0  # answered as seen: never applied
