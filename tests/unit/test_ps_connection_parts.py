"""A client's exchange cut into parts of at most half the servers' per-client request window for
any one shard (:func:`hogwild_plugins.ps.connection.parts_per_shard`): a request held back (a
NOT_PRIMARY re-route) never has a window's worth of later ones of its shard applied before it,
which the server would take for a late copy and answer unapplied."""

from __future__ import annotations

from hogwild_plugins.ps.connection import PER_SHARD_RUN, parts_per_shard
from hogwild_plugins.ps.shard_log import ShardLog

from hogwild.net.channel import Request
from hogwild.net.wire import Header, MsgType


def _requests(targets: list[int]) -> list[Request]:
    push = MsgType.PUSH_DELTAS
    return [Request(0, Header(push, target=shard, seq=n + 1)) for n, shard in enumerate(targets)]


def test_parts_keep_the_order_and_hold_at_most_the_bound_for_any_shard():
    targets = [0] * 300 + [1] * 5 + [0] * 10 + [2] * 130
    requests = _requests(targets)
    parts = parts_per_shard(requests, PER_SHARD_RUN)
    assert [r for part in parts for r in part] == requests  # nothing lost, nothing reordered
    for part in parts:
        for shard in {r.header.target for r in part}:
            assert sum(r.header.target == shard for r in part) <= PER_SHARD_RUN
    assert [len(p) for p in parts] == [128, 128, 187, 2]  # 54 of shard 0, 5 of 1, 128 of 2; 2
    assert parts_per_shard(_requests([3] * 5), PER_SHARD_RUN) == [_requests([3] * 5)]
    assert parts_per_shard([], PER_SHARD_RUN) == []


def test_the_bound_is_half_the_servers_window():
    assert 2 * PER_SHARD_RUN <= ShardLog(0).window
