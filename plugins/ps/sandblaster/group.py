"""A Sandblaster worker group as a role of ``hogwild cluster``: the coordinator and its replicas.

``hogwild cluster --cluster.framework=sandblaster`` (:mod:`hogwild.cluster.topology`: one worker
group of ``workers_per_group`` synchronous workers, one server group) starts the parameter
servers and one worker-group role, ``hogwild cluster replica --index 0``, which runs
:class:`SandblasterGroup` when the job's topology is Sandblaster. The role holds:

* the **coordinator**: :class:`~.lbfgs.SandblasterLBFGS` over a :class:`~.batch.BatchObjective`,
  with a parameter-server client of its own through which only shard operations and scalars pass;
* the :class:`~.batch.Board` and ``workers_per_group`` **replicas** (:class:`~.replica.Replica`),
  each with its own client, fetching the parameters once per batch, computing portion gradients
  with the engine's kernels and pushing them into their own vectors on the shards. The kernels
  release the GIL (``nogil``), so the threads compute in parallel.

**What differs from DistBelief.** The replicas are *threads of this one process*, not processes
or machines of their own: the board is the in-process transport of :mod:`.batch`, and carrying
its calls as messages between processes is not built yet. The coordinator lives in this role
(not in the driver) because the board does. The servers, the shard operations, the pushes and the
pulls are the real ones, over the network.

**What the driver sees** is a replica: the same control requests (``train``, ``close``,
``status``, ``describe``, ``stop``; :mod:`hogwild.cluster.replica`), so the driver's epochs,
evaluation, checkpoints and restarts work unchanged. One ``train`` (an epoch's share, which with
one worker group is the whole training set in a new order) is **one L-BFGS iteration on the
whole batch**: L-BFGS here is full-batch, the batch being the share's examples (the training set,
or ``train.subset``), whose order does not change the summed gradient; the line search may take
more than one pass over it, and the first epoch also evaluates the starting point. The history
stays on the shards from one epoch to the next; a share of other examples starts a fresh L-BFGS.
``close`` does nothing (an iteration is not cut short), ``train_accuracy`` is not counted.

What the job's keys mean here: ``optim.weight_decay`` is the L2 term (``0.5 l2 x.x``, on every
parameter, biases too); ``train.batch``, ``optim.lr`` and its schedule are not used (L-BFGS
tries a unit step, :class:`~.lbfgs.LBFGSOptions`); dropout is off (the line search compares
losses, so the objective must be deterministic); ``train.stall_s`` bounds every wait on the
board. Data: MNIST arrays in memory (``data.source``); image caches, data servers and
augmentation are refused by :func:`check_job` before the job starts.
"""

from __future__ import annotations

import math
import os
import queue
import secrets
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
from hogwild_plugins.ps.sandblaster.batch import BatchObjective, Board, check_servers
from hogwild_plugins.ps.sandblaster.lbfgs import LBFGSOptions, SandblasterLBFGS
from hogwild_plugins.ps.sandblaster.portions import PortionScheduler
from hogwild_plugins.ps.sandblaster.replica import Examples, PortionGradient, Replica

from hogwild.errors import ConfigError
from hogwild.net.control import ControlRefused, ControlServer, field
from hogwild.signals import deferred_signals, terminate_as_interrupt
from hogwild.training.job import epoch_permutation, subset_indices

__all__ = ["SandblasterGroup", "check_job", "portion_size"]

PORTIONS_PER_WORKER = 8  # DistBelief: portions much smaller than 1/N of the batch
MIN_PORTION = 16  # examples: below this a portion costs more in requests than in compute
PUSH_EVERY = 3  # portions between a replica's pushes ("every few completed portions")
MAX_COPIES = 2  # copies of an outstanding portion near the end of a batch (backup tasks)
DRIVER_SILENCE_S = 120.0
POLL_S = 0.05


def portion_size(n_examples: int, workers: int) -> int:
    """Examples per portion: about ``PORTIONS_PER_WORKER`` portions per worker, at least
    ``MIN_PORTION`` examples each."""
    return max(MIN_PORTION, math.ceil(n_examples / (PORTIONS_PER_WORKER * max(workers, 1))))


def check_job(config, data) -> None:
    """Refuse, before anything starts, what a Sandblaster group cannot train from.

    Raises:
        ConfigError: Data servers, augmentation, or data that is not MNIST arrays.
    """
    from hogwild.data.mnist import MnistData

    if config.cluster.data_servers or config.data.servers:
        raise ConfigError(
            "cluster.framework = 'sandblaster' with data servers: not built; the Sandblaster "
            "group reads its examples itself (cluster.data_servers = 0, data.servers = [])"
        )
    if config.data.augment.strip():
        raise ConfigError(
            f"cluster.framework = 'sandblaster' with data.augment = {config.data.augment!r}: "
            "L-BFGS's line search compares losses of one fixed batch, and augmentation renders "
            'new variants of it; use data.augment = ""'
        )
    if not isinstance(data, MnistData):
        raise ConfigError(
            "cluster.framework = 'sandblaster' reads MNIST idx files into memory; training from "
            f"an image cache ({getattr(data, 'path', data)}) is not built"
        )


@dataclass
class _Share:
    epoch: int
    examples: int
    loss: float = 0.0
    started: float = 0.0
    seconds: float = 0.0


class SandblasterGroup:
    """The Sandblaster worker-group role (see the module docstring).

    Args:
        config: The job's resolved config (its topology is Sandblaster).
        data: :class:`~hogwild.data.mnist.MnistData`.
        index: The role's index (0: there is one worker group).
        bind: The address its control server binds.
        keys: CURVE keys (beyond loopback).
    """

    def __init__(self, config, data, index: int, bind: str, keys: str | None = None) -> None:
        from hogwild.model.network import build_network
        from hogwild.training.job import plan_data

        check_job(config, data)
        self.config, self.index, self.bind, self.keys = config, index, bind, keys
        plan, n_total, _ = plan_data(config, data, 1)
        self.network = build_network(config.model, plan.n_classes)
        chosen = subset_indices(config.train.seed, n_total, config.train.subset)
        images = data.train_images if chosen is None else data.train_images[chosen]
        labels = data.train_labels if chosen is None else data.train_labels[chosen]
        self.images = np.ascontiguousarray(images.reshape(len(images), -1))
        self.labels = np.ascontiguousarray(labels, dtype=np.int64)
        self.n_train = len(self.labels)
        self.workers = config.cluster.workers_per_replica  # the topology's workers_per_group
        self.commands: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.share: _Share | None = None
        self.stopping = False
        self.last_contact = time.monotonic()
        self.last_train: tuple[int, int, int] | None = None
        self.batch_key: bytes | None = None  # the examples the L-BFGS below optimises over
        self.lbfgs: SandblasterLBFGS | None = None
        self.board: Board | None = None
        self.threads: list[threading.Thread] = []
        self.replicas: list[Replica] = []
        self.clients: list = []
        self.coordinator = None
        self.iterations = 0
        self.last_step: dict = {}
        self.silence_s = max(DRIVER_SILENCE_S, config.cluster.start_timeout_s * 2)

    # -- the network thread ----------------------------------------------------------------------

    def act(self, op: str, body: dict) -> dict:
        """A driver's request (on the network thread: record, answer)."""
        self.last_contact = time.monotonic()
        if op == "status":
            return self.status()
        if op == "describe":
            return {"replica": self.index, "workers": self.workers, "pid": os.getpid(),
                    "n_train": self.n_train, "framework": "sandblaster"}  # fmt: skip
        if op == "train":
            epoch = field(body, "epoch", int, minimum=0)
            start = field(body, "start", int, minimum=0)
            stop = field(body, "stop", int, minimum=0)
            field(body, "lr", (int, float), minimum=0)  # checked; L-BFGS chooses its own steps
            if not start < stop <= self.n_train:
                raise ControlRefused(f"share {start}:{stop} outside the {self.n_train} examples")
            key = (epoch, start, stop)
            if key != self.last_train:  # else: the driver resent a request already taken
                self.last_train = key
                self.commands.put(key)
            return {"ok": True}
        if op == "close":
            field(body, "epoch", int, minimum=0)
            return {"ok": True}  # an L-BFGS iteration is not cut short
        if op == "stop":
            self.stopping = True
            return {"ok": True}
        raise ControlRefused(f"unknown op {op!r} (status, describe, train, close, stop)")

    def status(self) -> dict:
        with self.lock:
            share = self.share
            out: dict = {"replica": self.index, "framework": "sandblaster"}
            out["sandblaster"] = self._counters()
            if share is None:
                return {**out, "state": "idle"}
            done = bool(share.seconds)
            return {
                **out,
                "state": "done" if done else "training",
                "epoch": share.epoch,
                "examples": share.examples if done else 0,
                "loss": share.loss if done else 0.0,
                "seconds": share.seconds or time.perf_counter() - share.started,
            }

    def _counters(self) -> dict:
        stats = self.board.scheduler.stats if self.board is not None else None
        return {
            "iterations": self.iterations,
            "evaluations": self.lbfgs.evaluations if self.lbfgs is not None else 0,
            "workers": self.workers,
            "portions": stats.portions if stats else 0,
            "backups": stats.backups if stats else 0,
            "duplicates": stats.duplicates if stats else 0,
            "lost": stats.lost if stats else 0,
            "kept": [r.kept for r in self.replicas],  # portions accepted from each thread
            **self.last_step,
        }

    # -- the main thread -----------------------------------------------------------------------

    def serve(self) -> int:
        """Start, serve the driver until it says stop (or is gone), release everything."""
        with terminate_as_interrupt():
            server = None
            try:
                self._warm_kernels()
                server = ControlServer(f"{self.bind}:0", self.config.ps.job, self.act, self.keys)
                address = server.start()
                self.last_contact = time.monotonic()
                print(
                    f"hogwild replica: serving sandblaster group {self.index} ({self.workers} "
                    f"replica thread(s), {self.n_train:,} examples, L-BFGS through "
                    f"{len(self.config.ps.servers)} parameter server(s)) on {address}",
                    file=sys.stderr,
                    flush=True,
                )
                self._loop()
                return 0
            finally:
                with deferred_signals():
                    if server is not None:
                        server.stop()
                    self._release()

    def _loop(self) -> None:
        while not self.stopping:
            if time.monotonic() - self.last_contact > self.silence_s:
                print(
                    f"hogwild replica {self.index}: no word from the driver for "
                    f"{self.silence_s:.0f} s; leaving",
                    file=sys.stderr,
                )
                return
            try:
                epoch, start, stop = self.commands.get(timeout=POLL_S)
            except queue.Empty:
                continue
            self._iterate(epoch, start, stop)

    def _iterate(self, epoch: int, start: int, stop: int) -> None:
        """One share: one L-BFGS iteration on the share's examples (the whole batch)."""
        with self.lock:
            self.share = _Share(epoch, stop - start, started=time.perf_counter())
        order = np.sort(epoch_permutation(self.config.train.seed, epoch, self.n_train)[start:stop])
        key = order.tobytes()
        if key != self.batch_key:
            self._begin(order)
            self.batch_key = key
        it = self.lbfgs.step()
        self.iterations += 1
        self.last_step = {"loss": it.loss, "step": it.step, "trials": it.evaluations,
                          "pairs": it.pairs}  # fmt: skip
        print(
            f"hogwild replica {self.index}: L-BFGS iteration {self.iterations}: loss "
            f"{it.loss:.5f}, step {it.step:.4g}, {it.evaluations} pass(es), {it.pairs} pair(s)"
            + (f"; {it.stop}: the history starts again" if it.stop else ""),
            file=sys.stderr,
            flush=True,
        )
        if it.stop:  # converged, or no descent: a fresh start (steepest descent) next epoch
            self.lbfgs = self._lbfgs()
        with self.lock:
            self.share.loss = it.loss * len(order)
            self.share.seconds = time.perf_counter() - self.share.started

    def _begin(self, order: np.ndarray) -> None:
        """The board, replica threads and L-BFGS for a batch of ``order``'s examples."""
        self._stop_replicas()
        config = self.config
        if self.coordinator is None:
            self.coordinator = self._client()
            self.clients.append(self.coordinator)
            check_servers(self.coordinator.status())
        portion = portion_size(len(order), self.workers)
        c = config.data
        examples = Examples(self.images, self.labels, order, portion, c.mean, c.std)
        scheduler = PortionScheduler(push_every=PUSH_EVERY, max_copies=MAX_COPIES)
        self.board = Board(scheduler, timeout_s=config.train.stall_s)
        self.objective = BatchObjective(
            self.coordinator, self.board, len(order), portion, l2=config.optim.weight_decay
        )
        for i in range(self.workers):
            if len(self.clients) <= i + 1:
                self.clients.append(self._client())
            replica = Replica(i, self.clients[i + 1], self.board,
                              PortionGradient(self.network, examples))  # fmt: skip
            self.replicas.append(replica)
            self.threads.append(
                threading.Thread(target=replica.run, name=f"sandblaster-{i}", daemon=True)
            )
            self.threads[-1].start()
        self.lbfgs = self._lbfgs()

    def _client(self):
        """A parameter-server client of its own (the coordinator's, or one replica's)."""
        from hogwild_plugins.ps.client import PSClient

        ps = self.config.ps
        return PSClient(
            list(ps.servers),
            ps.job,
            client_id=secrets.randbits(31),
            timeout_s=ps.timeout_s,
            retries=ps.retries,
            keys=ps.keys or None,
        )

    def _lbfgs(self) -> SandblasterLBFGS:
        return SandblasterLBFGS(self.coordinator, self.objective, LBFGSOptions())

    def _warm_kernels(self) -> None:
        """Compile (or load from the cache) the gradient kernel before saying ready."""
        examples = Examples(self.images, self.labels, np.zeros(1, np.int64), 1,
                            self.config.data.mean, self.config.data.std)  # fmt: skip
        gradient = PortionGradient(self.network, examples)
        gradient(np.zeros(self.network.n_params, np.float32), 0)

    def _stop_replicas(self) -> None:
        if self.board is not None:
            self.board.close()
        for thread in self.threads:
            thread.join(self.config.cluster.stop_timeout_s)
        self.threads, self.replicas = [], []

    def _release(self) -> None:
        self._stop_replicas()
        for client in self.clients:
            client.close()
        self.clients = []


def run_group(config, data, index: int, bind: str, keys: str | None) -> int:
    """``hogwild cluster replica`` for a Sandblaster job: serve the group until told to stop."""
    return SandblasterGroup(config, data, index, bind, keys).serve()
