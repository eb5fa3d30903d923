"""``bench/figures/adam_table1.py``'s paired comparison of an asynchronous mode with ``sync``,
against a textbook value: with 5 seeds (4 degrees of freedom) t = 2.776 is the two-sided 5 %
point of Student's t, so differences whose mean is 2.776 standard errors give p = 0.05 two-sided
and 0.025 one-sided."""

from __future__ import annotations

import math

import pytest

from bench.figures.adam_table1 import paired

T_4DF_TWO_SIDED_5PCT = 2.7764451  # Student's t, 4 degrees of freedom, 97.5th percentile


def runs(mode: str, values: dict[int, float]) -> list[dict]:
    return [{"mode": mode, "seed": s, "test_accuracy": v} for s, v in values.items()]


def test_the_paired_t_test_matches_the_textbook_five_percent_point():
    spread = [-1.2649111, -0.6324555, 0.0, 0.6324555, 1.2649111]  # sample sd 1
    mean = T_4DF_TWO_SIDED_5PCT / math.sqrt(5)  # 2.776 standard errors
    sync = {seed: 0.99 + 0.001 * seed for seed in range(1, 6)}
    async_ = {seed: sync[seed] + 0.001 * (mean + e) for seed, e in zip(sync, spread, strict=True)}
    async_[9] = 0.5  # a seed sync lacks: not paired
    result = paired(runs("async", async_) + runs("sync", sync), "async")

    assert result["seeds"] == [1, 2, 3, 4, 5] and result["against"] == "sync"
    assert result["mean_difference"] == pytest.approx(0.001 * mean)
    assert result["stdev_difference"] == pytest.approx(0.001, rel=1e-6)
    assert result["t"] == pytest.approx(T_4DF_TWO_SIDED_5PCT, rel=1e-5)
    assert result["p_two_sided"] == pytest.approx(0.05, rel=1e-4)
    assert result["p_ahead"] == pytest.approx(0.025, rel=1e-4)
    assert result["ahead_in"] == 4  # seed 1's difference is 1.24 - 1.26 < 0


def test_behind_gives_a_large_one_sided_p_and_too_few_seeds_give_none():
    sync = {1: 0.995, 2: 0.994, 3: 0.996}
    behind = {1: 0.990, 2: 0.991, 3: 0.989}
    result = paired(runs("cluster2", behind) + runs("sync", sync), "cluster2")
    assert result["t"] < 0 and result["p_ahead"] > 0.95 and result["ahead_in"] == 0
    assert paired(runs("async", {1: 0.99}) + runs("sync", {1: 0.98, 2: 0.97}), "async") is None
    level = paired(runs("async", {1: 0.75, 2: 0.5}) + runs("sync", {1: 0.5, 2: 0.25}), "async")
    assert level["t"] is None and level["p_ahead"] is None  # every difference the same
