"""The wide model's race: which of two contenders reached the same test accuracy first.

Adam's Fig. 10 benchmark (``bench/figures/adam_fig10_partitions.py``) races 2 partitions of a
wide fully connected model against 2 data-parallel replicas through a parameter server. Each run
trains short epochs, each evaluated, so its learning curve is the test accuracy over its training
seconds so far. This module holds what the race decides from those curves, with no process of its
own: the curve, when a run first reached an accuracy (an interval: between the evaluated point
before and the first at or above it), who was first at the accuracy both reach and at 99 % of it
(where a plateau's noise no longer decides), and the verdict over repeated races (the majority of
their verdicts: the median race's).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

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


def epochs_of(metrics: Path) -> list[dict]:
    """The epoch records of a run's metrics file (JSON lines)."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
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


def majority(verdicts: list[bool | None]) -> bool | None:
    """The verdict of more than half the races (None when neither side has more than half:
    with an odd count of decided races, the median race's)."""
    for side in (True, False):
        if sum(v is side for v in verdicts) * 2 > len(verdicts):
            return side
    return None


def median_seconds(races: list[dict], accuracy: str) -> dict[str, float | None]:
    """Per contender, the median (the lower middle of an even count) over the races of its
    seconds to each race's own common (or near) accuracy; None when it missed it in any race."""
    found = {}
    for name in (PARTITIONS, REPLICAS):
        seconds = [r["runs"][name][f"seconds_to_{accuracy}_accuracy"] for r in races]
        found[name] = None if None in seconds else statistics.median_low(seconds)
    return found


def verdict(races: list[dict]) -> dict:
    """Repeated races' summary: the majority verdicts at the common accuracy (the target) and at
    99 % of it, and each contender's median seconds to each."""
    return {
        "partitions_faster": majority([r["partitions_faster"] for r in races]),
        "partitions_faster_to_near": majority([r["partitions_faster_to_near"] for r in races]),
        "median_seconds_to_common_accuracy": median_seconds(races, "common"),
        "median_seconds_to_near_accuracy": median_seconds(races, "near"),
    }
