"""A partitioned replica on one host: K partition processes around one shared arena.

The parent owns every shared resource and releases it on every exit path (a normal end, an error,
Ctrl-C, SIGTERM, a partition that dies): it plans the split (:mod:`hogwild.partition.plan`),
compiles the kernels once, creates the arena (the whole model's parameters and velocity in
PyTorch layout, the in-flight slots' activation rows, each partition's error rows, the slots'
counters, the training examples), starts the K partitions (:mod:`hogwild.partition.process`) and
drives the epochs: it publishes the epoch's order and learning rate, waits until every example
of it has been completely processed by all K partitions (Adam's epoch rule), evaluates the whole
model, and writes a checkpoint in the single-process engine's format (the whole model, whatever
K: a job resumes with another K, or unpartitioned). A partition that dies stops the job with an
error naming it; the others are stopped and the arena removed.

On one host partitions exchange nothing but counters: each writes its slices of an example's
activations into the one shared row and reads the others' in place. With partitions on other
hosts (``model.partition_hosts``) this parent is the *leader*: it runs the partitions of its own
host, binds the link's receiver (:mod:`hogwild.partition.link`), sends each follower host
(:mod:`hogwild.partition.follower`) the job and the model, and at every epoch's end takes their
rows back before it evaluates and checkpoints (:mod:`hogwild.partition.leader`); the partitions
send the blocks other hosts read as ZeroMQ frames.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import time
from typing import Any

import numpy as np
import psutil

from hogwild.config import Config
from hogwild.data.mnist import MnistData
from hogwild.errors import (
    EXIT_STOPPED,
    ConfigError,
    PartitionDiedError,
    StoppedError,
    WorkerStalledError,
)
from hogwild.model.network import COL_OUT, Network, build_network
from hogwild.numa.claims import pinned_by_other_jobs, placement_lock
from hogwild.optim.schedule import epoch_rates
from hogwild.partition import process as proc
from hogwild.partition.hosts import LEADER, host_groups
from hogwild.partition.leader import LeaderLink
from hogwild.partition.plan import PartitionPlan, plan_partitions
from hogwild.partition.process import START_TIMEOUT_S
from hogwild.progress import Progress
from hogwild.shm.arena import Arena, ArenaLayout
from hogwild.signals import deferred_signals, terminate_as_interrupt
from hogwild.training import checkpoint as ckpt
from hogwild.training import zygote
from hogwild.training.health import HealthWatch
from hogwild.training.job import epoch_permutation, subset_indices
from hogwild.training.job_checkpoint import save_checkpoint
from hogwild.training.metrics import NOT_EVALUATED, MetricsWriter
from hogwild.training.placement import describe_cpus, worker_placements
from hogwild.training.resume import check_directory, starting_point
from hogwild.training.trainer import TrainResult

# How often a parent looks at its partitions' progress while they train (a partition's end wakes it
# at once): each look takes a core from a partition for a moment. Looking every 5 ms, the parent
# of two partitions of the 86-million-connection model used 3.9 % of a core while they trained
# (1.4 % at 20 ms; a 2-core AMD EPYC, /proc/PID/stat over 10 s). A cluster replica's parent and a
# follower host keep their 5 ms: their loops also carry the flush and fetch rounds with the
# partitions and the servers, each step of which would wait a look longer.
LOOK_S = 0.02

STOP_TIMEOUT_S = 5.0


def train_partitioned(
    config: Config | str | os.PathLike | None = None,
    data: Any = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    overrides: dict[str, Any] | None = None,
    **options: Any,
) -> TrainResult:
    """:func:`hogwild.training.api.train`'s arguments, one replica split over
    ``model.partitions`` processes with ``train.in_flight`` examples in flight."""
    from hogwild.training.api import check_outputs, load_data, resolve_config, with_source

    resolved = resolve_config(config, overrides, **options)
    if resolved.output.tensorboard:
        raise ConfigError(
            "output.tensorboard (--tensorboard): a partitioned job (model.partitions > 1) writes "
            "its metrics file only; leave it empty or train with model.partitions = 1"
        )
    check_outputs(resolved)  # before any data is read or downloaded
    loaded = load_data(resolved, data)
    resolved = with_source(resolved, loaded)
    return PartitionedTrainer(resolved, loaded, resume=resume, overwrite=overwrite).run()


class PartitionedTrainer(LeaderLink):
    """One partitioned job; its :meth:`run` owns the arena and the partition processes (and, as
    the leader of partitions on other hosts, the link to them: :class:`LeaderLink`)."""

    def __init__(self, config: Config, data, resume: bool = False, overwrite: bool = False):
        if not isinstance(data, MnistData):
            raise ConfigError(
                "model.partitions > 1 trains on MNIST idx data (data.source = 'mnist' or a "
                f"directory of idx files); got {type(data).__name__}"
            )
        if config.train.batch != 1:
            raise ConfigError(
                f"model.partitions > 1 trains one example at a time per slot (train.in_flight "
                f"examples at once): set train.batch = 1, got {config.train.batch}"
            )
        self.config, self.resume = config, resume
        self.replace_old = check_directory(config.output.checkpoint_dir, resume, overwrite)
        self.n_classes = 10  # MNIST's digits
        self.network: Network = build_network(config.model, self.n_classes)
        self.plan: PartitionPlan = plan_partitions(self.network, config.model.partitions)
        if self.plan.k > proc.MAX_PARTITIONS:
            raise ConfigError(
                f"model.partitions = {self.plan.k}: at most {proc.MAX_PARTITIONS} on one host"
            )
        train_images = data.train_images.reshape(len(data.train_images), -1)
        subset = subset_indices(config.train.seed, len(train_images), config.train.subset)
        if subset is not None:
            train_images, train_labels = train_images[subset], data.train_labels[subset]
        else:
            train_labels = data.train_labels
        self.train_images, self.train_labels = train_images, train_labels.astype(np.int64)
        self.test_images = data.test_images.reshape(len(data.test_images), -1)
        self.test_labels = data.test_labels.astype(np.int32)
        self.mean, self.std = config.data.mean, config.data.std
        self.progress = Progress(config.output.progress, self.network.connections)
        self.metrics = MetricsWriter(config.output.metrics, resume, overwrite)
        self.groups = host_groups(config, self.plan)
        self.local = self.groups.members(LEADER) if self.groups else tuple(range(self.plan.k))
        self.followers = tuple(range(1, self.groups.n_groups)) if self.groups else ()
        self.keys = config.cluster.keys or None
        self.receiver = self.outbox = None
        self.rows_asked = 0
        self.arena: Arena | None = None
        self.processes: list = []
        self.handed = 0  # examples handed to the feeder so far (proc.COUNT)
        self.placements: tuple = ()

    # -- the job ---------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        with terminate_as_interrupt():
            try:
                return self._run()
            finally:
                with deferred_signals():  # a second Ctrl-C or SIGTERM cannot cut the cleanup
                    self._shutdown()

    def _run(self) -> TrainResult:
        config, network, plan = self.config, self.network, self.plan
        params, velocity, start_epoch, history = starting_point(
            config, network, self.n_classes, self.resume, self.progress.line
        )
        warm_kernels(plan, config.train.in_flight)
        self._start(params, velocity)
        self.progress.line(
            f"hogwild: {network.connections:,} connections over {plan.k} partitions, "
            f"{config.train.in_flight} examples in flight, {plan.bytes_per_example:,} bytes "
            f"crossing per example, {len(self.train_images):,} training examples"
        )
        self.metrics.write(
            {
                "event": "start",
                "connections": network.connections,
                "partitions": plan.k,
                "in_flight": config.train.in_flight,
                "bytes_per_example": plan.bytes_per_example,
                "start_epoch": start_epoch,
                "config": config.to_dict(),
                "pid": os.getpid(),
            }
        )
        wall_start = time.perf_counter()
        train_seconds, examples, checkpoint_path = 0.0, 0, None
        health = HealthWatch(config, self.n_classes, False, self.metrics, 1)  # one replica
        for epoch in range(start_epoch, config.train.epochs):
            record = self._train_epoch(epoch)
            train_seconds += record["train_s"]
            examples += record["examples"]
            evaluated = config.train.evaluates_after(epoch)
            record.update(self._evaluate() if evaluated else NOT_EVALUATED)
            history.append(record)
            self.metrics.write(record)
            accuracy = record["test_accuracy"]
            tested = "not evaluated" if not evaluated else "no test split"
            if accuracy is not None:
                tested = f"test accuracy {accuracy * 100:.2f}%"
            self.progress.line(
                f"epoch {epoch + 1}/{config.train.epochs}  lr {record['lr']:.4g}  "
                f"train loss {record['train_loss']:.4f}  {tested}  "
                f"{record['examples_per_s']:,.0f} ex/s"
            )
            # before the checkpoint: overflowed weights are never saved
            trained = start_epoch * len(self.train_images) + examples
            health.after_epoch(record, self.arena.array("params"), trained)
            checkpoint_path = self._checkpoint(epoch, record, history)
        last = history[-1] if history else {}
        rate = examples / train_seconds if train_seconds else 0.0
        final = {
            "event": "final",
            "connections": network.connections,
            "partitions": plan.k,
            "in_flight": config.train.in_flight,
            "bytes_per_example": plan.bytes_per_example,
            "examples": examples,
            "examples_per_s": rate,
            "train_loss": last.get("train_loss"),
            "test_loss": last.get("test_loss"),
            "test_accuracy": last.get("test_accuracy"),
            "epochs": config.train.epochs,
            "train_s": train_seconds,
            "wall_s": time.perf_counter() - wall_start,
            "checkpoint": str(checkpoint_path) if checkpoint_path else None,
            "config": config.to_dict(),
        }
        self.metrics.write(final)
        return TrainResult(final, history, final["checkpoint"])

    def _start(self, params: np.ndarray, velocity: np.ndarray) -> None:
        config, network, plan = self.config, self.network, self.plan
        n_slots, k = config.train.in_flight, len(self.local)
        layout = arena_layout(
            network, plan, n_slots, self.train_images.shape, self.exchanges, self.version_words()
        )
        self.arena = arena = Arena.create(config.ps.job or "partition", layout)
        arena.array("params")[:] = params
        arena.array("velocity")[:] = velocity
        arena.array("images")[:] = self.train_images
        arena.array("labels")[:] = self.train_labels
        me = psutil.Process()
        setup = {
            "arena": arena.name,
            "layout": layout.to_json(),
            "config": config.to_dict(),
            "n_classes": self.n_classes,
            "mean": self.mean,
            "std": self.std,
            "parent_pid": os.getpid(),
            "parent_started": me.create_time(),
        }
        if self.groups is not None:
            self._open_link(params, velocity)
            setup["link"] = self.link_setup()
        control = arena.array("control")
        # planning and pinning as one step against other jobs
        with placement_lock(), zygote.starting(config.train.start_method) as context:
            taken = pinned_by_other_jobs()
            placements = worker_placements(k, config.train.placement, avoid=taken)
            self.placements = placements
            homes = self.homes(placements)
            for i, p in enumerate(self.local):
                partition = {"partition": p, "placement": placements[i], "home": homes[i]}
                child = context.Process(
                    target=proc.partition_main,
                    args=({**setup, **partition},),
                    name=f"hogwild-partition-{p}",
                    daemon=True,
                )
                child.start()
                self.processes.append(child)
            self._wait_all(control, proc.PINNED, "pinning themselves")
        self._wait_all(control, proc.READY, "loading their kernels")
        self._wait_followers()
        self.progress.line(describe_cpus(placements, taken).replace("workers", "partitions"))

    #: Whether the partitions exchange their rows with a home (a ``base`` region in the arena).
    exchanges = False

    def version_words(self) -> int:
        """Words of the arena's ``versions`` region (0: none; a cluster replica's home has)."""
        return 0

    def homes(self, placements) -> list[dict | None]:
        """Per partition, where its rows are exchanged (:mod:`hogwild.partition.process`); None:
        nowhere, the arena is the model (one host, ``hogwild train``)."""
        return [None] * len(placements)

    def _wait_all(self, control, word: int, doing: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(control[word + 8 * p] for p in self.local):
            self._check_alive(doing)
            if time.monotonic() > deadline:
                raise PartitionDiedError(
                    f"the partitions were not done {doing} within {START_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.01)

    def _train_epoch(self, epoch: int) -> dict:
        from hogwild.shm.atomics import atomic_store

        config, arena = self.config, self.arena
        lr, lr_end = epoch_rates(config.optim, epoch, config.train.epochs)
        n = len(self.train_images)
        arena.array("order")[:] = epoch_permutation(config.train.seed, epoch, n)
        floats = arena.array("floats")
        floats[proc.LR] = lr
        if lr_end is not None:  # optim.smooth: each example's rate on the line to lr_end
            floats[proc.LR_END], floats[proc.EPOCH_N] = lr_end, n
            floats[proc.EPOCH_FIRST] = self.handed  # the examples fed before this epoch
            floats[proc.SMOOTH] = 1.0
        stats, control = arena.array("stats"), arena.array("control")
        before = stats.sum(axis=0).copy()
        self.handed += n  # the feeder's running total (its order ring starts over at n)
        atomic_store(control, proc.EPOCH, epoch + 1)
        atomic_store(control, proc.COUNT, self.handed)  # publishes the order and lr
        started = last_progress = time.perf_counter()
        done = 0
        while True:
            self._check_alive(f"training epoch {epoch + 1}")
            now_done = int(stats[:, proc.STAT_EXAMPLES].sum() - before[proc.STAT_EXAMPLES])
            now = time.perf_counter()
            if now_done != done:
                done, last_progress = now_done, now
                rate = done / max(now - started, 1e-9)
                self.progress.update(epoch, config.train.epochs, done, n, rate, 0.0)
            elif now - last_progress > config.train.stall_s:
                raise WorkerStalledError(
                    f"the partitioned replica completed no example in {config.train.stall_s:.0f} "
                    f"s of epoch {epoch + 1} ({done} of {n} done)"
                )
            if done >= n:
                break
            # shorter naps as the epoch's end nears, so that its end is seen (and its training
            # seconds end) within about an example of it, not up to a whole look later
            left_s = (n - done) * (now - started) / done if done else LOOK_S
            nap_unless_one_ends(self.processes, min(LOOK_S, max(left_s, 0.001)))
        seconds = time.perf_counter() - started
        self._gather_rows(f"ending epoch {epoch + 1}")
        after = stats.sum(axis=0)
        return {
            "event": "epoch",
            "epoch": epoch,
            "lr": lr,
            "examples": n,
            "train_s": seconds,
            "examples_per_s": n / seconds if seconds else 0.0,
            "train_loss": float(after[proc.STAT_LOSS] - before[proc.STAT_LOSS]) / n,
            "train_accuracy": float(after[proc.STAT_CORRECT] - before[proc.STAT_CORRECT]) / n,
        }

    def _evaluate(self) -> dict:
        from hogwild.model.context import TrainingContext

        n = len(self.test_images)
        if not n:
            return {"test_loss": None, "test_accuracy": None}
        context = TrainingContext.allocate(self.network, 32)
        params = self.arena.array("params")
        loss, correct = context.evaluate_range(
            self.network.ops,
            params,
            self.test_images,
            self.test_labels,
            0,
            n,
            self.mean,
            self.std,
        )
        return {"test_loss": float(loss) / n, "test_accuracy": float(correct) / n}

    def _checkpoint(self, epoch: int, record: dict, history: list[dict]):
        config = self.config
        if not config.output.checkpoint_dir:
            return None
        if self.replace_old:  # --overwrite: the old run goes once the new one has a checkpoint
            ckpt.remove_checkpoints(config.output.checkpoint_dir)
            self.replace_old = False
        arena = self.arena
        return save_checkpoint(
            config,
            self.network,
            arena.array("params").copy(),
            arena.array("velocity").copy(),
            epoch,
            record,
            history,
            self.n_classes,
            len(self.train_images),
            None,
        )

    def _check_alive(self, doing: str) -> None:
        for p, child in zip(self.local, self.processes, strict=False):
            code = child.exitcode
            if code == EXIT_STOPPED:  # its line names the server, the bucket and the failure
                said = proc.read_said(self.arena, p) or "(its line above says why)"
                raise StoppedError(
                    f"partition {p} of {self.plan.k} was stopped by its parameter server while "
                    f"{doing}: {said}; the replica stops, not to be restarted"
                )
            if code is not None:
                how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
                raise PartitionDiedError(
                    f"partition {p} of {self.plan.k} (pid {child.pid}) died while "
                    f"{doing} ({how}); the replica stops (its last checkpoint stays as it was)"
                )
        self._check_link(doing)

    def _shutdown(self) -> None:
        self.progress.close()
        stop_partitions(self.arena, self.processes)
        self.processes = []
        self._close_link()  # its receiver writes into the arena
        if self.arena is not None:
            self.arena.close()
            self.arena.unlink()
            self.arena = None


def nap_unless_one_ends(processes: list, seconds: float) -> None:
    """Sleep up to ``seconds``, waking at once when one of the partition ``processes`` ends."""
    sentinels = [child.sentinel for child in processes]
    if sentinels:
        multiprocessing.connection.wait(sentinels, seconds)
    else:
        time.sleep(seconds)


def stop_partitions(arena: Arena | None, processes: list) -> None:
    """Ask a host's partition processes to stop (the arena's STOP flag), wait for them together
    up to ``STOP_TIMEOUT_S``, then terminate, then kill what is left; every one is reaped."""
    from hogwild.shm.atomics import atomic_store

    if arena is not None:
        atomic_store(arena.array("control"), proc.STOP, 1)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for child in processes:
        child.join(max(0.0, deadline - time.monotonic()))
    for child in processes:
        if child.is_alive():
            child.terminate()
            child.join(STOP_TIMEOUT_S)
        if child.is_alive():
            child.kill()
            child.join()


def arena_layout(
    network: Network, plan: PartitionPlan, n_slots: int, images_shape, base: bool = False,
    versions: int = 0,
) -> ArenaLayout:  # fmt: skip
    """The partitioned job's shared segment (see :mod:`hogwild.partition.process`); with
    ``base``, the values last exchanged with the parameter servers too (a cluster replica), and
    ``versions`` words for the versions of the host's last take
    (:mod:`hogwild.partition.host_rows`)."""
    size, k = network.act_size, plan.k
    layout = ArenaLayout()
    layout.add("params", np.float32, network.n_params)
    if base:
        layout.add("base", np.float32, network.n_params)
    if versions:
        layout.add("versions", np.uint64, versions)
    layout.add("velocity", np.float32, network.n_params)
    layout.add("act", np.float32, (n_slots, size))
    layout.add("dact", np.float32, (k, n_slots, size))
    layout.add("sync", np.int64, n_slots * proc.slot_width(len(plan.segments)))
    layout.add("control", np.int64, proc.CONTROL_WORDS)
    layout.add("floats", np.float64, 8)
    layout.add("stats", np.float64, (k, 8))
    layout.add("slot_label", np.int64, n_slots)
    layout.add("slot_loss", np.float64, (n_slots, 2))
    layout.add("slot_lr", np.float64, n_slots)  # the rate each slot's example trains at
    layout.add("images", np.uint8, tuple(images_shape))
    layout.add("labels", np.int64, images_shape[0])
    layout.add("order", np.int64, images_shape[0])
    layout.add("said", np.uint8, (k, proc.SAID_BYTES))  # a stopped partition's line
    return layout


def warm_kernels(plan: PartitionPlan, n_slots: int) -> None:
    """Compile (or load from numba's cache) every kernel a partition calls, with the argument
    types it calls them with, once here rather than in K processes at once."""
    from hogwild.model.layer_kernels import argmax, cross_entropy
    from hogwild.model.passes import load_example
    from hogwild.model.update import apply_update
    from hogwild.optim.rules import RULE_CODES
    from hogwild.partition.compute import PartitionStages
    from hogwild.shm.atomics import atomic_add, atomic_load, atomic_store

    network, k = plan.network, plan.k
    act = np.zeros((n_slots, network.act_size), dtype=np.float32)
    dact = np.zeros((k, n_slots, network.act_size), dtype=np.float32)
    aux = np.zeros_like(act, dtype=np.int32)
    params = np.zeros(network.n_params, dtype=np.float32)
    grad, velocity = np.zeros_like(params), np.zeros_like(params)
    images = np.zeros((1, network.input_size), dtype=np.uint8)
    load_example(images[0], act[0], 0.1307, 0.3081)
    counters = np.zeros(8, dtype=np.int64)
    atomic_add(counters, 0, 1), atomic_load(counters, 0), atomic_store(counters, 0, 0)
    out = int(network.ops[-1, COL_OUT])
    cross_entropy(act[0], out, 0), argmax(act[0], out, network.n_classes)
    for p in range(k):
        stages = PartitionStages(plan, p)
        scratch = np.zeros(plan.scratch_floats[p], dtype=np.float32)
        for s in range(len(plan.segments)):
            stages.forward(s, params, act[0:1], aux[0:1], scratch, True)
            stages.backward(s, params, act[0:1], dact[p, 0:1], aux[0:1], scratch, grad, 0)
            if s > 0:
                stages.reduce(s, dact[:, 0, :])
        apply_update(
            plan.ops[p], params, velocity, grad, 0.0, 1.0, 0.0, 0.0, RULE_CODES["sgd"], True
        )
