"""Non-finite values at a parameter server: refused (or counted), and never the end of it.

A reduction over a vector holding a NaN (or an overflow to infinity) has no finite result: the
server must answer it with a ``BAD_VALUE`` error, count it, and go on serving (its network thread
once re-decoded its own reply, refused the NaN scalar and died). Deltas, assigned values and
activation or error vectors holding NaN or inf are refused by default (``ps.nonfinite =
"refuse"``) and counted; ``"count"`` applies them and only counts. After each, the server still
answers ``STATUS`` and an honest push lands exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.layout import FcLayer, ModelGeometry
from hogwild_plugins.ps.sandblaster.vectors import ShardVectors
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.errors import HogwildError

pytestmark = pytest.mark.ps_kernels

N = 2048
GEOMETRY = ModelGeometry(N)  # shard_kib=4: two shards of 1024 floats


def client_for(server) -> PSClient:
    return PSClient([str(server.address)], server.options.job, client_id=1, timeout_s=2.0)


def honest_push_lands(client: PSClient, before: np.ndarray) -> np.ndarray:
    """Push ones (rule SGD, lr 1: params += 1) and check every parameter moved by exactly 1."""
    client.push_deltas(np.ones(N, np.float32))
    after = np.empty(N, np.float32)
    client.pull(after)
    np.testing.assert_array_equal(after, before + 1.0)
    return after


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_deltas_are_refused_by_default_and_counted(bad):
    with local_server(GEOMETRY, shard_kib=4) as server, client_for(server) as c:
        params = np.zeros(N, np.float32)
        delta = np.ones(N, np.float32)
        delta[[500, 1500]] = bad  # one in each shard: each shard's piece is refused
        with pytest.raises(HogwildError, match="not finite"):
            c.push_deltas(delta)
        with pytest.raises(HogwildError, match="not finite"):
            c.assign(delta)
        with pytest.raises(HogwildError, match="not finite"):
            c.push_deltas(delta, into="grad")
        status = c.status()[0]
        assert status["nonfinite"] == {"refused": 6, "applied": 0}
        assert status["errors"]["BAD_VALUE"] == 6
        assert ShardVectors(c).asum("grad") == 0.0  # nothing landed in the vector
        honest_push_lands(c, params)


def test_nonfinite_vector_push_is_refused():
    geometry = ModelGeometry(N, (FcLayer(layer=0, offset=0, n_in=16, n_out=32),))
    with local_server(geometry, shard_kib=4) as server, client_for(server) as c:
        activations = np.ones((2, 16), np.float32)
        errors = np.ones((2, 32), np.float32)
        errors[1, 3] = np.nan
        with pytest.raises(HogwildError, match="not finite"):
            c.push_vectors(0, activations, errors, lr=0.1)
        out = np.empty(geometry.n_params, np.float32)
        c.pull(out)
        assert np.isfinite(out).all()
        assert c.status()[0]["nonfinite"]["refused"] >= 1  # each shard of W holding a NaN


def test_an_overflowing_reduction_is_an_error_and_the_server_goes_on():
    with local_server(GEOMETRY, shard_kib=4) as server, client_for(server) as c:
        v = ShardVectors(c)
        v.fill("big", 3e38)
        v.scale(10.0, "big")  # finite operands, an infinite result: no attacker needed
        with pytest.raises(HogwildError, match="not finite"):
            v.amax("big")
        assert server.router.alive, "the network thread died"
        assert c.status()[0]["errors"]["BAD_VALUE"] == 2  # one per shard
        honest_push_lands(c, np.zeros(N, np.float32))


def test_count_mode_applies_and_a_nan_reduction_is_an_error_not_the_end():
    with local_server(GEOMETRY, shard_kib=4, nonfinite="count") as server, client_for(server) as c:
        v = ShardVectors(c)
        delta = np.zeros(N, np.float32)
        delta[7] = np.nan
        c.push_deltas(delta, into="grad")  # applied (to shard 0), counted
        assert c.status()[0]["nonfinite"] == {"refused": 0, "applied": 1}
        for reduction in (lambda: v.amax("grad"), lambda: v.dot("grad", "grad")):
            with pytest.raises(HogwildError, match="not finite"):
                reduction()
        # an overflow to infinity from finite values: the same answer
        v.fill("big", 3e38)
        v.scale(10.0, "big")
        with pytest.raises(HogwildError, match="not finite"):
            v.asum("big")
        assert server.router.alive, "the network thread died"
        status = c.status()[0]
        assert status["errors"]["BAD_VALUE"] == 1 + 1 + 2  # grad's NaN is in shard 0 only
        honest_push_lands(c, np.zeros(N, np.float32))


def test_the_nonfinite_option_is_checked():
    with pytest.raises(HogwildError, match="nonfinite"):
        with local_server(GEOMETRY, shard_kib=4, nonfinite="ignore"):
            pass


def test_a_vector_operation_that_would_make_the_parameters_nonfinite_is_refused():
    init = np.linspace(-1, 1, N).astype(np.float32)
    with local_server(GEOMETRY, shard_kib=4, initial=init) as server, client_for(server) as c:
        v = ShardVectors(c)
        v.fill("big", 3e38)
        with pytest.raises(HogwildError, match="not finite"):
            v.axpy(10.0, "big", "params")  # params += 3e39: infinity
        with pytest.raises(HogwildError, match="not finite"):
            v.scale(1e39, "params")  # beyond float32: every parameter overflows
        params = np.empty(N, np.float32)
        c.pull(params)
        np.testing.assert_array_equal(params, init)  # untouched: restored as it was
        assert c.status()[0]["nonfinite"]["refused"] == 4  # two operations on two shards
        honest_push_lands(c, init)
