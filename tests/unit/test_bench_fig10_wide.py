"""The Fig. 10 benchmark's wide model compares the two contenders by a real time to accuracy:
each run's learning curve (test accuracy after every short epoch, over its training seconds so
far), the first evaluated point at or above the accuracy both reach, and the point before it,
where the run was still below; the partitions are faster only when the intervals in which each
crossed do not overlap the wrong way; repeated races decide by their majority."""

from __future__ import annotations

import json

import pytest

from bench.figures import adam_fig10_partitions as fig10
from bench.support import wide_race
from bench.support.paper_job import PAPER_OVERRIDES
from bench.support.wide_race import PARTITIONS, REPLICAS
from hogwild.config import load_config
from hogwild.training.metrics import read_metrics


def epochs(*points: tuple[float, float]) -> list[dict]:
    """Epoch records of 100 examples each with these (training seconds, test accuracy)."""
    return [
        {"event": "epoch", "epoch": i, "examples": 100, "train_s": s, "test_accuracy": a}
        for i, (s, a) in enumerate(points)
    ]


def run(*points: tuple[float, float], common: float) -> dict:
    reached, below = wide_race.time_to_accuracy(wide_race.learning_curve(epochs(*points)), common)
    return {"seconds_to_common_accuracy": reached, "below_common_accuracy_at_s": below}


def test_the_curve_adds_up_examples_and_training_seconds_epoch_by_epoch():
    curve = wide_race.learning_curve(epochs((10.0, 0.5), (12.0, 0.8), (11.0, 0.9)))
    assert [p["examples"] for p in curve] == [100, 200, 300]
    assert [p["train_s"] for p in curve] == pytest.approx([10.0, 22.0, 33.0])
    assert [p["test_accuracy"] for p in curve] == [0.5, 0.8, 0.9]


def test_a_run_is_charged_the_first_point_at_the_accuracy_not_its_whole_run():
    curve = wide_race.learning_curve(epochs((10.0, 0.5), (10.0, 0.8), (10.0, 0.95), (10.0, 0.96)))
    assert wide_race.time_to_accuracy(curve, 0.75) == (pytest.approx(20.0), pytest.approx(10.0))
    assert wide_race.time_to_accuracy(curve, 0.4) == (pytest.approx(10.0), 0.0)  # at once
    assert wide_race.time_to_accuracy(curve, 0.97) == (None, pytest.approx(40.0))  # never


def test_an_epoch_without_an_evaluation_is_refused():
    records = epochs((10.0, 0.5))
    records[0]["test_accuracy"] = None
    with pytest.raises(RuntimeError, match="not evaluated"):
        wide_race.learning_curve(records)


def test_partitions_are_faster_only_when_the_crossings_do_not_overlap():
    # the partitions cross 0.74 in (10, 20] s, the replicas in (40, 50]: faster, although the
    # partitions' run is the longer one (the old end-of-run measure said slower)
    partitions = run((10.0, 0.6), (10.0, 0.8), (10.0, 0.9), (10.0, 0.91), common=0.74)
    replicas = run((25.0, 0.5), (25.0, 0.74), common=0.74)
    found = {"two_partitions": partitions, "two_replicas_through_ps": replicas}
    assert wide_race.partitions_faster(found) is True
    found["two_replicas_through_ps"] = run((5.0, 0.6), (5.0, 0.74), common=0.74)  # (5, 10]
    assert wide_race.partitions_faster(found) is False
    found["two_replicas_through_ps"] = run((15.0, 0.6), (15.0, 0.74), common=0.74)  # (15, 30]
    assert wide_race.partitions_faster(found) is None  # both crossed somewhere in (15, 20]
    found["two_partitions"] = run((10.0, 0.6), common=0.74)
    assert wide_race.partitions_faster(found) is None


def test_the_wide_runs_default_to_many_short_epochs_and_a_quick_run_has_several():
    args = fig10.parse_args([])
    assert args.wide_epochs * args.wide_examples == 30_000 and args.wide_epochs >= 10
    quick = fig10.parse_args(["--quick"])
    assert quick.wide_epochs >= 3


def test_the_wide_partitions_train_with_the_default_in_flight_at_the_paper_jobs_rate():
    runs = fig10.wide_runs(fig10.parse_args([]))
    default = load_config(None).train.in_flight
    assert runs[PARTITIONS]["in_flight"] == default
    assert runs[PARTITIONS]["lr"] == PAPER_OVERRIDES["optim.lr"] / default
    assert f"--train.in_flight={default}" in runs[PARTITIONS]["tail"]
    assert runs[REPLICAS]["in_flight"] is None  # not a partitioned run


def test_the_wide_partitions_in_flight_are_their_own_and_scale_the_rate_as_the_rows_do():
    args = fig10.parse_args(["--in-flight", "2", "--wide-in-flight", "4"])
    runs = fig10.wide_runs(args)
    partitions, replicas = runs[PARTITIONS], runs[REPLICAS]
    assert partitions["tail"] == fig10.partitioned(args, 4)  # after the paper job's options
    rate = PAPER_OVERRIDES["optim.lr"]
    assert partitions["lr"] == fig10.partitioned_lr(args, 4) == pytest.approx(rate / 4)
    assert f"--optim.lr={rate / 4:g}" in partitions["tail"] and partitions["in_flight"] == 4
    assert replicas["lr"] == rate and replicas["in_flight"] is None
    plain = fig10.parse_args(["--wide-in-flight", "4", "--no-lr-over-in-flight"])
    assert fig10.wide_runs(plain)[PARTITIONS]["lr"] == rate


def test_the_wide_races_alone_and_what_is_refused(capsys):
    alone = fig10.parse_args(["--factors=", "--sweep=", "--wide-data", "/somewhere"])
    assert alone.factors == [] and alone.sweep == [] and alone.wide_data == "/somewhere"
    assert fig10.parse_args(["--data", "/d"]).wide_data == "/d"
    assert (
        fig10.parse_args([]).wide_repeats == 4 and fig10.parse_args(["--quick"]).wide_repeats == 1
    )
    assert fig10.parse_args(["--quick", "--wide-repeats", "2"]).wide_repeats == 2
    for bad in (["--wide-repeats", "0"], ["--wide-in-flight", "0"], ["--in-flight", "0"]):
        with pytest.raises(SystemExit):
            fig10.parse_args(bad)
        assert "must be at least 1" in capsys.readouterr().err
    for bad in (["--wide-epochs", "-1"], ["--wide-examples", "0"], ["--wide-units", "0"]):
        with pytest.raises(SystemExit):
            fig10.parse_args(bad)
        assert "--wide-epochs must be at least 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fig10.parse_args(["--factors=", "--sweep=", "--wide-epochs", "0"])
    assert "nothing to measure" in capsys.readouterr().err


def test_the_same_comparison_at_99_percent_of_the_common_accuracy():
    """On a plateau the common accuracy's crossing is a coin toss; 99 % of it is not."""
    partitions = wide_race.learning_curve(epochs((10.0, 0.903), (10.0, 0.91), (10.0, 0.916)))
    replicas = wide_race.learning_curve(epochs((10.0, 0.70), (10.0, 0.85), (10.0, 0.917)))
    found = {}
    for name, curve in ((PARTITIONS, partitions), (REPLICAS, replicas)):
        found[name] = {}
        for accuracy, level in (("common", 0.916), ("near", 0.99 * 0.916)):
            reached, below = wide_race.time_to_accuracy(curve, level)
            found[name][f"seconds_to_{accuracy}_accuracy"] = reached
            found[name][f"below_{accuracy}_accuracy_at_s"] = below
    assert wide_race.NEAR_FRACTION == 0.99
    assert wide_race.partitions_faster(found) is None  # both crossed 0.916 in (20, 30]
    assert wide_race.partitions_faster(found, "near") is True  # 0.907: at 20 s against (20, 30]


def curve_run(*accuracies: float, step: float = 10.0) -> dict:
    """A run evaluated every ``step`` training seconds at these accuracies."""
    curve = wide_race.learning_curve(epochs(*((step, a) for a in accuracies)))
    return {"curve": curve, "test_accuracy": [p["test_accuracy"] for p in curve]}


def test_a_race_takes_the_lower_best_and_times_both_runs_to_it_and_to_99_percent_of_it():
    result = wide_race.race(
        {PARTITIONS: curve_run(0.90, 0.93, 0.935), REPLICAS: curve_run(0.6, 0.8, 0.92, 0.94)}
    )
    assert result["common_accuracy"] == 0.935 and result["near_accuracy"] == 0.99 * 0.935
    partitions, replicas = result["runs"][PARTITIONS], result["runs"][REPLICAS]
    assert partitions["seconds_to_common_accuracy"] == pytest.approx(30.0)
    assert replicas["seconds_to_common_accuracy"] == pytest.approx(40.0)
    assert replicas["below_common_accuracy_at_s"] == pytest.approx(30.0)
    assert partitions["seconds_to_near_accuracy"] == pytest.approx(20.0)  # 0.93 >= 0.92565
    assert result["partitions_faster"] is True and result["partitions_faster_to_near"] is True


def test_repeated_races_decide_by_a_majority_of_all_races_with_the_tally_and_paired_ratios():
    assert wide_race.majority([True, False, True]) is True
    assert wide_race.majority([False, None, False]) is False
    assert wide_race.majority([True, None, False]) is None  # no side has more than half
    assert wide_race.majority([True, None, None]) is None  # undecided races count against both
    assert wide_race.majority([True, False]) is None
    assert wide_race.majority([True, True, True, False]) is True
    assert wide_race.tally([True, None, False, True]) == {
        "partitions": 2,
        "replicas": 1,
        "undecided": 1,
    }
    ahead = {PARTITIONS: curve_run(0.9, 0.95), REPLICAS: curve_run(0.5, 0.7, 0.95)}
    behind = {PARTITIONS: curve_run(0.5, 0.7, 0.8, 0.95), REPLICAS: curve_run(0.9, 0.95)}
    races = [wide_race.race(r) for r in (ahead, behind, {k: dict(v) for k, v in ahead.items()})]
    summary = wide_race.verdict(races)
    assert summary["partitions_faster"] is True and summary["partitions_faster_to_near"] is True
    assert summary["tally"] == {"partitions": 2, "replicas": 1, "undecided": 0}
    # each race's replicas' seconds to its common accuracy (0.95) over the partitions': 30 / 20,
    # 20 / 40, 30 / 20; their median
    assert summary["replicas_over_partitions_seconds"] == pytest.approx([1.5, 0.5, 1.5])
    assert summary["median_ratio"] == pytest.approx(1.5)


def test_the_races_run_in_a_b_b_a_order():
    firsts = [wide_race.race_order(r)[0] for r in range(8)]
    assert firsts == [PARTITIONS, REPLICAS, REPLICAS, PARTITIONS] * 2
    assert all(set(wide_race.race_order(r)) == {PARTITIONS, REPLICAS} for r in range(8))
    # over four races, each contender's mean position in the sequence of eight runs is the same
    positions = {PARTITIONS: [], REPLICAS: []}
    for r in range(4):
        for i, name in enumerate(wide_race.race_order(r)):
            positions[name].append(2 * r + i)
    assert sum(positions[PARTITIONS]) == sum(positions[REPLICAS])


def test_what_a_run_trained_with_comes_from_its_start_record(tmp_path):
    config = load_config(None).to_dict()
    metrics = tmp_path / "run.jsonl"
    metrics.write_text(json.dumps({"event": "start", "config": config}) + "\n")
    assert wide_race.trained_as(read_metrics(metrics)) == {
        "seed": config["train"]["seed"],
        "rule": config["optim"]["rule"],
        "lr": config["optim"]["lr"],
    }
    metrics.write_text(json.dumps({"event": "epoch"}) + "\n")
    with pytest.raises(RuntimeError, match="no start record"):
        wide_race.trained_as(read_metrics(metrics))
