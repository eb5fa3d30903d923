"""The parameter stores: the contract every store keeps, and the pieces of the stores with copies.

The contract (:mod:`tests.store_contract`) runs against every store that needs no server; the
parameter server's store runs it against live servers in ``tests/cluster/test_ps_store.py``.

Then: the exchange kernels against their arithmetic, the exchanger's cadences (never cutting a
unit; ramped from one example at the start, slower with more copies), fully connected layers
pushed as activation and error vectors equal to the same update pushed as deltas, the choice of
copies, the arena layout and the page placement.
"""

from __future__ import annotations

import mmap
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from hogwild.config import load_config
from hogwild.errors import ConfigError
from hogwild.model.network import build_network
from hogwild.numa.pinning import libnuma_available, memory_nodes
from hogwild.store.copies import MEMORY_SHARE, choose_copies, fc_layers
from hogwild.store.exchange import Exchanger, Home, VectorBuffer
from hogwild.store.kernels import exchange_ranges, pull_ranges, push_ranges
from hogwild.store.registry import store_class, store_names
from hogwild.store.replicate import ArenaHome
from tests.store_contract import StoreUnderTest, placements, run_contract

GB = 10**9


@pytest.fixture(scope="module")
def network():
    return build_network(load_config().model, 10)


def job(**overrides):
    return load_config(overrides=overrides)


CONTRACT = [
    pytest.param({"train.parameters": "shared"}, [0, 0], id="shared"),
    pytest.param({"train.n_push": 32}, [0, 0], id="replicate-per-worker"),
    pytest.param({"train.n_push": 32, "train.replicas": "node"}, [0, 0, 1, 1], id="per-node"),
    pytest.param({"train.n_push": 32, "train.n_fetch": 16}, [0, 0, 0], id="fetch16"),
]


@pytest.mark.parametrize(("overrides", "nodes"), CONTRACT)
def test_store_contract(network, overrides, nodes):
    run_contract(network, job(**{"train.update_every": 1, **overrides}), nodes)


def test_pull_brings_the_others_progress_and_keeps_the_own(network):
    config = job(**{"train.n_push": 64, "train.n_fetch": 64, "train.update_every": 1})
    under = StoreUnderTest(config, network, [0, 0])
    a, b = under.open_workers()
    try:
        start = np.zeros(network.n_params, dtype=np.float32)
        under.store.load(start, start)
        a.params += 1.0
        a.trained(64, None)  # a pushes (and pulls) on its cadence
        a.finish()
        b.params += 2.0  # b's own progress, not pushed yet
        b.trained(64, None)
        b.finish()
        np.testing.assert_allclose(b.params, 3.0)  # a's step arrived, b's stayed
        np.testing.assert_allclose(under.store.snapshot()[0], 3.0)  # both are home
    finally:
        under.close([a, b])


def test_registry_names_the_stores_and_rejects_unknown_ones():
    assert {"shared", "replicate", "ps"} <= set(store_names())
    with pytest.raises(ConfigError, match="train.parameters = 'nope' is not a parameter store"):
        store_class("nope")
    with pytest.raises(ConfigError, match="must be a parameter store"):
        job(**{"train.parameters": "nope"})


def test_interleave_and_exchange_every_of_older_configs_still_load():
    from hogwild.config import config_from_dict

    old = load_config().to_dict()
    old["train"].update(parameters="interleave", exchange_every=32)
    del old["train"]["n_push"], old["train"]["n_fetch"]
    for key in ("replicas", "fc_push"):
        del old["train"][key]
    assert config_from_dict(old).train.parameters == "shared"
    old["train"].update(parameters="replicate", exchange_every=32, replicas="worker")
    config = config_from_dict(old)
    assert (config.train.n_push, config.train.n_fetch, config.train.replicas) == (32, 32, "worker")


# ---------------------------------------------------------------------------- kernels


def test_exchange_kernels_do_the_arithmetic():
    rng = np.random.default_rng(0)
    start = rng.standard_normal(1000).astype(np.float32)
    home, copies, bases = start.copy(), [start.copy(), start.copy()], [start.copy(), start.copy()]
    everything = np.array([[0, 1000]], dtype=np.int64)
    steps = [rng.standard_normal(1000).astype(np.float32) * 0.01 for _ in range(3)]
    copies[0] += steps[0]
    push_ranges(home, copies[0], bases[0], everything)
    np.testing.assert_allclose(home, start + steps[0], atol=1e-6)
    np.testing.assert_array_equal(bases[0], copies[0])
    copies[1] += steps[1]
    pull_ranges(home, copies[1], bases[1], everything)  # b's step stays, a's arrives
    np.testing.assert_allclose(copies[1], start + steps[0] + steps[1], atol=1e-6)
    np.testing.assert_allclose(home, start + steps[0], atol=1e-6)  # b has not pushed yet
    exchange_ranges(home, copies[1], bases[1], everything)
    np.testing.assert_allclose(home, start + steps[0] + steps[1], atol=1e-6)
    copies[0] += steps[2]
    exchange_ranges(home, copies[0], bases[0], everything)
    expected = start + steps[0] + steps[1] + steps[2]
    np.testing.assert_allclose(home, expected, atol=1e-6)
    np.testing.assert_allclose(copies[0], expected, atol=1e-6)
    np.testing.assert_array_equal(bases[0], home)


def test_kernels_touch_only_their_ranges():
    home = np.zeros(10, dtype=np.float32)
    copy, base = np.ones(10, dtype=np.float32), np.zeros(10, dtype=np.float32)
    push_ranges(home, copy, base, np.array([[2, 4], [7, 8]], dtype=np.int64))
    assert home.tolist() == [0, 0, 1, 1, 0, 0, 0, 1, 0, 0]


# ---------------------------------------------------------------------------- the exchanger


class CountingHome(Home):
    """A home that records what the thread asked of it (and can be made to fail)."""

    def __init__(self, n):
        self.values = np.zeros(n, dtype=np.float32)
        self.calls: list[str] = []
        self.fail = False

    def push(self, copy, base, ranges):
        if self.fail:
            raise ConnectionError("parameter server 127.0.0.1:1 does not answer")
        self.calls.append("push")
        push_ranges(self.values, copy, base, ranges)

    def fetch(self):
        self.calls.append("pull")
        return self.values

    def merge(self, values, copy, base, ranges):
        pull_ranges(values, copy, base, ranges)

    def push_vectors(self, layers, buffer):
        self.calls.append(f"vectors{buffer.rows}")


def spans_of(exchanger, examples):
    spans, left = [], examples
    while left:
        spans.append(exchanger.span(left))
        exchanger.trained(spans[-1], None)
        left -= spans[-1]
    return spans


def test_cadences_fall_on_units_and_never_cut_one():
    n = 16
    copy, base = np.zeros(n, np.float32), np.zeros(n, np.float32)
    home = CountingHome(n)
    exchanger = Exchanger(home, copy, base, n_push=100, n_fetch=200, unit=32)
    try:
        spans = spans_of(exchanger, 256)
        # due after 100 (push): 128; then a pull is due after 200 - 128 = 72 examples: 96
        assert spans == [128, 96, 32] and all(s % 32 == 0 for s in spans)
        exchanger.finish()
        assert "push" in home.calls and "pull" in home.calls  # (requests may merge)
        per_example = Exchanger(home, copy, base, n_push=64, n_fetch=64, unit=1)
        per_example.trained(40, None)
        assert spans_of(per_example, 256) == [24, 64, 64, 64, 40]
        per_example.close()
    finally:
        exchanger.close()


def test_a_ramped_cadence_exchanges_every_example_first_then_grows_to_the_full_cadence():
    n = 8
    copy, base = np.zeros(n, np.float32), np.zeros(n, np.float32)
    home = CountingHome(n)
    exchanger = Exchanger(home, copy, base, n_push=8, n_fetch=8, unit=1, ramp=4)
    try:
        # the cadence is 1 + trained // 4, at most 8: 1 for the first 4 examples, then 2...
        assert spans_of(exchanger, 60) == [1, 1, 1, 1, 2, 2, 3, 3, 4, 5, 6, 8, 8, 8, 7]
        assert exchanger.cadences_now() == (8, 8)
        exchanger.finish()
    finally:
        exchanger.close()


def test_the_replicate_store_ramps_slower_with_more_copies_up_to_a_cap(network):
    for nodes, overrides, ramp in (
        ([0, 0], {}, 128),  # 64 per copy
        ([0] * 4, {}, 256),
        ([0] * 8, {}, 256),  # RAMP_CAP: the full cadence within 16,128 examples per copy
        ([0] * 4, {"train.cadence_ramp": 10}, 10),  # asked for: as asked
        ([0] * 4, {"train.cadence_ramp": 0}, 0),  # none
        ([0] * 4, {"train.replicas": "node"}, 0),  # one copy: no other copy's deltas to agree
    ):
        under = StoreUnderTest(job(**overrides), network, nodes)
        try:
            assert under.store.worker_spec(0).values["ramp"] == ramp, (nodes, overrides)
            assert under.store.describe()["cadence_ramp"] == ramp
            assert (f"one more every {ramp:,})" in under.store.summary()) == bool(ramp)
        finally:
            under.close()


def test_a_failing_home_is_raised_in_the_compute_loop_naming_it():
    copy, base = np.zeros(4, np.float32), np.zeros(4, np.float32)
    home = CountingHome(4)
    home.fail = True
    exchanger = Exchanger(home, copy, base, n_push=1, n_fetch=1, unit=1, name="worker 3 exchange")
    try:
        exchanger.trained(1, None)
        with pytest.raises(Exception, match="worker 3 exchange: .*127.0.0.1:1 does not answer"):
            exchanger.finish()
    finally:
        exchanger.close()


def test_requests_made_while_the_thread_is_busy_are_merged_not_lost():
    n = 8
    copy, base = np.zeros(n, np.float32), np.zeros(n, np.float32)
    gate = threading.Event()

    class SlowHome(CountingHome):
        def push(self, copy, base, ranges):
            gate.wait(5)
            super().push(copy, base, ranges)

    home = SlowHome(n)
    exchanger = Exchanger(home, copy, base, n_push=1, n_fetch=1000, unit=1)
    try:
        for _ in range(50):
            copy += 1.0
            exchanger.trained(1, None)  # never waits, although the thread is stuck
        gate.set()
        exchanger.finish()
        np.testing.assert_array_equal(home.values, 50.0)  # every step home exactly once
        assert home.calls.count("push") < 50
    finally:
        exchanger.close()


def fake_context(rng, network, rows):
    act = rng.standard_normal((rows, network.act_size)).astype(np.float32)
    dact = rng.standard_normal((rows, network.act_size)).astype(np.float32)
    return SimpleNamespace(act=act, dact=dact)


def test_vectors_pushed_equal_the_same_update_pushed_as_deltas(network):
    """API (b) equals API (a) with the outer products computed by the client."""
    rng = np.random.default_rng(3)
    layers = fc_layers(network)
    lr, wd, unit, n_push = 0.01, 0.0005, 8, 16
    start = rng.standard_normal(network.n_params).astype(np.float32)
    home = ArenaHome(start.copy(), layers)
    copy, base = start.copy(), start.copy()
    floats = VectorBuffer.floats(layers, n_push + unit)
    buffers = (np.zeros(floats, np.float32), np.zeros(floats, np.float32))
    exchanger = Exchanger(
        home, copy, base, n_push, 10**6, unit, layers, buffers, weight_decay=wd, batch=1
    )
    expected = start.astype(np.float64)
    try:
        exchanger.start_epoch(lr)
        for _ in range(2):  # two units of 8 examples: one push of 16 examples' vectors
            context = fake_context(rng, network, unit)
            for layer in layers:
                lo, hi = layer.weights
                w = expected[lo:hi].reshape(layer.n_out, layer.n_in)
                x = context.act[:, layer.x_off : layer.x_off + layer.n_in].astype(np.float64)
                e = context.dact[:, layer.y_off : layer.y_off + layer.n_out].astype(np.float64)
                w -= lr * wd * unit * w  # the decay of 8 per-example updates, applied once
                w -= lr * e.T @ x
            exchanger.trained(unit, context)
        exchanger.finish()
    finally:
        exchanger.close()
    for layer in layers:
        lo, hi = layer.weights
        np.testing.assert_allclose(home.home[lo:hi], expected[lo:hi], rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(base[lo:hi], copy[lo:hi])  # fc progress left as vectors
    others = np.ones(network.n_params, bool)
    for layer in layers:
        others[slice(*layer.weights)] = False
    np.testing.assert_array_equal(home.home[others], start[others])  # nothing else moved


def test_vectors_need_one_writer_per_copy(network):
    config = job(**{"train.replicas": "node", "train.fc_push": "vectors"})
    with pytest.raises(ConfigError, match="needs one writer per copy"):
        store_class("replicate")(config, network, placements([0, 0, 1, 1]))
    auto = job(**{"train.replicas": "node"})
    assert not store_class("replicate")(auto, network, placements([0, 0, 1, 1])).vectors


# ---------------------------------------------------------------------------- choices, layout


def test_copies_per_worker_while_they_fit_then_per_node_then_one():
    assert choose_copies("auto", 2, 1, 4 * 10**6, 24 * GB, 12 * GB).per == "worker"
    assert choose_copies("auto", 1, 1, 4 * 10**6, 24 * GB, 12 * GB).per == "one"
    big = 400 * 10**6 * 3  # Adam-sized: 400 MB of parameters, velocity and base
    assert choose_copies("auto", 64, 2, big, 256 * GB, 128 * GB).per == "node"
    choice = choose_copies("auto", 64, 1, big, 256 * GB, 128 * GB)
    assert choice.per == "one" and "one NUMA node" in choice.reason
    assert f"1/{MEMORY_SHARE} of memory" in choose_copies("auto", 2, 1, 10, GB, GB).reason
    assert choose_copies("worker", 64, 1, big, GB, GB).per == "worker"  # asked for: obeyed


def test_layout_puts_every_copy_on_pages_of_its_own(network):
    config = job(**{"train.replicas": "node"})
    under = StoreUnderTest(config, network, [0, 0, 1, 1])
    workers = under.open_workers()
    try:
        rows = [side.params for side in workers]
        assert rows[0].ctypes.data == rows[1].ctypes.data  # workers 0, 1 share node 0's copy
        assert rows[0].ctypes.data != rows[2].ctypes.data
        for array in (*rows, under.store.params, under.store.velocity):
            assert array.ctypes.data % mmap.PAGESIZE == 0
            assert array.shape == (network.n_params,)
        assert [hasattr(side, "exchanger") for side in workers] == [True, False, True, False]
        del rows, array
    finally:
        under.close(workers)


def test_one_worker_trains_on_the_home_copy_without_copies(network):
    under = StoreUnderTest(job(), network, [0])
    (side,) = under.open_workers()
    try:
        assert "copy_params" not in under.arena.layout.regions
        assert side.params.ctypes.data == under.store.params.ctypes.data
        assert "one worker" in under.store.summary()
    finally:
        under.close([side])


@pytest.mark.skipif(not libnuma_available(), reason="libnuma is not installed")
def test_pages_go_onto_the_workers_node(network):
    under = StoreUnderTest(job(), network, [0, 0])
    try:
        assert under.store.placed is True
        assert set(memory_nodes(under.store.params)) == {0}
    finally:
        under.close()


def test_a_node_the_kernel_does_not_know_is_reported(network):
    under = StoreUnderTest(job(**{"train.replicas": "node"}), network, [0, 7])
    try:
        assert under.store.placed is False
        assert "placed by first touch" in under.store.summary()
    finally:
        under.close()


def test_each_store_runs_its_own_cadence_and_vectors_only_where_they_are_fewer_floats(network):
    replicate = store_class("replicate")(job(), network, placements([0, 0]))
    assert (replicate.n_push, replicate.n_fetch) == (64, 64)
    assert replicate.describe()["n_push"] == 64
    remote = {"train.parameters": "ps", "ps.servers": ["10.0.0.2:5555"], "ps.rule": "adagrad"}
    served = store_class("ps")(job(**remote), network, placements([0, 0]))
    assert (served.n_push, served.n_fetch) == (512, 512)  # Downpour's Adagrad: Adam's hundreds
    assert served.describe()["n_push"] == 512
    # 512 x (320 + 400 + 400 + 400 + 400 + 10) floats of vectors > 292,000 weights: deltas
    assert served.describe()["fc_push"] == "deltas"
    with_sgd = store_class("ps")(job(**{**remote, "ps.rule": "sgd"}), network, placements([0]))
    assert with_sgd.n_push == 64 and with_sgd.describe()["fc_push"] == "vectors"
    local = {"train.parameters": "ps", "ps.servers": ["127.0.0.1:5555"], "train.n_push": 64}
    assert store_class("ps")(job(**local), network, placements([0])).describe()["fc_push"] == (
        "deltas"  # the outer products would cost this machine's own cores
    )


def test_a_store_refuses_vectors_whose_push_its_own_cadence_would_make_decay_whole(network):
    decay = {"optim.lr": 1.0, "optim.weight_decay": 1 / 64}
    config = job(**decay, **{"train.fc_push": "vectors"})
    with pytest.raises(ConfigError, match="replicate's n_push = 1: the weight decay one push"):
        store_class("replicate")(config, network, placements([0, 0]))
    deltas = store_class("replicate")(job(**decay), network, placements([0, 0]))  # no decay sent
    assert not deltas.vectors
    per_batch = job(**decay, **{"train.fc_push": "vectors", "train.batch": 32})  # 2 per push
    assert store_class("replicate")(per_batch, network, placements([0, 0])).vectors


def test_a_cadence_of_0_is_the_stores_own_and_a_set_one_is_kept():
    from hogwild.store.registry import cadences

    replicate = job()
    assert (replicate.train.n_push, replicate.train.n_fetch) == (0, 0)  # left to the store
    assert cadences(replicate) == (64, 64)
    assert cadences(job(**{"train.parameters": "ps"})) == (64, 64)  # SGD on the servers
    downpour = job(**{"train.parameters": "ps", "ps.rule": "adagrad", "train.n_fetch": 100})
    assert cadences(downpour) == (512, 100)
    assert cadences(job(**{"train.n_push": 32})) == (32, 64)


def test_a_shared_jobs_record_of_the_old_cadence_default_still_loads():
    """Checkpoints of shared jobs written while 64 was the default record n_push = 64."""
    from hogwild.config import config_from_dict

    old = load_config(overrides={"train.parameters": "shared"}).to_dict()
    old["train"].update(n_push=64, n_fetch=64)
    config = config_from_dict(old)
    assert (config.train.parameters, config.train.n_push, config.train.n_fetch) == ("shared", 0, 0)
    with pytest.raises(ConfigError, match="train.n_push = 32 does nothing"):
        config_from_dict({**old, "train": {**old["train"], "n_push": 32}})
