"""The dropout kernel's masks: the rate asked for, independent units and examples, reproducible.

:func:`hogwild.model.layer_kernels.dropout_forward` keys a hash with one draw from numba's
generator per call instead of drawing every unit from it; these tests check what a mask must be
whatever makes it. Each count must lie within 6 standard deviations of its binomial mean (counts
of independent trials: pairs do not overlap), on fixed seeds, so a run is deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.model.layer_kernels import dropout_forward
from hogwild.model.random import seed_kernels

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels

UNITS = 400  # a hidden layer of Adam's MNIST model
CALLS = 500  # examples


def _masks(p: float, seed: int, units: int = UNITS, calls: int = CALLS) -> np.ndarray:
    """[calls, units] keep masks, one call per example, as the engine makes them."""
    seed_kernels(seed)
    row = np.random.default_rng(seed).normal(size=2 * units + 7).astype(np.float32)
    aux = np.zeros(row.shape[0], dtype=np.int32)
    masks = np.zeros((calls, units), dtype=np.int32)
    for call in range(calls):
        dropout_forward(row, 3, row, units + 5, aux, units, p, True)
        masks[call] = aux[units + 5 : 2 * units + 5]
    return masks


def _within(count: float, trials: int, probability: float) -> bool:
    sd = np.sqrt(trials * probability * (1.0 - probability))
    return abs(count - trials * probability) <= 6.0 * sd


@pytest.mark.parametrize("p", [0.1, 0.25, 0.5, 0.8])
def test_units_are_kept_at_the_rate_asked_for(p):
    masks = _masks(p, seed=11)
    assert _within(masks.sum(), masks.size, 1.0 - p), masks.mean()
    # every unit position and every example sees the rate, not only the total
    per_unit, per_example = masks.sum(axis=0), masks.sum(axis=1)
    assert _within(per_unit.min(), CALLS, 1.0 - p) and _within(per_unit.max(), CALLS, 1.0 - p)
    assert _within(per_example.min(), UNITS, 1.0 - p)
    assert _within(per_example.max(), UNITS, 1.0 - p)


@pytest.mark.parametrize("p", [0.25, 0.5])
def test_neighbouring_units_and_successive_examples_are_independent(p):
    """Pairs of units side by side, and the same unit in successive examples, are kept together
    at the rate of independent draws, (1 - p)^2."""
    masks = _masks(p, seed=12)
    both = (1.0 - p) ** 2
    side_by_side = masks[:, 0::2] & masks[:, 1::2]
    assert _within(side_by_side.sum(), side_by_side.size, both), side_by_side.mean()
    successive = masks[0::2] & masks[1::2]
    assert _within(successive.sum(), successive.size, both), successive.mean()
    assert len({m.tobytes() for m in masks}) == CALLS  # no two examples share a mask


def test_kept_units_are_scaled_and_dropped_units_are_zero():
    p = 0.3
    seed_kernels(5)
    x = np.random.default_rng(5).normal(size=64).astype(np.float32)
    y = np.full(64, np.nan, dtype=np.float32)
    aux = np.full(64, -1, dtype=np.int32)
    dropout_forward(x, 0, y, 0, aux, 64, p, True)
    assert set(np.unique(aux)) == {0, 1}
    np.testing.assert_allclose(y, np.where(aux == 1, x / (1.0 - p), 0.0), rtol=1e-6)


def test_a_seed_gives_the_same_masks_and_another_seed_others():
    first, again, other = _masks(0.5, seed=3), _masks(0.5, seed=3), _masks(0.5, seed=4)
    np.testing.assert_array_equal(first, again)
    assert (first != other).mean() > 0.4  # independent masks differ in half their units
