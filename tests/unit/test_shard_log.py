"""One shard's log on a replicated parameter server (plugins/ps/shard_log.py), with no socket.

Prepares after a gap refused, re-sent prepares held once, commits in order, snapshots that are
outdated and those that are not, a primary's own updates and a newer primary's snapshot, and the
request table that answers a client's re-sends. ``tests/unit/test_bucket_role_in_sync.py`` has
the log with the bucket role (a copy that missed a prepare is dropped, caught up and taken back).
"""

from __future__ import annotations

from hogwild_plugins.ps.shard_log import ShardLog


def test_a_copy_refuses_a_prepare_after_a_gap_and_holds_nothing_of_it():
    log = ShardLog(committed=3)
    assert log.prepare(4, "u4")
    assert not log.prepare(6, "u6")  # 5 went missing
    assert log.last == 4 and log.prepared == [(4, "u4")]


def test_a_resent_prepare_is_accepted_once():
    log = ShardLog(committed=3)
    assert log.prepare(4, "u4") and log.prepare(5, "u5")
    assert log.prepare(4, "u4 again") and log.prepare(5, "u5 again")
    assert log.prepare(3, "already committed")
    assert log.prepared == [(4, "u4"), (5, "u5")] and log.committed == 3


def test_commit_hands_out_the_prepared_items_in_order_up_to_the_version():
    log = ShardLog(committed=3)
    for v in (4, 5, 6):
        log.prepare(v, f"u{v}")
    assert log.commit(5, epoch=2) == ["u4", "u5"]
    assert log.committed == 5 and log.last == 6 and log.epoch == 2
    assert log.commit(5, epoch=2) == []  # committed already: nothing twice
    assert log.committed == 5
    assert log.commit(6, epoch=2) == ["u6"] and log.committed == 6 and log.prepared == []


def test_a_late_snapshot_of_the_same_primary_is_outdated_and_a_newer_epochs_never_is():
    log = ShardLog()
    log.restore(10, [], epoch=3)  # the primary of epoch 3 synced this copy at version 10
    for v in (11, 12):
        log.prepare(v, f"u{v}")
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
    log.prepare(4, "u4")
    log.record(sender=7, seq=1, version=3)
    log.restore(10, [(8, 2, 9), (8, 3, 10)], epoch=1)
    assert log.committed == 10 and log.prepared == [] and log.last == 10
    assert log.seen(7, 1) is None
    assert log.seen(8, 3) == 10
    assert log.table() == [(8, 2, 9), (8, 3, 10)]
    assert log.prepare(11, "u11")  # and it goes on from the snapshot


def test_the_request_table_answers_resends_and_forgets_a_clients_oldest_beyond_its_window():
    log = ShardLog(window=2)
    assert log.seen(1, 1) is None
    log.record(1, 1, version=1)
    log.record(1, 2, version=2)
    assert log.seen(1, 1) == 1 and log.seen(1, 2) == 2
    assert log.seen(2, 1) is None  # another client's seq 1 is another request
    log.record(1, 3, version=3)
    assert log.seen(1, 1) is None and log.seen(1, 2) == 2 and log.seen(1, 3) == 3
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
