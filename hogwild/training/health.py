"""Whether a run is still learning, judged at each epoch's end from what the epoch measured.

Two failures an asynchronous trainer meets that a user must not have to find in a plot after
sixty epochs:

* **the weights are no longer numbers**: they overflowed to infinity or NaN. The training loss
  does not always say so (the kernels' loss floors a NaN probability at 1e-30: 69.08 per
  example), so the weights are looked at. Nothing trained after this can learn, and a
  checkpoint of these weights would replace the last good one, so the run stops with an error
  naming the epoch and the checkpoints it keeps (:class:`TrainingDiverged`).
* **a classifier at chance**: the training loss stays at the entropy of the labels, about
  ``ln(classes)``, and the accuracy at the most frequent class's share. An early blow-up killed
  every unit of a layer (their inputs all below zero, a ReLU passes no gradient back), so the
  network predicts one class from its biases and never recovers. A deliberately tiny learning
  rate looks the same for a while, and every network starts at chance, so this is a warning,
  given once, and only after :data:`AT_CHANCE_AFTER` updates (a live network is well below
  chance by then).

:func:`judge_epoch` decides from an epoch's record and does no I/O; :class:`HealthWatch` is
what a trainer (the engine's, a partitioned replica's leader, a cluster job's driver with the
servers' model) calls at each epoch end: it writes what the judge said (a metrics record, the
warning, the error) with what to try.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hogwild.config import Config
from hogwild.errors import HogwildError
from hogwild.logs import role_logger

__all__ = [
    "AT_CHANCE_AFTER", "AT_CHANCE_LOSS", "AT_CHANCE_ACCURACY", "HealthWatch", "TrainingDiverged",
    "Verdict", "judge_epoch", "weights_finite",
]  # fmt: skip

# At chance: the mean training loss at least this fraction of ln(classes) (a dead MNIST network
# sits at 2.30 of 2.30; a live one ends its first epoch below 0.5, a hard dataset's first epoch
# near 0.85 of it) and the training accuracy below this many times 1/classes (a dead network
# scores its most frequent class's share, 0.11 on MNIST).
AT_CHANCE_LOSS = 0.95
AT_CHANCE_ACCURACY = 2.0
AT_CHANCE_AFTER = 10_000  # updates (examples / batch) the run has trained before it is judged


class TrainingDiverged(HogwildError):
    """The weights (or the training loss) became NaN or infinite: the run stopped before
    saving those weights."""


@dataclass(frozen=True)
class Verdict:
    """What an epoch's end says about the run: ``ok``, ``diverged`` or ``at_chance``."""

    kind: str
    message: str = ""


def weights_finite(params: np.ndarray) -> bool:
    """Whether every weight is a finite number: one pass, no copy (a float64 sum of float32
    values cannot overflow, so it is finite exactly when every value is)."""
    return math.isfinite(float(np.add.reduce(params, dtype=np.float64)))


def judge_epoch(
    record: dict,
    n_classes: int,
    regression: bool,
    finite: bool = True,
    updates: int = 0,
) -> Verdict:
    """Judge one epoch from its metrics record (``epoch`` from 0, ``train_loss``,
    ``train_accuracy``) and the weights it ended with.

    Args:
        record: The epoch's record as the trainer wrote it.
        n_classes: The classifier's classes (ignored for a regression).
        regression: Whether the loss is a mean squared error (no chance level to sit at).
        finite: Whether every weight is finite (:func:`weights_finite`).
        updates: The updates the run has trained so far, this epoch's included.

    Two classes are never judged at chance: a slow start on a hard or unbalanced binary task
    (labels 60/40: an entropy of 0.673 of ln 2's 0.693) sits where a dead network does.
    """
    epoch, loss = record["epoch"], record["train_loss"]
    if not finite or (loss is not None and not math.isfinite(loss)):
        what = "the weights hold NaN or infinite values" if not finite else f"the loss is {loss}"
        return Verdict(
            "diverged",
            f"after epoch {epoch + 1} {what}: training overflowed and nothing trained from "
            "these weights can learn",
        )
    if loss is None or regression or n_classes < 3 or updates < AT_CHANCE_AFTER:
        return Verdict("ok")
    chance = math.log(n_classes)
    accuracy = record.get("train_accuracy")
    if loss >= AT_CHANCE_LOSS * chance and (
        accuracy is None or accuracy < AT_CHANCE_ACCURACY / n_classes
    ):  # (three classes: below 2/3, right where guessing ends)
        return Verdict(
            "at_chance",
            f"epoch {epoch + 1}'s training loss {loss:.4f} is at chance (ln {n_classes} = "
            f"{chance:.4f}) and its accuracy {accuracy * 100 if accuracy is not None else 0:.1f} % "
            f"no better than guessing: the network is not learning (an early blow-up can kill "
            "every unit of a layer; it does not recover)",
        )
    return Verdict("ok")


class HealthWatch:
    """A run's epoch ends judged and acted on: the error, the warning (once), the records.

    Args:
        config: The job (its settings are named in what to try).
        n_classes: The classifier's classes.
        regression: Whether the loss is a mean squared error.
        metrics: Where the run's records go (``write(dict)``).
        workers: The run's workers (named in what to try).
        cluster: A ``hogwild cluster`` job's driver judges the servers' model: what to try names
            its replicas (``workers`` then counts them) instead of the workers and the store,
            and the warning is the cluster's.
    """

    def __init__(
        self, config: Config, n_classes: int, regression: bool, metrics, workers: int,
        cluster: bool = False,
    ) -> None:  # fmt: skip
        self.config, self.n_classes, self.regression = config, n_classes, regression
        self.metrics, self.workers, self.cluster = metrics, workers, cluster
        self.warned_at_chance = False  # a classifier at chance is told once, not every epoch

    def after_epoch(self, record: dict, params: np.ndarray, trained: int) -> None:
        """Judge the epoch that ``record`` measured, ending with ``params`` (every worker idle)
        after ``trained`` examples in all, this epoch's included. Call it before the epoch's
        checkpoint.

        Raises:
            TrainingDiverged: the weights or the loss overflowed; nothing of them was saved.
        """
        updates = trained // self.config.train.batch
        verdict = judge_epoch(record, self.n_classes, self.regression, weights_finite(params),
                              updates)  # fmt: skip
        if verdict.kind == "ok" or (verdict.kind == "at_chance" and self.warned_at_chance):
            return
        train, optim = self.config.train, self.config.optim
        flag = "cluster.replicas" if self.cluster else "train.workers"
        fewer = f"fewer --{flag} (now {self.workers})"
        if verdict.kind == "diverged":
            hints = (
                f"; try a lower --optim.lr (now {optim.lr:g}), {fewer} or a longer "
                f"--optim.warmup_epochs (now {optim.warmup_epochs})"
            )
        elif self.cluster:  # a dead network: what killed it early (many replicas, a rate)
            hints = (
                f"; unless the learning rate is meant to be tiny, try {fewer} or a lower "
                f"--optim.lr (now {optim.lr:g})"
            )
        else:  # ... or copies whose first deltas agreed
            hints = (
                f"; unless the learning rate is meant to be tiny, try {fewer}, "
                f"--train.parameters=shared (now {train.parameters!r}) or a lower --optim.lr "
                f"(now {optim.lr:g})"
            )
        message = verdict.message + hints
        self.metrics.write({"event": verdict.kind, "epoch": record["epoch"], "message": message})
        if verdict.kind == "diverged":
            kept = "the checkpoints written before it are kept as they were"
            if not self.config.output.checkpoint_dir:
                kept = "no checkpoint was asked for"
            raise TrainingDiverged(f"{message}. The run stopped; {kept}")
        self.warned_at_chance = True
        role_logger("cluster" if self.cluster else "train").warning(message)
