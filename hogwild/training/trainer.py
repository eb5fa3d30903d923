"""The trainer: a single-node job's parent (docs/design.md, "How data flows on one machine").

It owns every shared resource of the job and releases it on every exit path (a normal end, an
error, Ctrl-C, SIGTERM): it compiles the kernels, plans the workers' CPUs around other live jobs
(:mod:`hogwild.numa.claims`), builds the parameter store that ``train.parameters`` names
(:mod:`hogwild.store`; the trainer never knows which one it has), creates the arena, copies the
examples in once (idx files; a job on an LMDB image cache reads only its manifest here, and each
worker opens the cache itself), initialises or restores the parameters through the store, starts
the workers and then drives the epochs: a fresh permutation per epoch, one shard per worker, an
early end once ``epoch_fraction`` of the workers finished their shard (Adam section 3.2.5), the
store's epoch-end merge (one model), evaluation on the test set split across the workers, a
checkpoint from the store's snapshot and a metrics line. A worker that dies or stalls stops the
job with an error naming it; the last checkpoint stays as it was. On any exit the workers are
stopped (terminated, then killed, if they do not leave) and the arena is removed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

from hogwild.compile_records import compile_once
from hogwild.config import Config
from hogwild.data.arrays import INPUTS_AS_GIVEN, input_normalisation
from hogwild.data.mnist import MnistData
from hogwild.data.plan import CacheData, plan_data
from hogwild.errors import ConfigError
from hogwild.locks import compile_lock
from hogwild.model.network import Network, build_network
from hogwild.model.seeds import worker_seed
from hogwild.numa.claims import pinned_by_other_jobs, placement_lock
from hogwild.optim.interval import update_every
from hogwild.optim.schedule import epoch_rates
from hogwild.progress import Progress
from hogwild.shm.arena import Arena
from hogwild.shm.sweeper import sweep_report
from hogwild.signals import deferred_signals, interrupts_not_lost, terminate_as_interrupt
from hogwild.store.registry import store_class
from hogwild.training import checkpoint as ckpt
from hogwild.training import zygote
from hogwild.training.gang import WorkerGang
from hogwild.training.health import HealthWatch
from hogwild.training.job import (
    CONTROL_COMPILED,
    CONTROL_EPOCH,
    EPOCH_CLOSED,
    STAT_BEAT,
    STAT_EXAMPLES,
    STAT_LOSS,
    epoch_permutation,
    job_layout,
    shard_bounds,
    subset_indices,
)
from hogwild.training.job_checkpoint import save_checkpoint
from hogwild.training.messages import Evaluate, Evaluated, Train, Trained, WorkerSetup
from hogwild.training.metrics import NOT_EVALUATED, MetricsWriter
from hogwild.training.moments import (
    MOMENTS_REGION,
    keeps_moments,
    moments_shape,
    moments_state,
    restore_moments,
)
from hogwild.training.placement import describe_cpus, worker_count, worker_placements
from hogwild.training.resume import check_directory, starting_point
from hogwild.training.tensorboard import TensorBoardLog
from hogwild.training.worker import worker_main

COMPILING = (
    "hogwild: compiling the kernels for this model and batch size, once: about 2 minutes on "
    "2 cores (later runs load them from the cache in under a second)"
)


@dataclass
class TrainResult:
    """What a finished job reports: the final metrics, the per-epoch history, the checkpoint."""

    metrics: dict
    history: list[dict] = field(default_factory=list)
    checkpoint: str | None = None
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # the engine's names
    names: dict[str, str] = field(default_factory=dict)  # engine name -> a torch module's

    def state_dict(self) -> dict[str, np.ndarray]:
        """The trained weights as numpy arrays in PyTorch's layouts, under the names of the
        module the model came from (:func:`hogwild.from_torch`), else the engine's."""
        return {self.names.get(name, name): value for name, value in self.weights.items()}

    def preprocess(self, images: np.ndarray) -> np.ndarray:
        """``images`` as training fed them to the model: float32 ``[n, *model.input]``; uint8
        pixels as ``(x / 255 - data.mean) / data.std``, floats as they are
        (:func:`hogwild.data.arrays.input_normalisation`)."""
        config = self.metrics["config"]
        shape = tuple(config["model"]["input"])
        images = np.asarray(images)
        mean, std = input_normalisation(images.dtype, config["data"]["mean"], config["data"]["std"])
        if images.dtype == np.uint8:
            values = (
                images.astype(np.float32) / np.float32(255.0) - np.float32(mean)
            ) / np.float32(std)
        else:
            values = images.astype(np.float32)
        return np.ascontiguousarray(values.reshape(-1, *shape), dtype=np.float32)


class Trainer:
    """Runs one job; use :func:`run_training` unless you need the pieces."""

    def __init__(
        self,
        config: Config,
        data: MnistData | CacheData,
        resume: bool = False,
        overwrite: bool = False,
        on_epoch_end: Callable[[dict], Any] | None = None,
        initial: dict[str, np.ndarray] | None = None,
        names: dict[str, str] | None = None,
    ):
        self.data = data
        self.on_epoch_end = on_epoch_end
        self.resume = resume
        self.initial = initial or {}  # weights to start from instead of model.init's
        self.names = names or {}  # engine name -> a PyTorch module's, kept in the checkpoints
        # float32 values for arrays of floats (used as given), else uint8 pixels
        self.images_dtype = np.float32 if getattr(data, "floats", False) else np.uint8
        train = config.train
        self.n_workers = 1 if train.sync else worker_count(train.workers)
        self.config = config  # train.update_every is resolved once the store is planned
        self.replace_old = check_directory(config.output.checkpoint_dir, resume, overwrite)
        self.plan, n_train, self.n_test = plan_data(config, data, self.n_workers)
        try:
            self.network: Network = build_network(config.model, self.plan.n_classes)
        except ConfigError as exc:
            if not self.plan.cache:
                raise
            raise ConfigError(
                f"{exc} (the image cache {self.plan.cache} has {self.plan.n_classes} classes)"
            ) from None
        self.subset = subset_indices(train.seed, n_train, train.subset)
        self.n_train = n_train if self.subset is None else len(self.subset)
        self.progress = Progress(config.output.progress, self.network.connections)
        self.metrics = MetricsWriter(config.output.metrics, resume, overwrite)
        self.arena: Arena | None = None
        self.store = None
        self.gang: WorkerGang | None = None
        self.tensorboard: TensorBoardLog | None = None
        self.trained_before = 0  # examples of the epochs before this one (TensorBoard's steps)

    # -- the job ---------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        with terminate_as_interrupt():
            try:
                return self._run()
            finally:
                with deferred_signals():  # a second Ctrl-C or SIGTERM cannot cut the cleanup
                    self._shutdown()

    def _run(self) -> TrainResult:
        network = self.network
        for line in sweep_report():  # segments of earlier jobs whose owner was killed
            self.progress.line(line)
        taken, start_epoch, history = self._start()
        config = self.config  # with the update interval the store resolved
        self.progress.line(
            f"hogwild: {network.connections:,} connections, {self.n_workers} worker(s), "
            f"batch {config.train.batch}, {self.n_train:,} training examples; "
            + describe_cpus(self.placements, taken)
        )
        summary = self.store.summary()
        if summary:
            self.progress.line(summary)
        self.metrics.write(
            {
                "event": "start",
                "connections": network.connections,
                "workers": self.n_workers,
                "cpus": [p.cpu for p in self.placements],
                "parameters": self.store.describe(),
                "start_epoch": start_epoch,
                "config": config.to_dict(),
                "pid": os.getpid(),
                # the method the workers started with (spawn where the forkserver could not be)
                "start_method": self.gang.context.get_start_method(),
            }
        )
        self.tensorboard = TensorBoardLog(
            config.output.tensorboard, config.output.tensorboard_every, config.train.batch
        )
        self.trained_before = start_epoch * self.n_train
        self.health = HealthWatch(config, self.plan.n_classes, network.regression, self.metrics,
                                  self.n_workers)  # fmt: skip
        wall_start = time.perf_counter()
        train_seconds = data_wait = store_wait = 0.0
        examples = 0
        checkpoint_path = None
        for epoch in range(start_epoch, config.train.epochs):
            record = self._train_epoch(epoch)
            train_seconds += record["train_s"]
            data_wait += record["data_wait_s"]
            store_wait += record["store_wait_s"]
            examples += record["examples"]
            evaluated = config.train.evaluates_after(epoch)
            record.update(self._evaluate() if evaluated else NOT_EVALUATED)
            if network.regression:  # a mean squared error has no classes to be right about
                record["train_accuracy"] = record["test_accuracy"] = None
            history.append(record)
            self.metrics.write(record)
            tested = "no test split"
            if not evaluated:
                tested = "not evaluated"
            elif self.n_test and network.regression:
                tested = f"test mse {record['test_loss']:.4f}"
            elif self.n_test:
                tested = (
                    f"test loss {record['test_loss']:.4f}  "
                    f"test accuracy {record['test_accuracy'] * 100:.2f}%"
                )
            self.progress.line(
                f"epoch {epoch + 1}/{config.train.epochs}  lr {record['lr']:.4g}  "
                f"train loss {record['train_loss']:.4f}  {tested}  "
                f"{record['examples_per_s']:,.0f} ex/s  {record['train_s']:.1f} s"
            )
            # before the checkpoint: overflowed weights are never saved
            trained = self.trained_before + record["examples"]
            self.health.after_epoch(record, self.store.snapshot()[0], trained)
            checkpoint_path = self._checkpoint(epoch, record, history)
            self.trained_before += record["examples"]
            self.tensorboard.epoch(record)
            if self.on_epoch_end is not None:
                self.on_epoch_end(dict(record))  # a copy: the history keeps what was measured
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
            "parameters": config.train.parameters,
            "epochs": config.train.epochs,
            "epochs_run": config.train.epochs - start_epoch,
            "train_s": train_seconds,
            "data_wait_s": data_wait,
            "store_wait_s": store_wait,
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
        trained, _ = self.store.snapshot()
        weights = {name: view.copy() for name, view in network.views(trained).items()}
        return TrainResult(final, history, final["checkpoint"], weights)

    def _start(self) -> tuple[dict[int, int], int, list[dict]]:
        """Place and pin the workers, fill the arena, compile the kernels, wait for the workers.

        Returns:
            The CPUs other jobs' workers held, the first epoch to train, the history so far.
        """
        with placement_lock():  # planning and pinning as one step against other jobs
            taken = pinned_by_other_jobs()
            self.plan_store(taken)
            start_epoch, history = self._prepare_arena()  # first: it checks /dev/shm's space
            self._start_workers()  # back once every worker is pinned: the lock can go
        config = self.config  # with the update interval the store resolved
        # beside the workers' start; a job beside loads what this compiled. numba's compiler
        # calls back into Python, where a Ctrl-C's exception would be dropped: not lost here.
        batch, update_every, feed = config.train.batch, config.train.update_every, self.plan.feed
        images = self.images_dtype
        # no images type in the key: float32 examples reach the kernels as uint8 rows
        # (hogwild.model.passes.stored_rows), so a float job loads what an MNIST job compiled
        what = {
            "kernels": "engine",
            "model": config.to_dict()["model"],
            "classes": self.plan.n_classes,
            "batch": batch,
            "update_every": update_every,
            "feed": feed,
        }

        def compile_engine() -> None:
            # the kernels' modules load only when they must be compiled: a start that finds them
            # in numba's cache leaves them to the workers, and this process loads no numba
            from hogwild.model.compile import compile_kernels

            print(COMPILING, file=sys.stderr, flush=True)  # minutes of silence otherwise
            compile_kernels(self.network, batch, update_every, feed=feed, images_dtype=images)

        with compile_lock(), interrupts_not_lost():
            compile_once(what, compile_engine)
            self.store.compile_kernels()
        self.arena.array("control")[CONTROL_COMPILED] = 1  # the workers load what is compiled
        self.gang.wait_ready()
        return taken, start_epoch, history

    def plan_store(self, taken: dict[int, int]) -> None:
        """Place the workers (around the CPUs other jobs have ``taken``) and plan the store."""
        config = self.config
        self.placements = worker_placements(self.n_workers, config.train.placement, taken)
        store = store_class(config.train.parameters)
        writers = store(config, self.network, self.placements).writers_per_copy
        self.config = config.override({"train.update_every": update_every(config, writers)})
        self.store = store(self.config, self.network, self.placements)

    def _prepare_arena(self) -> tuple[int, list[dict]]:
        """Create the arena, fill it with data and initial (or restored) parameters."""
        config, network, data = self.config, self.network, self.data
        height, width, channels = self.plan.shape
        # a regression's rows carry its targets after the input (hogwild.data.arrays)
        targets = getattr(data, "n_targets", 0)
        image_bytes = 0 if self.plan.cache else height * width * channels + targets
        layout = job_layout(
            network,
            self.n_workers,
            self.n_train,
            self.n_test,
            image_bytes,
            self.store,
            image_dtype=self.images_dtype,
        )
        if keeps_moments(config.optim.rule):  # Adam's, per worker, for the checkpoints
            layout.add(MOMENTS_REGION, np.float32, moments_shape(network, self.n_workers))
        self.arena = Arena.create(config.ps.job or "train", layout)  # named by its job
        arena = self.arena
        self.store.attach(arena)
        if image_bytes:
            chosen = slice(None) if self.subset is None else self.subset
            arena.array("train_images")[:] = data.train_images[chosen].reshape(self.n_train, -1)
            arena.array("train_labels")[:] = data.train_labels[chosen]
            if self.n_test:
                arena.array("test_images")[:] = data.test_images.reshape(self.n_test, -1)
                arena.array("test_labels")[:] = data.test_labels
        params, velocity, start_epoch, history = starting_point(
            config, network, self.plan.n_classes, self.resume, self.progress.line
        )
        if start_epoch == 0 and self.initial:
            views = network.views(params)
            for name, value in self.initial.items():
                views[name][...] = value
        self.store.load(params, velocity)
        if start_epoch and keeps_moments(config.optim.rule):
            restored = ckpt.load_checkpoint(config.output.checkpoint_dir)
            restore_moments(
                network,
                arena.array(MOMENTS_REGION),
                restored.optimizer_state,
                restored.path,
                self.progress.line,
            )
        return start_epoch, history

    def _start_workers(self) -> None:
        train = self.config.train
        stats = self.arena.array("stats")
        me = os.getpid()
        started = psutil.Process(me).create_time()
        layout_json, config_dict, plan = (
            self.arena.layout.to_json(),
            self.config.to_dict(),
            self.plan.to_dict(),
        )
        # inside, BLAS is limited to one thread: the forkserver, if it starts here, takes that too
        with zygote.starting(train.start_method) as context:
            self.gang = WorkerGang(
                context,
                self.config.output.checkpoint_dir,
                heartbeats=stats[:, STAT_BEAT],
                stall_s=train.stall_s,
            )
            self.gang.start(
                self.n_workers,
                worker_main,
                lambda w: WorkerSetup(
                    w,
                    me,
                    started,
                    self.arena.name,
                    layout_json,
                    config_dict,
                    plan,
                    self.placements[w],
                    self.store.worker_spec(w),
                ),
            )

    # -- epochs ----------------------------------------------------------------------------------

    def _train_epoch(self, epoch: int) -> dict:
        config = self.config
        arena = self.arena
        lr, lr_end = epoch_rates(config.optim, epoch, config.train.epochs)
        order = epoch_permutation(config.train.seed, epoch, self.n_train)
        if self.subset is not None and self.plan.cache:
            order = self.subset[order]  # a cache's workers read records by their index
        arena.array("order")[:] = order
        stats = arena.array("stats")
        control = arena.array("control")
        before = stats[:, STAT_EXAMPLES].sum()
        loss_before = stats[:, STAT_LOSS].sum()
        control[CONTROL_EPOCH] = epoch
        shards = shard_bounds(self.n_train, self.n_workers)
        started = time.perf_counter()
        for worker, (start, stop) in enumerate(shards):
            seed = worker_seed(config.train.seed, epoch, worker)
            self.gang.send(worker, Train(epoch, lr, start, stop, seed, lr_end))
        needed = max(1, int(np.ceil(config.train.epoch_fraction * self.n_workers - 1e-9)))
        finished, examples, loss, correct, data_wait, store_wait = 0, 0, 0.0, 0, 0.0, 0.0
        while finished < self.n_workers:
            message = self.gang.next_message(
                f"training epoch {epoch + 1}",
                idle=lambda: self._draw(epoch, started, before, loss_before),
            )
            if not isinstance(message, Trained) or message.epoch != epoch:
                continue
            finished += 1
            examples += message.examples
            loss += message.loss
            correct += message.correct
            data_wait += message.data_wait_s
            store_wait += message.store_wait_s
            if finished == needed:
                control[CONTROL_EPOCH] = EPOCH_CLOSED  # stragglers stop at their next chunk
        seconds = time.perf_counter() - started
        self._draw(epoch, started, before, loss_before)  # the epoch's last point, however short
        # every worker is idle now: one model to evaluate and save. A store's first epoch end
        # loads its kernels here (a compile record spared the start that): not a lost Ctrl-C
        with interrupts_not_lost():
            self.store.end_epoch()
        rate = examples / seconds if seconds else 0.0
        return {
            "event": "epoch",
            "epoch": epoch,
            "lr": lr,
            "examples": examples,
            "train_loss": loss / max(examples, 1),
            "train_accuracy": correct / max(examples, 1),
            "train_s": seconds,
            "data_wait_s": data_wait,
            "store_wait_s": store_wait,
            "examples_per_s": rate,
            "connections_per_s": rate * self.network.connections,
        }

    def _evaluate(self) -> dict:
        n_test = self.n_test
        if not n_test:
            return {"test_loss": None, "test_accuracy": None}
        shards = shard_bounds(n_test, self.n_workers)
        for worker, (start, stop) in enumerate(shards):
            self.gang.send(worker, Evaluate(start, stop))
        answered, loss, correct = 0, 0.0, 0
        while answered < self.n_workers:
            message = self.gang.next_message("evaluating")
            if isinstance(message, Evaluated):
                answered += 1
                loss += message.loss
                correct += message.correct
        return {"test_loss": loss / n_test, "test_accuracy": correct / n_test}

    def _draw(self, epoch: int, started: float, before: float, loss_before: float) -> None:
        stats = self.arena.array("stats")
        done = stats[:, STAT_EXAMPLES].sum() - before
        loss = (stats[:, STAT_LOSS].sum() - loss_before) / max(done, 1)
        rate = done / max(time.perf_counter() - started, 1e-9)
        self.progress.update(epoch, self.config.train.epochs, int(done), self.n_train, rate, loss)
        if self.tensorboard is not None:
            self.tensorboard.training(self.trained_before + int(done), loss, rate)

    def _checkpoint(self, epoch: int, record: dict, history: list[dict]):
        directory = self.config.output.checkpoint_dir
        if not directory:
            return None
        if self.replace_old:  # --overwrite: the old run goes once the new one has a checkpoint
            ckpt.remove_checkpoints(directory)
            self.replace_old = False
        params, velocity = self.store.snapshot()
        extra = {"torch_names": self.names} if self.names else {}
        if self.images_dtype == np.float32:
            extra["inputs"] = INPUTS_AS_GIVEN
        moments = None
        if keeps_moments(self.config.optim.rule):  # the workers are idle between epochs
            moments = moments_state(self.network, self.arena.array(MOMENTS_REGION))
        return save_checkpoint(
            self.config, self.network, params, velocity, epoch, record, history,
            self.plan.n_classes, self.n_train, self.data, extra, moments,
        )  # fmt: skip

    # -- shutdown --------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        self.progress.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.gang is not None:
            self.gang.stop()
        if self.store is not None:
            self.store.close()
            self.store = None  # views into the arena: dropped before it is unmapped
        if self.arena is not None:
            self.arena.close()
            self.arena.unlink()
            self.arena = None


def run_training(
    config: Config,
    data: MnistData | CacheData,
    resume: bool = False,
    overwrite: bool = False,
    on_epoch_end: Callable[[dict], Any] | None = None,
    initial: dict[str, np.ndarray] | None = None,
    names: dict[str, str] | None = None,
) -> TrainResult:
    """Train ``config`` on ``data`` (MNIST arrays, or an image cache) with the Hogwild engine,
    from the ``initial`` weights (the engine's names) if given, else from ``model.init``'s.

    ``on_epoch_end`` is called in this process after each epoch (evaluated, checkpointed) with
    a copy of its metrics record (``epoch`` from 0, ``train_loss``, ``test_accuracy``...).
    """
    trainer = Trainer(
        config,
        data,
        resume=resume,
        overwrite=overwrite,
        on_epoch_end=on_epoch_end,
        initial=initial,
        names=names,
    )
    result = trainer.run()
    result.names = dict(names or {})
    return result
