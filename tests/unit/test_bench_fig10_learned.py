"""The Fig. 10 benchmark counts only runs that learned: a row whose run (or control) stayed
below the accuracy floor gives no ratio toward the target, keeps the target unmet, and is not a
size its configuration "trains efficiently"."""

from __future__ import annotations

import pytest

from bench.figures import adam_fig10_partitions as fig10
from bench.support.grown_model import accuracy_of


def row(factor, partitions, rate, accuracy, control_accuracy=0.8, control_rate=100.0):
    args = fig10.parse_args([])
    connections = factor * 10_000_000
    return {
        "factor": factor,
        "connections": connections,
        "partitions": partitions,
        "examples_per_s": rate,
        "connections_per_s": rate * connections,
        "ratio_to_control": rate / control_rate,
        "test_accuracy": accuracy,
        "control_test_accuracy": control_accuracy,
        "learned": fig10.learned(args, accuracy, control_accuracy),
    }


def test_a_row_learned_only_when_the_run_and_its_control_reach_the_floor():
    args = fig10.parse_args(["--learned-floor", "0.6"])
    assert args.learned_floor == 0.6
    assert fig10.learned(args, 0.6, 0.9)
    assert not fig10.learned(args, 0.085, 0.9)  # diverged: one class predicted
    assert not fig10.learned(args, 0.9, 0.5)
    assert accuracy_of({}) == 0.0  # a run that reports no accuracy does not count


def test_the_default_floor_and_in_flight_are_stated():
    from hogwild.config import load_config

    args = fig10.parse_args([])
    assert args.learned_floor == fig10.LEARNED_FLOOR == 0.5
    assert args.in_flight == load_config(None).train.in_flight


def test_rows_that_did_not_learn_give_no_ratio_and_keep_the_target_unmet():
    rows = [
        row(16, 2, 95.0, 0.085),  # diverged, fast
        row(32, 2, 90.0, 0.81),
        row(40, 2, 80.0, 0.79),
        row(40, 1, 50.0, 0.78),
    ]
    found = fig10.targets(rows)
    assert found["two_partitions_over_control_at_100M"] == pytest.approx(0.80)
    assert found["rows_counted"] == 2
    assert found["not_learned"] == [16]
    assert found["met"] is False


def test_the_target_is_met_when_every_large_row_learned_above_the_ratio():
    rows = [row(16, 2, 95.0, 0.8), row(32, 2, 90.0, 0.81), row(4, 2, 10.0, 0.085)]
    found = fig10.targets(rows)  # the small diverged row is below 100 M: not a target row
    assert found["not_learned"] == [] and found["rows_counted"] == 2
    assert found["two_partitions_over_control_at_100M"] == pytest.approx(0.90)
    assert found["met"] is True
    rows.append(row(40, 2, 95.0, 0.8, control_accuracy=0.09))  # its control diverged
    assert fig10.targets(rows)["met"] is False


def test_largest_efficient_ignores_rows_that_did_not_learn():
    rows = [
        row(1, 2, 100.0, 0.8),
        row(4, 2, 24.0, 0.8),  # 96 % of factor 1's connections/s: still efficient
        row(16, 2, 10.0, 0.085),  # the best connections/s (1.6e9), but diverged
        row(1, 1, 5.0, 0.09),
    ]
    found = fig10.largest_efficient(rows)
    assert found["2"] == 40_000_000
    assert found["1"] is None  # no 1-partition row learned


def test_partitioned_runs_divide_the_learning_rate_by_their_examples_in_flight_unless_told():
    plain = fig10.parse_args(["--in-flight", "4", "--no-lr-over-in-flight"])
    assert fig10.partitioned(plain, 4)[-1] == "--optim.lr=0.003"
    scaled = fig10.parse_args(["--in-flight", "4"])
    assert fig10.partitioned(scaled, 4)[-1] == "--optim.lr=0.00075"
    assert fig10.partitioned(scaled, 1)[-1] == "--optim.lr=0.003"
    command = fig10._command(scaled, 16, fig10.partitioned(scaled, 4))
    lrs = [option for option in command if option.startswith("--optim.lr=")]
    assert lrs[-1] == "--optim.lr=0.00075"  # after the paper job's: the last one wins


def test_repeated_runs_give_median_rates_the_median_ratio_and_the_lowest_accuracy():
    """``--repeats 3``: each 2-partition run is compared with the control run just before it;
    the 2-partition row reports the median rates, the median of those ratios, every run, and
    the lowest test accuracy of its runs (each must have learned)."""
    args = fig10.parse_args(["--repeats", "3", "--in-flight", "2"])

    def run(rate, accuracy=0.8):
        return {"examples_per_s": rate, "test_accuracy": accuracy}

    one = run(50.0)
    controls = [[run(60.0), run(60.0)], [run(40.0), run(40.0)], [run(55.0), run(55.0, 0.7)]]
    twos = [run(90.0), run(70.0, 0.6), run(99.0)]
    (row1, row2), median_run = fig10.size_rows(args, 1, one, controls, twos)
    assert [r["ratio"] for r in row2["runs"]] == [90 / 120, 70 / 80, 99 / 110]
    assert row2["ratio_to_control"] == pytest.approx(70 / 80)  # not 90 / 110
    assert median_run is twos[0] and row2["examples_per_s"] == 90.0
    assert row1["control_examples_per_s"] == row2["control_examples_per_s"] == 110.0
    assert row2["test_accuracy"] == 0.6 and row2["control_test_accuracy"] == 0.7
    assert row1["ratio_to_control"] == pytest.approx(50 / 110)
    assert row2["lr"] == 0.0015 and row1["lr"] == 0.003


def test_repeats_must_be_positive():
    with pytest.raises(SystemExit):
        fig10.parse_args(["--repeats", "0"])


def test_an_even_number_of_repeats_reports_the_lower_middle_runs():
    """Each reported median is one run's own: of two, the lower."""
    args = fig10.parse_args(["--repeats", "2", "--in-flight", "2"])

    def run(rate):
        return {"examples_per_s": rate, "test_accuracy": 0.8}

    controls = [[run(60.0), run(60.0)], [run(50.0), run(50.0)]]
    twos = [run(100.0), run(80.0)]
    (_, row2), median_run = fig10.size_rows(args, 1, run(50.0), controls, twos)
    assert row2["control_examples_per_s"] == 100.0  # not 110
    assert row2["examples_per_s"] == 80.0 and median_run is twos[1]
    assert row2["ratio_to_control"] == pytest.approx(80 / 100)  # of 0.833 and 0.8, the lower
