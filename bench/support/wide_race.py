"""The wide model's race: which of two contenders reached the same test accuracy first.

Adam's Fig. 10 benchmark (``bench/figures/adam_fig10_partitions.py``) races 2 partitions of a
wide fully connected model against 2 data-parallel replicas through a parameter server. Each run
trains short epochs, each evaluated, so its learning curve is the test accuracy over its training
seconds so far. This module holds what the race decides from those curves, with no process of its
own: the curve, when a run first reached an accuracy (an interval: between the evaluated point
before and the first at or above it), who was first at the accuracy both reach and at 99 % of it
(where a plateau's noise decides less often), the order in which repeated races run, what each
run trained with, and the verdict over the races (the majority, the tally, and the paired ratios
of the seconds each took).
"""

from __future__ import annotations

import statistics

PARTITIONS = "two_partitions"
REPLICAS = "two_replicas_through_ps"
# The common accuracy is the top of the lower run's plateau, where a point's noise (a few test
# images) decides which run touched it first; the time to 99 % of it is reported beside it.
NEAR_FRACTION = 0.99


def wide_layers(units: int) -> str:
    """The wide fully connected model as a ``--model.layers`` TOML inline array."""
    return (
        f'--model.layers=[{{type = "fc", units = {units}}}, {{type = "relu"}}, '
        f'{{type = "fc", units = {units}}}, {{type = "relu"}}, {{type = "fc", units = 10}}, '
        '{type = "softmax"}]'
    )


def epochs_of(records: list[dict]) -> list[dict]:
    """The epoch records among a run's metrics records
    (:func:`~hogwild.training.metrics.read_metrics`)."""
    return [r for r in records if r.get("event") == "epoch"]


def learning_curve(epochs: list[dict]) -> list[dict]:
    """A run's evaluated points: after each epoch, the examples and training seconds so far
    (evaluations and start-up excluded) and the test accuracy there."""
    curve, examples, seconds = [], 0, 0.0
    for epoch in epochs:
        examples += int(epoch["examples"])
        seconds += float(epoch["train_s"])
        accuracy = epoch.get("test_accuracy")
        if accuracy is None:
            raise RuntimeError(f"the wide run's epoch {epoch['epoch'] + 1} was not evaluated")
        curve.append({"examples": examples, "train_s": seconds, "test_accuracy": float(accuracy)})
    return curve


def time_to_accuracy(curve: list[dict], accuracy: float) -> tuple[float | None, float]:
    """When a run first reached ``accuracy``: the training seconds at its first evaluated point
    at or above it (None: never), and at the point before, where it was still below (0.0 for the
    first point): it got there between the two."""
    before = 0.0
    for point in curve:
        if point["test_accuracy"] >= accuracy:
            return point["train_s"], before
        before = point["train_s"]
    return None, before


def partitions_faster(found: dict, accuracy: str = "common") -> bool | None:
    """Whether 2 partitions reached the common accuracy first: True when they had it at an
    evaluated point before the replicas' last point below it, False the other way round, None
    when the two intervals in which each crossed overlap (evaluate more often: more, shorter
    epochs) or one never reached it (it cannot be: the common accuracy is the lower best).
    ``accuracy="near"``: the same at :data:`NEAR_FRACTION` of the common accuracy."""
    partitions, replicas = found[PARTITIONS], found[REPLICAS]
    reached, below = f"seconds_to_{accuracy}_accuracy", f"below_{accuracy}_accuracy_at_s"
    if partitions[reached] is None or replicas[reached] is None:
        return None
    if partitions[reached] <= replicas[below]:
        return True
    if replicas[reached] <= partitions[below]:
        return False
    return None


def race(found: dict[str, dict]) -> dict:
    """One race from its two runs (each with its ``curve`` and ``test_accuracy`` list): the
    accuracy both reached (the lower of their bests) and 99 % of it, each run's seconds to each
    (written into its entry), and who was first at each."""
    common_accuracy = min(max(f["test_accuracy"]) for f in found.values())
    near_accuracy = NEAR_FRACTION * common_accuracy
    for f in found.values():
        for name, level in (("common", common_accuracy), ("near", near_accuracy)):
            reached, below = time_to_accuracy(f["curve"], level)
            f[f"seconds_to_{name}_accuracy"] = reached
            f[f"below_{name}_accuracy_at_s"] = below
    return {
        "common_accuracy": common_accuracy,
        "near_accuracy": near_accuracy,
        "runs": found,
        "partitions_faster": partitions_faster(found),
        "partitions_faster_to_near": partitions_faster(found, "near"),
    }


def race_order(repeat: int) -> tuple[str, str]:
    """Who runs first in race ``repeat`` (0-based): partitions, replicas, replicas, partitions,
    and again (A B B A), so that over every four races each contender starts first twice and
    each position's mean time in the sequence is the same: a host whose speed drifts steadily
    over the races moves both alike."""
    return (PARTITIONS, REPLICAS) if repeat % 4 in (0, 3) else (REPLICAS, PARTITIONS)


def majority(verdicts: list[bool | None]) -> bool | None:
    """The verdict of more than half of all the races, undecided ones (None) counted among them:
    None when neither side has more than half."""
    for side in (True, False):
        if sum(v is side for v in verdicts) * 2 > len(verdicts):
            return side
    return None


def tally(verdicts: list[bool | None]) -> dict[str, int]:
    """How the races' verdicts split: partitions first, replicas first, undecided."""
    return {
        "partitions": sum(v is True for v in verdicts),
        "replicas": sum(v is False for v in verdicts),
        "undecided": sum(v is None for v in verdicts),
    }


def paired_ratios(races: list[dict], accuracy: str) -> list[float]:
    """Per race, the replicas' seconds to that race's common (or near) accuracy over the
    partitions' (above 1: the partitions got there first): both runs of a race are timed to the
    same level. Each run reaches both levels (each is at most its best), so every race gives a
    ratio."""
    key = f"seconds_to_{accuracy}_accuracy"
    return [r["runs"][REPLICAS][key] / r["runs"][PARTITIONS][key] for r in races]


def verdict(races: list[dict]) -> dict:
    """Repeated races' summary: at the common accuracy (the target) and at 99 % of it, the
    majority verdict, the tally, and the paired ratios of seconds with their median (the lower
    middle of an even count)."""
    found = {}
    for accuracy, suffix in (("common", ""), ("near", "_to_near")):
        verdicts = [r[f"partitions_faster{suffix}"] for r in races]
        ratios = paired_ratios(races, accuracy)
        found[f"partitions_faster{suffix}"] = majority(verdicts)
        found[f"tally{suffix}"] = tally(verdicts)
        found[f"replicas_over_partitions_seconds{suffix}"] = ratios
        found[f"median_ratio{suffix}"] = statistics.median_low(ratios)
    return found


def trained_as(records: list[dict]) -> dict:
    """What a run trained with, from the start record among its metrics records: the seed, the
    rule and rate of its own steps, and for a cluster job the servers' rule and rate and the
    replicas' push and fetch cadences (Downpour's servers apply the pushed deltas by their own
    rule)."""
    start = next((r for r in records if r.get("event") == "start"), None)
    if start is None:
        raise RuntimeError("the wide run's metrics have no start record")
    config = start["config"]
    found = {
        "seed": config["train"]["seed"],
        "rule": config["optim"]["rule"],
        "lr": config["optim"]["lr"],
    }
    if "optimizer" in start:  # a cluster job
        found.update(
            {
                "framework": start["framework"],
                "server_rule": config["ps"]["rule"],
                "server_lr": config["ps"]["lr"],
                "n_push": start.get("n_push"),
                "n_fetch": start.get("n_fetch"),
            }
        )
    return found
