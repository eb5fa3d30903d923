"""Adam's per-worker moments to checkpoint tensors and back (:mod:`hogwild.training.moments`)."""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.config import load_config
from hogwild.errors import CheckpointError
from hogwild.model.network import build_network
from hogwild.training.moments import (
    STEP_KEY,
    keeps_moments,
    moments_shape,
    moments_state,
    restore_moments,
    saved_workers,
)


@pytest.fixture(scope="module")
def network():
    return build_network(load_config().model, 10)


def random_rows(network, workers, seed=0):
    """Moments with a value in every parameter's place (the padding between parameters, which
    no update touches, stays zero) and step counts 100, 200, ..."""
    rng = np.random.default_rng(seed)
    rows = np.zeros(moments_shape(network, workers), dtype=np.float32)
    n = network.n_params
    for row in rows:
        for part in (row[:n], row[n : 2 * n]):
            for view in network.views(part).values():
                view[...] = rng.random(view.shape, dtype=np.float32)
    rows[:, -1] = np.arange(1, workers + 1) * 100.0
    return rows


def test_only_adam_and_adamw_keep_moments():
    assert [r for r in ("sgd", "momentum", "adam", "adamw") if keeps_moments(r)] == [
        "adam",
        "adamw",
    ]


def test_moments_round_trip_through_checkpoint_tensors(network):
    rows = random_rows(network, 3)
    state = moments_state(network, rows)
    assert saved_workers(state) == 3
    n = network.n_params
    np.testing.assert_array_equal(state["conv1.weight.exp_avg.worker2"].ravel(),
                                  network.views(rows[2, :n])["conv1.weight"].ravel())  # fmt: skip
    assert (
        state["fc1.weight.exp_avg_sq.worker0"].shape
        == network.views(rows[0, :n])["fc1.weight"].shape
    )
    back = np.zeros_like(rows)
    restore_moments(network, back, state, "ck", print)
    np.testing.assert_array_equal(back, rows)


def test_another_worker_count_takes_saved_worker_w_modulo_the_saved_count(network):
    rows = random_rows(network, 2)
    said = []
    back = np.zeros(moments_shape(network, 5), dtype=np.float32)
    restore_moments(network, back, moments_state(network, rows), "ck", said.append)
    for worker in range(5):
        np.testing.assert_array_equal(back[worker], rows[worker % 2])
    assert len(said) == 1 and "w % 2" in said[0]


def test_a_checkpoint_without_moments_starts_them_at_zero_and_says_so(network):
    back = np.ones(moments_shape(network, 2), dtype=np.float32)
    said = []
    restore_moments(network, back, {"conv1.weight.momentum": np.zeros(1)}, "ck", said.append)
    assert not back.any() and "no Adam moments" in said[0]


def test_damaged_moments_are_refused_naming_the_tensor(network):
    state = moments_state(network, random_rows(network, 2))
    state["fc2.bias.exp_avg_sq.worker1"] = np.zeros(3, dtype=np.float32)
    back = np.zeros(moments_shape(network, 2), dtype=np.float32)
    with pytest.raises(CheckpointError, match=r"fc2.bias.exp_avg_sq.worker1 has shape \(3,\)"):
        restore_moments(network, back, state, "ck", print)
    del state[STEP_KEY]
    with pytest.raises(CheckpointError, match="adam_step"):
        restore_moments(network, back, state, "ck", print)
