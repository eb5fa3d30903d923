"""The trainer: the parent process of a single-node Hogwild job (DESIGN.md, "How data flows").

It owns every shared resource of the job and releases it on every exit path: it creates the arena,
places the shared parameters on the NUMA nodes (one interleaved copy, or one per node merged at
every epoch end, :mod:`hogwild.train.parameters`), initialises (or restores) them, copies the
examples in once (idx files; a job on an LMDB image cache reads only its manifest here, and each
worker opens the cache itself), compiles the kernels, starts the workers, and then drives the
epochs: a fresh permutation per epoch, one shard per worker, an early end once ``epoch_fraction``
of the workers finished their shard (Adam section 3.2.5), evaluation on the test set split across
the workers, a checkpoint and a metrics line (with ``data_wait_s``, the seconds the workers'
compute loops waited for their data feeds). A worker that dies stops the job with
:class:`~hogwild.errors.WorkerDiedError` naming it and its exit signal; the last checkpoint stays
as it was. On any exit (normal, error, Ctrl-C) the workers are stopped (terminated, then killed, if
they do not leave) and the arena is removed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field

import numpy as np

from hogwild.config import Config
from hogwild.data.mnist import MnistData
from hogwild.errors import CheckpointError, ConfigError
from hogwild.model.compile import compile_kernels
from hogwild.model.init import initialise
from hogwild.model.network import Network, build_network
from hogwild.model.random import worker_seed
from hogwild.numa.placement import plan_parameters
from hogwild.optim.interval import update_every
from hogwild.optim.schedule import learning_rate
from hogwild.runtime import single_threaded_blas
from hogwild.shm.arena import Arena
from hogwild.shm.sweeper import sweep
from hogwild.train import checkpoint as ckpt
from hogwild.train.checkpoint import restore_parameters
from hogwild.train.gang import WorkerGang
from hogwild.train.job import (
    CONTROL_EPOCH,
    EPOCH_CLOSED,
    STAT_EXAMPLES,
    STAT_LOSS,
    CacheData,
    epoch_permutation,
    job_layout,
    plan_data,
    shard_bounds,
)
from hogwild.train.metrics import MetricsWriter
from hogwild.train.parameters import SharedParameters
from hogwild.train.placement import worker_count, worker_placements
from hogwild.train.progress import ProgressBar
from hogwild.train.worker import worker_main


@dataclass
class TrainResult:
    """What a finished job reports: the final metrics, the per-epoch history, the checkpoint."""

    metrics: dict
    history: list[dict] = field(default_factory=list)
    checkpoint: str | None = None


class Trainer:
    """Runs one job; use :func:`run_training` unless you need the pieces."""

    def __init__(self, config: Config, data: MnistData | CacheData, resume: bool = False):
        self.data = data
        self.resume = resume
        train = config.train
        self.n_workers = 1 if train.sync else worker_count(train.workers)
        config = config.override({"train.update_every": update_every(config, self.n_workers)})
        self.config = config
        self.plan, n_train, self.n_test = plan_data(config, data, self.n_workers)
        try:
            self.network: Network = build_network(config.model, self.plan.n_classes)
        except ConfigError as exc:
            if not self.plan.cache:
                raise
            raise ConfigError(
                f"{exc} (the image cache {self.plan.cache} has {self.plan.n_classes} classes)"
            ) from None
        self.n_train = min(train.subset, n_train) if train.subset else n_train
        self.progress = ProgressBar(config.output.progress, self.network.connections)
        self.metrics = MetricsWriter(config.output.metrics)
        self.placements = worker_placements(self.n_workers, train.placement)
        self.parameter_plan = plan_parameters(self.placements, train.parameters, train.replicas)
        self.arena: Arena | None = None
        self.shared: SharedParameters | None = None
        self.gang: WorkerGang | None = None

    # -- the job ---------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        sweep()  # segments of earlier jobs whose owner was killed
        try:
            return self._run()
        finally:
            self._shutdown()

    def _run(self) -> TrainResult:
        config, network = self.config, self.network
        start_epoch, history = self._prepare_arena()
        self.progress.line(
            f"hogwild: {network.connections:,} connections, {self.n_workers} worker(s), "
            f"batch {config.train.batch}, {self.n_train:,} training examples"
        )
        if self.shared.replicated:
            plan = self.parameter_plan
            where = "worker" if plan.per == "worker" else "NUMA node"
            nodes = ", ".join(map(str, self.shared.copy_nodes))
            self.progress.line(
                f"parameters: one copy per {where} (nodes {nodes}), "
                f"exchanged every {config.train.exchange_every:,} examples; pages "
                + ("bound by libnuma" if self.placed else "placed by first touch")
            )
        compile_kernels(
            network,
            config.train.batch,
            config.train.update_every,
            feed=self.plan.feed,
            exchange=self.shared.replicated,
        )
        self._start_workers()
        self.metrics.write(
            {
                "event": "start",
                "connections": network.connections,
                "workers": self.n_workers,
                "parameters": {**self.shared.describe(), "placed_by_libnuma": self.placed},
                "start_epoch": start_epoch,
                "config": config.to_dict(),
                "pid": os.getpid(),
            }
        )
        wall_start = time.perf_counter()
        train_seconds = data_wait = 0.0
        examples = 0
        checkpoint_path = None
        for epoch in range(start_epoch, config.train.epochs):
            record = self._train_epoch(epoch)
            train_seconds += record["train_s"]
            data_wait += record["data_wait_s"]
            examples += record["examples"]
            record.update(self._evaluate())
            history.append(record)
            self.metrics.write(record)
            tested = (
                f"test loss {record['test_loss']:.4f}  "
                f"test accuracy {record['test_accuracy'] * 100:.2f}%"
                if self.n_test
                else "no test split"
            )
            self.progress.line(
                f"epoch {epoch + 1}/{config.train.epochs}  lr {record['lr']:.4g}  "
                f"train loss {record['train_loss']:.4f}  {tested}  "
                f"{record['examples_per_s']:,.0f} ex/s  {record['train_s']:.1f} s"
            )
            checkpoint_path = self._checkpoint(epoch, record, history)
        wall = time.perf_counter() - wall_start
        last = history[-1] if history else {}
        rate = examples / train_seconds if train_seconds else 0.0
        final = {
            "event": "final",
            "connections": network.connections,
            "examples": examples,
            "examples_per_s": rate,
            "connections_per_s": rate * network.connections,
            "train_loss": last.get("train_loss"),
            "test_loss": last.get("test_loss"),
            "test_accuracy": last.get("test_accuracy"),
            "best_test_accuracy": max(
                (h["test_accuracy"] for h in history if h.get("test_accuracy") is not None),
                default=None,
            ),
            "workers": self.n_workers,
            "batch": config.train.batch,
            "sync": config.train.sync,
            "epochs": config.train.epochs,
            "epochs_run": config.train.epochs - start_epoch,
            "train_s": train_seconds,
            "data_wait_s": data_wait,
            "wall_s": wall,
            "checkpoint": str(checkpoint_path) if checkpoint_path else None,
            "config": config.to_dict(),
        }
        self.metrics.write(final)
        accuracy = final["test_accuracy"]
        self.progress.line(
            f"done: test accuracy "
            f"{'n/a' if accuracy is None else f'{accuracy * 100:.2f}%'} after "
            f"{config.train.epochs} epochs, {rate:,.0f} examples/s, "
            f"{final['connections_per_s'] / 1e9:.2f} G connections/s, {wall:.1f} s"
        )
        return TrainResult(final, history, final["checkpoint"])

    def _prepare_arena(self) -> tuple[int, list[dict]]:
        """Create the arena, fill it with data and initial (or restored) parameters."""
        config, network, data = self.config, self.network, self.data
        height, width, channels = self.plan.shape
        image_bytes = 0 if self.plan.cache else height * width * channels
        layout = job_layout(
            network, self.n_workers, self.n_train, self.n_test, image_bytes, self.parameter_plan
        )
        self.arena = Arena.create("train", layout)
        arena = self.arena
        self.shared = SharedParameters.attach(arena, self.parameter_plan)
        self.placed = self.shared.place()
        if image_bytes:
            arena.array("train_images")[:] = data.train_images[: self.n_train].reshape(
                self.n_train, -1
            )
            arena.array("train_labels")[:] = data.train_labels[: self.n_train]
            arena.array("test_images")[:] = data.test_images.reshape(self.n_test, -1)
            arena.array("test_labels")[:] = data.test_labels
        params, velocity = self.shared.params, self.shared.velocity
        model = config.model
        initialise(network, params, model.init, model.init_scale, config.train.seed)
        start_epoch, history = 0, []
        directory = config.output.checkpoint_dir
        if self.resume and not directory:
            raise CheckpointError("--resume needs a checkpoint directory (--checkpoint-dir DIR)")
        if self.resume and ckpt.latest_checkpoint(directory) is not None:
            restored = ckpt.load_checkpoint(directory)
            restore_parameters(network, params, restored.weights, restored.path, "")
            restore_parameters(
                network, velocity, restored.optimizer_state, restored.path, ".momentum"
            )
            start_epoch = restored.epoch + 1
            history = list(restored.info.get("history", []))
        self.shared.spread()
        return start_epoch, history

    def _start_workers(self) -> None:
        train = self.config.train
        self.gang = WorkerGang(
            mp.get_context(train.start_method), self.config.output.checkpoint_dir
        )
        layout_json, config_dict, plan = (
            self.arena.layout.to_json(),
            self.config.to_dict(),
            self.plan.to_dict(),
        )
        placements, parameter_plan = self.placements, self.parameter_plan
        with single_threaded_blas():
            self.gang.start(
                self.n_workers,
                worker_main,
                lambda w: (
                    w,
                    self.arena.name,
                    layout_json,
                    config_dict,
                    plan,
                    placements[w],
                    parameter_plan,
                ),
            )

    # -- epochs ----------------------------------------------------------------------------------

    def _train_epoch(self, epoch: int) -> dict:
        config = self.config
        arena = self.arena
        lr = learning_rate(config.optim, epoch, config.train.epochs)
        arena.array("order")[:] = epoch_permutation(config.train.seed, epoch, self.n_train)
        stats = arena.array("stats")
        control = arena.array("control")
        before = stats[:, STAT_EXAMPLES].sum()
        loss_before = stats[:, STAT_LOSS].sum()
        control[CONTROL_EPOCH] = epoch
        shards = shard_bounds(self.n_train, self.n_workers)
        started = time.perf_counter()
        for worker, (start, stop) in enumerate(shards):
            seed = worker_seed(config.train.seed, epoch, worker)
            self.gang.send(worker, ("train", epoch, lr, start, stop, seed))
        needed = max(1, int(np.ceil(config.train.epoch_fraction * self.n_workers - 1e-9)))
        finished, examples, loss, correct, waited = 0, 0, 0.0, 0, 0.0
        while finished < self.n_workers:
            message = self.gang.next_message(
                f"epoch {epoch + 1}", idle=lambda: self._draw(epoch, started, before, loss_before)
            )
            if message[0] != "trained" or message[2] != epoch:
                continue
            finished += 1
            examples += message[3]
            loss += message[4]
            correct += message[5]
            waited += message[6]
            if finished == needed:
                control[CONTROL_EPOCH] = EPOCH_CLOSED  # stragglers stop at their next chunk
        seconds = time.perf_counter() - started
        self.shared.merge()  # every worker is idle now: one model to evaluate and save
        rate = examples / seconds if seconds else 0.0
        return {
            "event": "epoch",
            "epoch": epoch,
            "lr": lr,
            "examples": examples,
            "train_loss": loss / max(examples, 1),
            "train_accuracy": correct / max(examples, 1),
            "train_s": seconds,
            "data_wait_s": waited,
            "examples_per_s": rate,
            "connections_per_s": rate * self.network.connections,
        }

    def _evaluate(self) -> dict:
        n_test = self.n_test
        if not n_test:
            return {"test_loss": None, "test_accuracy": None}
        shards = shard_bounds(n_test, self.n_workers)
        for worker, (start, stop) in enumerate(shards):
            self.gang.send(worker, ("eval", start, stop))
        answered, loss, correct = 0, 0.0, 0
        while answered < self.n_workers:
            message = self.gang.next_message("evaluation")
            if message[0] == "evaluated":
                answered += 1
                loss += message[3]
                correct += message[4]
        return {"test_loss": loss / n_test, "test_accuracy": correct / n_test}

    def _draw(self, epoch: int, started: float, before: float, loss_before: float) -> None:
        stats = self.arena.array("stats")
        done = stats[:, STAT_EXAMPLES].sum() - before
        loss = (stats[:, STAT_LOSS].sum() - loss_before) / max(done, 1)
        rate = done / max(time.perf_counter() - started, 1e-9)
        self.progress.update(epoch, self.config.train.epochs, int(done), self.n_train, rate, loss)

    def _checkpoint(self, epoch: int, record: dict, history: list[dict]):
        directory = self.config.output.checkpoint_dir
        if not directory:
            return None
        network = self.network
        weights = {k: v.copy() for k, v in network.views(self.shared.params).items()}
        velocity = network.views(self.shared.velocity)
        optimizer_state = {f"{k}.momentum": v.copy() for k, v in velocity.items()}
        info = {
            "config": self.config.to_dict(),
            "epoch": epoch,
            "optimizer": {"rule": self.config.optim.rule, "lr": record["lr"]},
            "seeds": {"seed": self.config.train.seed},
            "data_position": {"next_epoch": epoch + 1, "examples_per_epoch": self.n_train},
            "metrics": record,
            "history": history,
            "connections": network.connections,
            "n_classes": self.plan.n_classes,
        }
        if isinstance(self.data, CacheData):
            info["data"] = {"cache": self.data.path, "classes": list(self.data.classes)}
        return ckpt.write_checkpoint(
            directory,
            epoch,
            weights,
            optimizer_state,
            info,
            keep=self.config.output.keep_checkpoints,
        )

    # -- shutdown --------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        if self.gang is not None:
            self.gang.stop()
        self.shared = None  # views into the arena: dropped before it is unmapped
        if self.arena is not None:
            self.arena.close()
            self.arena.unlink()
            self.arena = None


def run_training(config: Config, data: MnistData | CacheData, resume: bool = False) -> TrainResult:
    """Train ``config`` on ``data`` (MNIST arrays, or an image cache) with the Hogwild engine."""
    return Trainer(config, data, resume=resume).run()
