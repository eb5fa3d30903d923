"""Shards, buckets and the map; request checks; the shard book's admission and staleness."""

from __future__ import annotations

import pytest
from hogwild_plugins.ps import checks
from hogwild_plugins.ps.layout import FcLayer, LayoutError, ModelGeometry, ShardLayout, job_name
from hogwild_plugins.ps.shard import ShardBook, staleness_bin

from hogwild.net.wire import NO_BASIS, DType, ErrorCode, Header, MsgType, WireError


def test_shards_are_1mb_with_a_shorter_last_and_buckets_spread_evenly():
    layout = ShardLayout.compute(600_000, 1024, 0, ["a:1", "b:2", "c:3"])
    assert layout.shard_floats == 262_144 and layout.n_shards == 3
    assert layout.shard_range(2) == (524_288, 600_000)
    assert layout.n_buckets == 12
    per_server = [layout.map.primaries.count(s) for s in range(3)]
    assert per_server == [4, 4, 4]
    assert [layout.server_of(s) for s in range(3)] == [0, 1, 2]  # each server one shard
    assert layout.map.secondaries == ((),) * 12 and layout.map.version == 1


def test_many_shards_balance_within_one():
    layout = ShardLayout.compute(10_000_000, 16, 7, ["a:1", "b:2"])
    counts = [len(layout.shards_of(s)) for s in range(2)]
    assert abs(counts[0] - counts[1]) <= layout.n_shards // 7 + 1
    assert sum(counts) == layout.n_shards


def test_cut_splits_ranges_at_shard_boundaries():
    layout = ShardLayout.compute(10_000, 4, 0, ["a:1"])  # 1024 floats per shard
    assert layout.cut([(1000, 2100)]) == [(0, 1000, 1024), (1, 1024, 2048), (2, 2048, 2100)]
    assert layout.cut([(5, 5)]) == []
    assert len(layout.cut()) == layout.n_shards == 10
    with pytest.raises(LayoutError):
        layout.cut([(0, 10_001)])


def test_description_round_trips_and_bad_ones_are_named():
    layout = ShardLayout.compute(5000, 4, 3, ["a:1", "b:2"], [FcLayer(4, 100, 10, 20)])
    again = ShardLayout.from_description(layout.describe(), "server x")
    assert again == layout
    broken = layout.describe()
    broken["map"]["primaries"] = [0, 5, 1]
    with pytest.raises(LayoutError, match="server x: map.primaries"):
        ShardLayout.from_description(broken, "server x")
    with pytest.raises(LayoutError, match="n_params"):
        ShardLayout.from_description({"n_params": "many"}, "server x")
    with pytest.raises(LayoutError, match="fewer than"):
        ShardLayout.compute(5000, 4, 1, ["a:1", "b:2"])


def test_geometry_from_the_bundled_network():
    from hogwild.config import load_config
    from hogwild.model.network import build_network

    network = build_network(load_config().model, 10)
    geometry = ModelGeometry.from_network(network)
    assert geometry.n_params == network.n_params
    fc1 = geometry.fc_layers[0]
    assert (fc1.n_in, fc1.n_out) == (320, 400)
    assert network.param("fc1.weight").offset == fc1.offset
    assert job_name(load_config().origin) == "adam_mnist"
    assert job_name("<dict>", "mine") == "mine"


def test_request_checks_name_what_is_wrong():
    layout = ShardLayout.compute(5000, 4, 0, ["a:1", "b:2"], [FcLayer(3, 1000, 10, 100)])
    geometry = ModelGeometry(5000, layout.fc_layers)
    mine = set(layout.shards_of(0))
    held = mine.__contains__
    with pytest.raises(WireError, match="does not exist") as info:
        checks.check_shard(Header(MsgType.PULL, target=9), layout, held)
    assert info.value.code == ErrorCode.BAD_TARGET
    with pytest.raises(WireError, match="held by server 1"):
        checks.check_shard(Header(MsgType.PULL, target=1), layout, held)
    with pytest.raises(WireError) as info:
        checks.check_range(1000, 100, 0, 1024)
    assert info.value.code == ErrorCode.BAD_RANGE
    # layer 3: W is 100 x 10 at [1000, 2000); shard 1 is [1024, 2048): rows 2..99
    vec = Header(
        MsgType.PUSH_VECTORS, target=1, aux=3, shape=(4, 10, 98), dtype=DType.FLOAT32, frames=2
    )
    fc, r0, length = checks.layer_rows(vec, geometry, 1024, 2048)
    assert (fc.layer, r0, length) == (3, 2, 976)
    with pytest.raises(WireError, match="not a fully connected layer"):
        checks.layer_rows(Header(MsgType.PUSH_VECTORS, aux=2, shape=(4, 10, 98)), geometry, 0, 1)
    with pytest.raises(WireError, match="takes 10 inputs"):
        checks.layer_rows(
            Header(MsgType.PUSH_VECTORS, aux=3, shape=(4, 9, 98)), geometry, 1024, 2048
        )
    with pytest.raises(WireError, match="expected 98 error rows"):
        checks.layer_rows(
            Header(MsgType.PUSH_VECTORS, aux=3, shape=(4, 10, 97)), geometry, 1024, 2048
        )
    op = Header(MsgType.VECTOR_OP, code=1)
    assert checks.parse_names(op, b"params,grad_1") == (1, ("params", "grad_1"))
    for bad in (b"params", b"a b,c", b"x" * 65 + b",y", b"\xff,y"):
        with pytest.raises(WireError) as info:
            checks.parse_names(op, bad)
        assert info.value.code == ErrorCode.BAD_NAME
    with pytest.raises(WireError, match="unknown vector operation"):
        checks.parse_names(Header(MsgType.VECTOR_OP, code=77), b"a")


def test_a_push_into_a_named_vector_checks_every_field_and_its_name():
    push = Header(
        MsgType.PUSH_DELTAS, shape=(8,), dtype=DType.FLOAT32, frames=2, aux=4, flags=NO_BASIS
    )
    assert checks.is_named_push(push) and not checks.is_named_push(push._replace(frames=1))
    checks.check_named_push(push)
    assert checks.parse_name(b"grad") == "grad"
    refusals = {
        ErrorCode.BAD_NAME: [push._replace(aux=0), push._replace(aux=65)],
        ErrorCode.BAD_HEADER: [
            push._replace(version=3),
            push._replace(flags=0),
            push._replace(code=1),
            push._replace(a=0.5),
            push._replace(b=0.5),
        ],
        ErrorCode.BAD_FRAMES: [push._replace(dtype=DType.FLOAT64), push._replace(shape=(2, 4))],
    }
    for code, headers in refusals.items():
        for header in headers:
            with pytest.raises(WireError) as info:
                checks.check_named_push(header)
            assert info.value.code == code, header
    for bad in (b"a b", b"x" * 65, b"\xff", b"", b"params", b"g,h"):
        with pytest.raises(WireError) as info:
            checks.parse_name(bad)
        assert info.value.code == ErrorCode.BAD_NAME
        named = repr(bad.decode()) if bad.isascii() else repr(bad)
        assert f"vector name {named}" in str(info.value)  # the refusal names it


def test_book_versions_staleness_and_refusals():
    book = ShardBook({0: 0, 3: 10}, staleness_rule=True, decay=0.5, max_staleness=4)
    first = book.admit(3, 10)
    assert (first.accepted, first.version, first.staleness, first.coef) == (True, 11, 0, 1.0)
    stale = book.admit(3, 8)  # computed at 8, applied at 11
    assert (stale.version, stale.staleness, stale.coef) == (12, 3, 0.125)
    refused = book.admit(3, 2)  # 10 versions stale > 4
    assert not refused.accepted and refused.version == 12 and book.refused == 1
    ahead = book.admit(0, 99)  # a basis from before a restart lost versions
    assert ahead.staleness == 0 and book.ahead == 1 and ahead.version == 1
    assert book.bump(0) == 2
    assert book.admit(0, None).staleness == 0
    assert book.histogram_labels() == {"0": 3, "2-3": 1, "8-15": 1}
    assert [staleness_bin(s) for s in (0, 1, 2, 3, 4, 7, 8, 2**40)] == [0, 1, 2, 2, 3, 3, 4, 15]


def test_book_without_the_staleness_rule_keeps_coefficient_one():
    book = ShardBook({0: 5})
    assert book.admit(0, 0).coef == 1.0 and book.admit(0, 0).staleness == 6
