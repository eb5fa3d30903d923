"""Learning-rate schedules, the warm-up included, against their formulas."""

from __future__ import annotations

import math

import pytest

from hogwild.config import OptimConfig
from hogwild.optim.schedule import epoch_rates, learning_rate, rate_within


def test_cosine_anneals_from_lr_towards_min_lr():
    optim = OptimConfig(lr=0.006, schedule="cosine", min_lr=0.0)
    rates = [learning_rate(optim, epoch, 60) for epoch in range(60)]
    assert rates[0] == pytest.approx(0.006)
    assert rates[30] == pytest.approx(0.003)
    assert rates[59] == pytest.approx(0.003 * (1 + math.cos(math.pi * 59 / 60)))
    assert all(a > b for a, b in zip(rates, rates[1:], strict=False))


def test_step_and_floor():
    optim = OptimConfig(lr=0.008, schedule="step", decay=0.5, decay_every=3, min_lr=0.0015)
    assert [learning_rate(optim, e, 12) for e in (0, 2, 3, 6, 9)] == pytest.approx(
        [0.008, 0.008, 0.004, 0.002, 0.0015]
    )


@pytest.mark.parametrize("schedule", ["constant", "step", "exponential", "cosine"])
def test_warmup_ramps_the_first_epochs_up_to_the_schedule(schedule):
    plain = OptimConfig(lr=0.006, schedule=schedule, decay=0.5)
    warm = OptimConfig(lr=0.006, schedule=schedule, decay=0.5, warmup_epochs=2)
    for epoch in range(8):
        expected = learning_rate(plain, epoch, 8) * min(1.0, (epoch + 1) / 3)
        assert learning_rate(warm, epoch, 8) == pytest.approx(expected)


def test_the_warmup_stays_above_the_floor():
    optim = OptimConfig(lr=0.006, schedule="constant", min_lr=0.004, warmup_epochs=1)
    assert learning_rate(optim, 0, 10) == pytest.approx(0.004)  # 0.003 would be below it
    assert learning_rate(optim, 1, 10) == pytest.approx(0.006)


def test_a_negative_warmup_is_refused():
    from hogwild.config import load_config
    from hogwild.errors import ConfigError

    with pytest.raises(ConfigError, match="optim.warmup_epochs must be >= 0, got -1"):
        load_config(overrides={"optim.warmup_epochs": -1})


def test_linear_reaches_min_lr_at_the_end_of_the_run():
    optim = OptimConfig(lr=0.01, schedule="linear", min_lr=0.002)
    assert [learning_rate(optim, e, 4) for e in range(5)] == pytest.approx(
        [0.01, 0.008, 0.006, 0.004, 0.002]
    )


def test_smooth_rates_move_across_the_epoch_to_the_next_epochs():
    held = OptimConfig(lr=0.01, schedule="linear")
    assert epoch_rates(held, 1, 2) == (pytest.approx(0.005), None)
    assert rate_within(0.005, None, 500, 1000) == 0.005  # held for the whole epoch
    smooth = OptimConfig(lr=0.01, schedule="linear", smooth=True)
    start, end = epoch_rates(smooth, 1, 2)
    assert (start, end) == (pytest.approx(0.005), pytest.approx(0.0))  # the run's end: min_lr
    assert [rate_within(start, end, done, 1000) for done in (0, 250, 1000, 1200)] == (
        pytest.approx([0.005, 0.00375, 0.0, 0.0])
    )
    cosine = OptimConfig(lr=0.01, schedule="cosine", smooth=True)
    assert epoch_rates(cosine, 0, 4) == (
        pytest.approx(0.01),
        pytest.approx(learning_rate(cosine, 1, 4)),
    )
