"""A model replica of a cluster job: the single-node engine, its epochs given by the driver.

Adam section 3.2 and DistBelief's Downpour (section 4.1): a replica is the trainer of
:mod:`hogwild.training.trainer` (its arena, its ``cluster.workers_per_replica`` worker
processes training Hogwild-style, each on its copy of the parameters) whose parameter store is
``ps``: the copies' communication threads push every ``train.n_push`` examples and pull every
``train.n_fetch`` from the parameter servers (the wait is measured: ``store_wait_s``). What a
replica does not decide is its work: it serves control requests (:mod:`hogwild.net.control`)
from the driver, which runs :mod:`hogwild.cluster.coordinator`:

- ``train`` (epoch, lr, seed, start, stop): train the portion ``order[start:stop]`` of the
  epoch's permutation (computed here from the job's seed), split over the replica's workers,
  after the portions it holds already (the driver hands out the next one ahead, so the workers
  go on without waiting for it);
- ``close`` (epoch): stop what it holds of the epoch at the next chunk (Adam's epoch rule
  across replicas);
- ``status``: the epoch's finished portions with their figures, and the progress of the one
  under way;
- ``stop``: leave.

With several server groups (distributed Hogwild, SINGA 5.2) the replica is a worker group bound
to its own server group (``ps.servers``); the first replica bound to each server group, after
every ``cluster.sync_every`` examples it has trained (and before it reports a portion done), moves
its server group to the groups' mean (:mod:`hogwild_plugins.ps.groups`, through the
shards' operations) while its workers go on training.

The network thread only records a command; the main thread acts on it, drives the workers and
keeps the portions' state. A replica whose driver has not asked anything for
``DRIVER_SILENCE_S`` seconds takes the driver for dead and leaves, releasing everything.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from dataclasses import dataclass

from hogwild.cluster.topology import resolve_topology
from hogwild.model.random import worker_seed
from hogwild.net.control import ControlRefused, ControlServer, field
from hogwild.net.metrics import serve_metrics
from hogwild.shm.sweeper import sweep_report
from hogwild.signals import deferred_signals, terminate_as_interrupt
from hogwild.training.job import (
    CONTROL_EPOCH,
    EPOCH_CLOSED,
    STAT_EXAMPLES,
    STAT_LOSS,
    epoch_permutation,
)
from hogwild.training.messages import Train, Trained
from hogwild.training.trainer import Trainer

DRIVER_SILENCE_S = 120.0
POLL_S = 0.05


@dataclass
class Portion:
    """One portion of an epoch on this replica, as the driver sees it through ``status``."""

    epoch: int
    start: int
    stop: int
    examples_before: float
    loss_before: float
    started: float
    answered: int = 0
    examples: int = 0
    loss: float = 0.0
    correct: int = 0
    data_wait_s: float = 0.0
    store_wait_s: float = 0.0
    seconds: float = 0.0  # set once every worker answered

    def figures(self) -> dict:
        return {
            "start": self.start,
            "examples": self.examples,
            "loss": self.loss,
            "correct": self.correct,
            "data_wait_s": self.data_wait_s,
            "store_wait_s": self.store_wait_s,
        }


class Replica(Trainer):
    """One model replica (see the module docstring)."""

    def __init__(self, config, data, index: int, bind: str, keys: str | None = None) -> None:
        config = config.override(
            {
                "train.workers": config.cluster.workers_per_replica,
                "train.parameters": "ps",
                "train.sync": False,
                "output.checkpoint_dir": "",
                "output.metrics": "",
                "output.progress": False,
            }
        )
        super().__init__(config, data)
        self.n_test = 0  # the driver evaluates: no test examples in a replica's arena
        self.index, self.bind, self.keys = index, bind, keys
        self.commands: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.portion: Portion | None = None  # the one under way, or the last one finished
        self.finished: list[Portion] = []  # the epoch's finished portions, in order
        self.epoch_started = 0.0  # when the epoch's first portion began here
        self.stopping = False
        self.last_contact = time.monotonic()
        self.last_train: tuple[int, int, int] | None = None  # a resent `train` is not run twice
        self.closed_epoch = -1  # a `close` that came before a portion began still closes it
        # The driver asks every live replica at least every few seconds; it may be busy starting
        # the other replicas for up to start_timeout_s each before it asks anything.
        cluster = config.cluster
        self.silence_s = max(DRIVER_SILENCE_S, cluster.start_timeout_s * (cluster.replicas + 1))
        topology = resolve_topology(cluster, config.ps.rule)
        per_group = max(1, topology.worker_groups // topology.server_groups)
        self.server_group = index // per_group  # as the driver binds replicas to server groups
        # one synchroniser per server group: two moving one group at once would move it twice
        self.sync_every = topology.sync_every if index % per_group == 0 else 0
        self.groups = None  # several server groups: every group's clients, once serving
        self.synced_at = 0.0  # examples trained (in all) at the last synchronisation
        self.syncs, self.sync_s, self.sync_spread = 0, 0.0, 0.0

    # -- the network thread --------------------------------------------------------------------

    def act(self, op: str, body: dict) -> dict:
        """A driver's request (on the network thread: record, answer)."""
        self.last_contact = time.monotonic()
        if op == "status":
            return self.status()
        if op == "describe":
            return {
                "replica": self.index,
                "workers": self.n_workers,
                "pid": os.getpid(),
                "n_train": self.n_train,
                "cpus": [p.cpu for p in self.placements],
            }
        if op == "train":
            command = Train(
                field(body, "epoch", int, minimum=0),
                float(field(body, "lr", (int, float), minimum=0)),
                field(body, "start", int, minimum=0),
                field(body, "stop", int, minimum=0),
                field(body, "seed", int, minimum=0),
            )
            if not command.start <= command.stop <= self.n_train:
                raise ControlRefused(
                    f"portion {command.start}:{command.stop} outside the {self.n_train} examples"
                )
            key = (command.epoch, command.start, command.stop)
            if key != self.last_train:  # else: the driver resent a request already taken
                self.last_train = key
                self.commands.put(command)
                self.gang.wake()  # an idle main thread begins it now, not at its next poll
            return {"ok": True}
        if op == "close":
            epoch = field(body, "epoch", int, minimum=0)
            with self.lock:
                self.closed_epoch = max(self.closed_epoch, epoch)
                portion = self.portion
                if portion is not None and portion.epoch == epoch and not portion.seconds:
                    self.arena.array("control")[CONTROL_EPOCH] = EPOCH_CLOSED
            return {"ok": True}
        if op == "stop":
            self.stopping = True
            self.gang.wake()
            return {"ok": True}
        raise ControlRefused(f"unknown op {op!r} (status, describe, train, close, stop)")

    def status(self) -> dict:
        """The epoch's portions here: finished (each one's figures) and the one under way, and
        the epoch's figures so far (see :func:`hogwild.cluster.coordinator.status_events`)."""
        with self.lock:
            portion = self.portion
            if portion is None:
                return {"replica": self.index, "state": "idle"}
            finished = list(self.finished)
            running = not portion.seconds
            out = {
                "replica": self.index,
                "state": "training" if running or not self.commands.empty() else "done",
                "epoch": portion.epoch,
                "finished": [p.figures() for p in finished],
                "correct": sum(p.correct for p in finished),  # the finished portions'
                "data_wait_s": sum(p.data_wait_s for p in finished),
                "store_wait_s": sum(p.store_wait_s for p in finished),
            }
            examples = sum(p.examples for p in finished)
            loss = sum(p.loss for p in finished)
            if running:
                stats = self.arena.array("stats")
                trained = int(stats[:, STAT_EXAMPLES].sum() - portion.examples_before)
                out["portion"] = {
                    "start": portion.start,
                    "stop": portion.stop,
                    "examples": trained,
                    "seconds": time.perf_counter() - portion.started,
                }
                examples += trained
                loss += float(stats[:, STAT_LOSS].sum() - portion.loss_before)
            last = portion.started + portion.seconds if not running else time.perf_counter()
            out.update(examples=examples, loss=loss, seconds=last - self.epoch_started)
            if self.syncs:
                out.update(syncs=self.syncs, sync_s=self.sync_s, sync_spread=self.sync_spread)
            return out

    # -- the main thread -----------------------------------------------------------------------

    def serve(self) -> int:
        """Start, serve the driver until it says stop (or is gone), release everything."""
        with terminate_as_interrupt():
            server = endpoint = None
            try:
                for line in sweep_report():
                    print(f"hogwild replica {self.index}: {line}", file=sys.stderr)
                self._start()
                if self.sync_every:
                    self.groups = self._server_groups()
                server = ControlServer(f"{self.bind}:0", self.store.reach["job"], self.act,
                                       self.keys)  # fmt: skip
                address = server.start()
                self.last_contact = time.monotonic()  # start-up is not the driver's silence
                endpoint = serve_metrics(
                    "replica", f"replica {self.index}", self.config.cluster.metrics_port,
                    self.status,
                )  # fmt: skip
                print(
                    f"hogwild replica: serving replica {self.index} ({self.n_workers} worker(s) "
                    f"on CPUs {', '.join(str(p.cpu) for p in self.placements)}; "
                    f"{self.store.summary()}) on {address}",
                    file=sys.stderr,
                    flush=True,
                )
                self._loop()
                return 0
            finally:
                with deferred_signals():
                    if self.groups is not None:
                        self.groups.close()
                        self.groups = None
                    if endpoint is not None:
                        endpoint.close()
                    if server is not None:
                        server.stop()
                    self._shutdown()

    def _loop(self) -> None:
        while not self.stopping:
            if time.monotonic() - self.last_contact > self.silence_s:
                print(
                    f"hogwild replica {self.index}: no word from the driver for "
                    f"{self.silence_s:.0f} s; leaving",
                    file=sys.stderr,
                )
                return
            portion = self.portion
            if portion is None or portion.seconds:  # idle: the next portion it holds, if any
                try:
                    self._begin(self.commands.get_nowait())
                except queue.Empty:
                    pass
            message = self.gang.poll(f"replica {self.index}'s portion", POLL_S)
            if isinstance(message, Trained):
                self._answered(message)
            portion = self.portion
            if self.groups is not None and portion is not None and not portion.seconds:
                self._sync_when_due()  # while training: a finished portion has synchronised

    def _server_groups(self):
        from hogwild_plugins.ps.groups import ServerGroups, split_groups

        config = self.config
        groups = split_groups(config.cluster.group_servers, config.cluster.ps)
        return ServerGroups(
            groups,
            self.store.reach["job"],
            f"replica-{self.index}",
            timeout_s=config.ps.timeout_s,
            retries=config.ps.retries,
            keys=config.ps.keys or None,
        )

    def _sync_when_due(self) -> None:
        """Every ``sync_every`` examples this worker group trained: its server group to the
        groups' mean."""
        trained = float(self.arena.array("stats")[:, STAT_EXAMPLES].sum())
        if trained - self.synced_at < self.sync_every:
            return
        self.synced_at = trained
        result = self.groups.sync(own=self.server_group)
        with self.lock:
            self.syncs += 1
            self.sync_s += result.seconds
            self.sync_spread = result.spread

    def _begin(self, command: Train) -> None:
        stats, control = self.arena.array("stats"), self.arena.array("control")
        previous = self.portion
        new_epoch = previous is None or previous.epoch != command.epoch
        if new_epoch:
            if previous is not None:  # every copy takes the servers' model before the epoch
                self.store.end_epoch()
            self.arena.array("order")[:] = epoch_permutation(
                self.config.train.seed, command.epoch, self.n_train
            )
        with self.lock:
            started = time.perf_counter()
            if new_epoch:
                self.finished, self.epoch_started = [], started
            self.portion = Portion(
                command.epoch,
                command.start,
                command.stop,
                float(stats[:, STAT_EXAMPLES].sum()),
                float(stats[:, STAT_LOSS].sum()),
                started,
            )
            control[CONTROL_EPOCH] = command.epoch
            if command.epoch <= self.closed_epoch:  # closed before it began: stop at once
                control[CONTROL_EPOCH] = EPOCH_CLOSED
        size = command.stop - command.start
        for worker in range(self.n_workers):
            lo = command.start + round(worker * size / self.n_workers)
            hi = command.start + round((worker + 1) * size / self.n_workers)
            seed = worker_seed(command.seed, command.epoch, worker)
            self.gang.send(worker, Train(command.epoch, command.lr, lo, hi, seed))

    def _answered(self, message: Trained) -> None:
        portion = self.portion
        if portion is None or message.epoch != portion.epoch or portion.seconds:
            return
        portion.answered += 1
        portion.examples += message.examples
        portion.loss += message.loss
        portion.correct += message.correct
        portion.data_wait_s += message.data_wait_s
        portion.store_wait_s += message.store_wait_s
        if portion.answered == self.n_workers:
            if self.groups is not None:  # before "done": the driver's sync must not overlap it
                self._sync_when_due()
            with self.lock:
                portion.seconds = time.perf_counter() - portion.started
                self.finished.append(portion)


def run_replica(args) -> int:
    """``hogwild cluster replica``: one replica of a running cluster job (started by a launcher);
    with Sandblaster's or AllReduce's topology, the worker group
    (``hogwild_plugins.ps.sandblaster.group``)."""
    from hogwild.config import load_config
    from hogwild.data.plan import load_data

    config = load_config(args.config, getattr(args, "overrides", None) or None)
    keys = args.keys or config.ps.keys or None
    if resolve_topology(config.cluster, config.ps.rule).coordinated:  # sandblaster, allreduce
        from hogwild_plugins.ps.sandblaster.group import run_group

        return run_group(config, load_data(config, args.data), args.index, args.bind, keys)
    replica = Replica(config, load_data(config, args.data), args.index, args.bind, keys)
    return replica.serve()
