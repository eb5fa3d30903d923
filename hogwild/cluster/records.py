"""What ``hogwild cluster`` writes for each epoch: the test figures, the metrics line, the
checkpoint, and at the end the job's final record.

The driver (:mod:`hogwild.cluster.driver`) pulls the servers' model at each epoch end and hands
it here with the epoch's record (:class:`EndedEpoch`). The model is evaluated on a thread of
its own (the kernels release the GIL): beside training, the next epoch starts at once and the
driver goes on polling; between epochs, the driver waits for the evaluation
(``cluster.evaluate``). Whichever it is, the epochs are written in order, each once its
evaluation is done: its metrics line (the fields of ``hogwild train``'s plus the cluster's),
its progress line, its health (:class:`~hogwild.training.health.HealthWatch`, as ``hogwild
train`` judges its epochs: weights that overflowed stop the job before they are saved, a
network at chance is warned of once) and its checkpoint (the format ``hogwild train`` writes, so
``hogwild eval`` and ``torch.nn`` load it). At most :data:`EVALUATING` epochs wait for their
evaluation; an epoch shorter than an evaluation waits for the oldest.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hogwild.blas import limit_blas_threads
from hogwild.training import checkpoint as ckpt
from hogwild.training.health import HealthWatch, TrainingDiverged
from hogwild.training.job_checkpoint import save_checkpoint
from hogwild.training.metrics import NOT_EVALUATED

EVALUATING = 2  # epochs whose evaluation may still run while the next ones train
WARMING_S = 60.0  # the longest the warm-up prediction is waited for (a cold cache compiles)


@dataclass(frozen=True)
class EndedEpoch:
    """An epoch's record before its test figures, and the model pulled at its end."""

    record: dict
    params: np.ndarray
    velocity: np.ndarray


@functools.cache
def _load_kernels() -> None:
    """Initialise numba's target (which loads SciPy's OpenBLAS, what numba's ``np.dot`` calls),
    then set every OpenBLAS now loaded to one thread per caller, as the epoch
    loop set those loaded before it ran: an OpenBLAS loaded after it would run each evaluation
    thread's sgemm on a pool of its own, its threads spinning on the replicas' cores. Once per
    process (the warm-up's and every evaluation's first step): nothing loads another after."""
    import hogwild.numba_target  # noqa: F401  numba's target, which imports SciPy's BLAS

    limit_blas_threads(1)


def merge_histograms(histograms) -> dict:
    """The sum of staleness histograms (``{bucket: count}``; a missing one counts nothing)."""
    merged: dict[str, int] = {}
    for histogram in histograms:
        for key, count in (histogram or {}).items():
            merged[key] = merged.get(key, 0) + int(count)
    return merged


class EpochRecords:
    """A job's epochs as they end: evaluated, then written in order (see the module docstring).

    Args:
        config: The job's resolved config (``output`` says where the records go).
        network: The model's network.
        data: The data the driver evaluates on (its test split, if it has one).
        n_test: Examples in the test split (0: nothing to evaluate).
        n_classes, n_train: For the checkpoint's sidecar.
        metrics: The job's metrics writer; ``progress`` its progress lines; ``live`` its
            status table, cleared before each epoch's line.
        replace_old: Remove the checkpoints already in ``output.checkpoint_dir`` before the
            first is written (``--overwrite``).
        between: The driver waits for each evaluation (``cluster.evaluate``).
        eval_threads: Threads for an evaluation.
    """

    def __init__(
        self, config, network, data, *, n_test, n_classes, n_train, metrics, progress, live,
        replace_old, between, eval_threads,
    ) -> None:  # fmt: skip
        self.config, self.network, self.data = config, network, data
        self.n_test, self.n_classes, self.n_train = n_test, n_classes, n_train
        self.metrics, self.progress, self.live = metrics, progress, live
        self.history: list[dict] = []  # the epochs' records in order (a resumed job's first)
        self.replace_old = replace_old
        self.between, self.eval_threads = between, eval_threads
        self.checkpoint: Path | None = None  # the newest written
        self.examples, self.train_s = 0, 0.0  # over the epochs this run trained
        self._evaluating: deque[tuple[EndedEpoch, Future]] = deque()  # in epoch order
        self._evaluator = ThreadPoolExecutor(1, thread_name_prefix="hogwild-evaluate")
        self._warming: threading.Thread | None = None
        self.health = HealthWatch(
            config, n_classes, network.regression, metrics, config.cluster.replicas, cluster=True
        )

    def warm(self) -> None:
        """Load the prediction kernels on a thread while the first epoch trains (the epoch loop
        calls it once half of it is trained): the first evaluation would load them (0.8 s
        instead of 0.3 here)."""
        if self.n_test and self._warming is None:  # once
            self._warming = threading.Thread(target=self._warm, name="hogwild-warm", daemon=True)
            self._warming.start()

    def _warm(self) -> None:
        # The kernels' modules load here, on the thread, and only in a job that evaluates: a
        # driver otherwise computes nothing with them, and loading numba is much of a start-up.
        from hogwild.locks import compile_lock
        from hogwild.training.api import TrainedModel

        _load_kernels()
        model = TrainedModel(self.config, self.network, np.zeros(self.network.n_params, np.float32))
        # under the host's compile lock: from a cold cache the replicas compile the same forward
        # kernels, and two processes compiling them at once on the same cores waste one of them
        with compile_lock(), contextlib.suppress(Exception):  # the evaluation reports failures
            model.predict_proba(np.zeros((1, self.network.input_size), np.uint8))

    def ended(self, ended: EndedEpoch) -> None:
        """An epoch ended: evaluate its model, and between epochs wait for it (:meth:`write`
        writes it)."""
        if self.config.train.evaluates_after(ended.record["epoch"]):
            future = self._evaluator.submit(self._test, ended)
        else:  # train.evaluate_every skips it: its record goes without test figures
            future = Future()
            future.set_result(NOT_EVALUATED)
        if self.between:  # where the driver shares the replicas' cores, an evaluation beside
            futures_wait([future])  # training ran at a third of its speed and slowed the epoch
        self.examples += ended.record["examples"]
        self.train_s += ended.record["train_s"]
        self._evaluating.append((ended, future))

    def write(self, behind: int = EVALUATING) -> None:
        """Write the records and checkpoints of the evaluated epochs, in order, waiting for the
        oldest while more than ``behind`` are not written (at most EVALUATING behind: epochs
        shorter than an evaluation wait here).

        Raises:
            TrainingDiverged: an epoch's model overflowed: its record and a ``diverged`` one are
                written, its checkpoint is not, and no later epoch is.
        """
        evaluating = self._evaluating
        while evaluating and (len(evaluating) > behind or evaluating[0][1].done()):
            ended, future = evaluating.popleft()
            record = self._record_epoch(ended, future.result())
            self.history.append(record)
            # the examples trained in all: a resumed job's history (from its checkpoint) too
            trained = sum(int(h.get("examples") or 0) for h in self.history)
            try:  # before the checkpoint: overflowed weights must not replace the last good ones
                self.health.after_epoch(record, ended.params, trained)
            except TrainingDiverged:  # the job stops here: no later epoch is written either
                evaluating.clear()
                raise
            self.checkpoint = self._save(record, ended) or self.checkpoint

    def stopped(self) -> None:
        """The job stopped (SIGTERM, Ctrl-C, a role that died): write what is already evaluated,
        and drop the evaluations not begun, without waiting (the roles must be told to stop)."""
        with contextlib.suppress(Exception):
            self.write(len(self._evaluating))
        self._evaluator.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Drop the evaluations not begun, and wait (WARMING_S at most) for the warm-up."""
        self._evaluator.shutdown(wait=False, cancel_futures=True)
        if self._warming is not None:  # one prediction: under a second from a warm cache
            self._warming.join(WARMING_S)
            self._warming = None

    def _test(self, ended: EndedEpoch) -> dict:
        """The pulled model's test figures (on the evaluation thread: touches nothing shared)."""
        if not self.n_test:
            return {}
        from hogwild.training.api import TrainedModel, evaluate_model  # the kernels: see _warm

        _load_kernels()
        started = time.perf_counter()
        model = TrainedModel(self.config, self.network, ended.params)
        tested = evaluate_model(model, self.data, self.eval_threads)
        return {**tested, "eval_s": time.perf_counter() - started}

    def _record_epoch(self, ended: EndedEpoch, tested: dict) -> dict:
        """Write an epoch's metrics line, with its test figures, and say it."""
        record = {
            **ended.record,
            "test_loss": tested.get("test_loss"),
            "test_accuracy": tested.get("test_accuracy"),
            "eval_s": tested.get("eval_s"),
        }
        if tested is NOT_EVALUATED:
            record["evaluated"] = False
        self.metrics.write(record)
        self.live.clear()
        tested_text = "no test split"
        if tested is NOT_EVALUATED:
            tested_text = "not evaluated"
        elif tested:
            tested_text = f"test accuracy {record['test_accuracy'] * 100:.2f}%"
        self.progress.line(
            f"epoch {record['epoch'] + 1}/{self.config.train.epochs}  lr {record['lr']:.4g}  "
            f"train loss {record['train_loss']:.4f}  {tested_text}  "
            f"{record['examples_per_s']:,.0f} ex/s  {record['train_s']:.1f} s"
        )
        return record

    def _save(self, record: dict, ended: EndedEpoch) -> Path | None:
        """The epoch's checkpoint, with ``output.checkpoint_dir``."""
        if not self.config.output.checkpoint_dir:
            return None
        if self.replace_old:
            ckpt.remove_checkpoints(self.config.output.checkpoint_dir)
            self.replace_old = False
        return save_checkpoint(
            self.config, self.network, ended.params, ended.velocity, record["epoch"], record,
            self.history, self.n_classes, self.n_train, self.data,
        )  # fmt: skip

    def final(self, job: dict, wall_start: float) -> dict:
        """Write every epoch still evaluating, then the job's final record (``job``: the
        cluster's own fields; ``wall_start``: ``time.perf_counter()`` as training began), and
        say it.

        Raises:
            TrainingDiverged: as :meth:`write`, for an epoch still evaluating.
        """
        self.write(0)
        wall_s = time.perf_counter() - wall_start
        history, last = self.history, self.history[-1] if self.history else {}
        rate = self.examples / self.train_s if self.train_s else 0.0
        final = {
            "event": "final",
            "connections": self.network.connections,
            "examples": self.examples,
            "examples_per_s": rate,
            "connections_per_s": rate * self.network.connections,
            "train_loss": last.get("train_loss"),
            "test_loss": last.get("test_loss"),
            "test_accuracy": last.get("test_accuracy"),
            **job,
            "epochs": self.config.train.epochs,
            "data_wait_s": sum(h.get("data_wait_s", 0.0) for h in history),
            "fetch_wait_s": sum(h.get("fetch_wait_s", 0.0) for h in history),
            "updates_per_s": last.get("updates_per_s"),
            "staleness": merge_histograms(h.get("staleness") for h in history[-1:]),
            "wall_s": wall_s,
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
            "config": self.config.to_dict(),
        }
        self.metrics.write(final)
        accuracy = final["test_accuracy"]
        self.progress.line(
            f"done: test accuracy {'n/a' if accuracy is None else f'{accuracy * 100:.2f}%'} "
            f"after {self.config.train.epochs} epochs, {rate:,.0f} examples/s, {wall_s:.1f} s"
        )
        return final
