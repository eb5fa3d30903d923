"""``judge_epoch`` (hogwild/training/health.py) on epoch records as the trainer writes them: a
loss that is NaN or infinite, or weights that are, is a divergence naming the epoch
(``weights_finite`` finds one NaN or infinity among the weights); a classifier whose loss sits at
ln(classes) with an accuracy no better than guessing is at chance once it has trained
``AT_CHANCE_AFTER`` updates, not before, with three classes or more (not two); a live network's
first epoch, a hard dataset's slow one, a regression and an unmeasured loss are fine. The trainer
acting on it (no checkpoint of overflowed weights, the warning given once, the hints) is
tests/proc/test_checkpoint_runs.py's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hogwild.training.health import AT_CHANCE_AFTER, judge_epoch, weights_finite


def record(loss, accuracy=0.1, epoch=0):
    return {"epoch": epoch, "train_loss": loss, "train_accuracy": accuracy}


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_a_loss_that_is_not_a_number_is_a_divergence_naming_the_epoch(loss):
    verdict = judge_epoch(record(loss, epoch=2), 10, regression=False)
    assert verdict.kind == "diverged"
    assert verdict.message.startswith(f"after epoch 3 the loss is {loss}: training overflowed")


def test_weights_that_are_not_numbers_are_a_divergence_whatever_the_loss_says():
    # the kernels floor a NaN probability at 1e-30: an overflowed network's loss is 69.08
    verdict = judge_epoch(record(69.08, 0.1), 10, regression=False, finite=False, updates=5)
    assert verdict.kind == "diverged"
    assert verdict.message.startswith("after epoch 1 the weights hold NaN or infinite values")
    assert judge_epoch(record(50.0, None), 0, regression=True, finite=False).kind == "diverged"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_weights_finite_finds_one_value_that_is_not_a_number(bad):
    weights = np.random.default_rng(0).standard_normal(100_003).astype(np.float32)
    weights[[0, -1]] = np.finfo(np.float32).max  # the largest finite values do not overflow it
    assert weights_finite(weights)
    weights[77_777] = bad
    assert not weights_finite(weights)


def test_a_dead_classifier_is_at_chance():
    # what a dead MNIST network measured: the labels' entropy, the most frequent class's share
    dead = record(2.3013, 0.1124, epoch=4)
    assert judge_epoch(dead, 10, regression=False, updates=AT_CHANCE_AFTER - 1).kind == "ok"
    verdict = judge_epoch(dead, 10, regression=False, updates=AT_CHANCE_AFTER)
    assert verdict.kind == "at_chance"
    assert "epoch 5's training loss 2.3013 is at chance (ln 10 = 2.3026)" in verdict.message
    assert "11.2 %" in verdict.message


@pytest.mark.parametrize(
    ("loss", "accuracy"),
    [
        (0.31, 0.91),  # a live network's first epoch
        (1.95, 0.30),  # a hard dataset's slow first epoch: below 0.95 ln 10
        (2.29, 0.35),  # near chance in loss, but its accuracy is learning
    ],
)
def test_a_learning_classifier_is_fine(loss, accuracy):
    assert judge_epoch(record(loss, accuracy), 10, False, updates=10**6).kind == "ok"


def test_three_classes_are_judged_and_two_are_not():
    dead = record(1.0986, 0.34)  # three classes: ln 3, a third right
    assert judge_epoch(dead, 3, regression=False, updates=10**6).kind == "at_chance"
    slow = record(0.673, 0.6)  # two classes, labels 60/40: a slow start sits where a dead one does
    assert judge_epoch(slow, 2, regression=False, updates=10**6).kind == "ok"


def test_a_regression_has_no_chance_level_and_an_unmeasured_loss_says_nothing():
    assert judge_epoch(record(50.0, None), 0, regression=True, updates=10**6).kind == "ok"
    assert judge_epoch(record(None, None), 10, regression=False, updates=10**6).kind == "ok"
