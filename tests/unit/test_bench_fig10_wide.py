"""The Fig. 10 benchmark's wide model compares the two contenders by a real time to accuracy:
each run's learning curve (test accuracy after every short epoch, over its training seconds so
far), the first evaluated point at or above the accuracy both reach, and the point before it,
where the run was still below; the partitions are faster only when the intervals in which each
crossed do not overlap the wrong way."""

from __future__ import annotations

import pytest

from bench.figures import adam_fig10_partitions as fig10


def epochs(*points: tuple[float, float]) -> list[dict]:
    """Epoch records of 100 examples each with these (training seconds, test accuracy)."""
    return [
        {"event": "epoch", "epoch": i, "examples": 100, "train_s": s, "test_accuracy": a}
        for i, (s, a) in enumerate(points)
    ]


def run(*points: tuple[float, float], common: float) -> dict:
    reached, below = fig10.time_to_accuracy(fig10.learning_curve(epochs(*points)), common)
    return {"seconds_to_common_accuracy": reached, "below_common_accuracy_at_s": below}


def test_the_curve_adds_up_examples_and_training_seconds_epoch_by_epoch():
    curve = fig10.learning_curve(epochs((10.0, 0.5), (12.0, 0.8), (11.0, 0.9)))
    assert [p["examples"] for p in curve] == [100, 200, 300]
    assert [p["train_s"] for p in curve] == pytest.approx([10.0, 22.0, 33.0])
    assert [p["test_accuracy"] for p in curve] == [0.5, 0.8, 0.9]


def test_a_run_is_charged_the_first_point_at_the_accuracy_not_its_whole_run():
    curve = fig10.learning_curve(epochs((10.0, 0.5), (10.0, 0.8), (10.0, 0.95), (10.0, 0.96)))
    assert fig10.time_to_accuracy(curve, 0.75) == (pytest.approx(20.0), pytest.approx(10.0))
    assert fig10.time_to_accuracy(curve, 0.4) == (pytest.approx(10.0), 0.0)  # at once
    assert fig10.time_to_accuracy(curve, 0.97) == (None, pytest.approx(40.0))  # never


def test_an_epoch_without_an_evaluation_is_refused():
    records = epochs((10.0, 0.5))
    records[0]["test_accuracy"] = None
    with pytest.raises(RuntimeError, match="not evaluated"):
        fig10.learning_curve(records)


def test_partitions_are_faster_only_when_the_crossings_do_not_overlap():
    # the partitions cross 0.74 in (10, 20] s, the replicas in (40, 50]: faster, although the
    # partitions' run is the longer one (the old end-of-run measure said slower)
    partitions = run((10.0, 0.6), (10.0, 0.8), (10.0, 0.9), (10.0, 0.91), common=0.74)
    replicas = run((25.0, 0.5), (25.0, 0.74), common=0.74)
    found = {"two_partitions": partitions, "two_replicas_through_ps": replicas}
    assert fig10.partitions_faster(found) is True
    found["two_replicas_through_ps"] = run((5.0, 0.6), (5.0, 0.74), common=0.74)  # (5, 10]
    assert fig10.partitions_faster(found) is False
    found["two_replicas_through_ps"] = run((15.0, 0.6), (15.0, 0.74), common=0.74)  # (15, 30]
    assert fig10.partitions_faster(found) is None  # both crossed somewhere in (15, 20]
    found["two_partitions"] = run((10.0, 0.6), common=0.74)
    assert fig10.partitions_faster(found) is None


def test_the_wide_runs_default_to_many_short_epochs_and_a_quick_run_has_several():
    args = fig10.parse_args([])
    assert args.wide_epochs * args.wide_examples == 30_000 and args.wide_epochs >= 10
    quick = fig10.parse_args(["--quick"])
    assert quick.wide_epochs >= 3


def test_the_wide_partitions_train_as_the_partitioned_rows_do_and_say_so():
    args = fig10.parse_args(["--in-flight", "4"])
    runs = fig10.wide_runs(args)
    partitions, replicas = runs["two_partitions"], runs["two_replicas_through_ps"]
    assert partitions["tail"] == fig10.partitioned(args, 4)  # after the paper job's options
    assert partitions["lr"] == fig10.partitioned_lr(args, 4) == pytest.approx(0.003 / 4)
    assert "--optim.lr=0.00075" in partitions["tail"] and partitions["in_flight"] == 4
    assert replicas["lr"] == 0.003 and replicas["in_flight"] is None
    plain = fig10.wide_runs(fig10.parse_args(["--in-flight", "4", "--no-lr-over-in-flight"]))
    assert plain["two_partitions"]["lr"] == 0.003


def test_the_same_comparison_at_99_percent_of_the_common_accuracy():
    """On a plateau the common accuracy's crossing is a coin toss; 99 % of it is not."""
    partitions = fig10.learning_curve(epochs((10.0, 0.903), (10.0, 0.91), (10.0, 0.916)))
    replicas = fig10.learning_curve(epochs((10.0, 0.70), (10.0, 0.85), (10.0, 0.917)))
    found = {}
    for name, curve in (("two_partitions", partitions), ("two_replicas_through_ps", replicas)):
        found[name] = {}
        for accuracy, level in (("common", 0.916), ("near", 0.99 * 0.916)):
            reached, below = fig10.time_to_accuracy(curve, level)
            found[name][f"seconds_to_{accuracy}_accuracy"] = reached
            found[name][f"below_{accuracy}_accuracy_at_s"] = below
    assert fig10.NEAR_FRACTION == 0.99
    assert fig10.partitions_faster(found) is None  # both crossed 0.916 in (20, 30]
    assert fig10.partitions_faster(found, "near") is True  # 0.907: at 20 s against (20, 30]
