"""What every replica role keeps for the driver: its commands, and its portions of an epoch.

:class:`~hogwild.cluster.serving.ReplicaServer` serves any
:class:`~hogwild.cluster.serving.ServedRole`; the roles differ in how they train (the
single-node engine of :mod:`hogwild.cluster.replica`, K partition processes of
:mod:`hogwild.cluster.partitioned`, a synchronous worker group a plugin registers through
:mod:`hogwild.cluster.services`), not in what the driver sees of them. That common part is
written once here:

- :class:`ReplicaRole`: what the network thread does with the driver's requests. A ``train``
  must lie within the role's examples and is queued on :attr:`ReplicaRole.commands` (at most
  :data:`~hogwild.cluster.serving.MAX_QUEUED_PORTIONS`); a ``close`` records the latest epoch
  closed (one that comes before its portion began still closes it); ``queued``, ``close`` and
  ``stop`` wake the main thread (:meth:`ReplicaRole.wake_main`). A role takes its driver for dead
  after :attr:`ReplicaRole.silence_s` seconds of silence, which allows for the driver starting
  the other roles first.
- :class:`PortionRole`: a role that trains the driver's portions one after another and reports
  each (:class:`Portion`): ``status`` lists the epoch's finished portions with their figures and
  the progress of the one under way, read from the role's arena counters
  (:meth:`PortionRole.totals`) against their values when it began; the shape is the one
  :func:`hogwild.cluster.coordinator.status_events` reads. It also serves the role's figures to
  Prometheus (``cluster.metrics_port``).

The portions' state is shared by the network thread (``status``, ``close``) and the main thread
(which begins and finishes portions): both take :attr:`ReplicaRole.lock`.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from hogwild.cluster.serving import DRIVER_SILENCE_S, MAX_QUEUED_PORTIONS
from hogwild.net.control import ControlRefused
from hogwild.net.metrics import serve_metrics
from hogwild.optim.schedule import peak_learning_rate
from hogwild.training.job import STAT_EXAMPLES, STAT_LOSS  # the partitions' columns are alike
from hogwild.training.messages import Train

__all__ = ["Portion", "PortionRole", "ReplicaRole", "driver_silence_s"]


def driver_silence_s(config, starts: int) -> float:
    """How long a role waits for a word from its driver before leaving: at least
    :data:`~hogwild.cluster.serving.DRIVER_SILENCE_S`, and ``starts`` role start-ups
    (``cluster.start_timeout_s`` each) that the driver may be busy with before it asks anything."""
    return max(DRIVER_SILENCE_S, config.cluster.start_timeout_s * starts)


class ReplicaRole:
    """The driver's requests as every replica role takes them (see the module docstring).

    A subclass sets :attr:`n_train` and ``job`` and implements the rest of
    :class:`~hogwild.cluster.serving.ServedRole` (``start``, ``started``, ``status``, ``step``,
    ``release``); :meth:`facts` adds to ``describe``.
    """

    unit = "portion"  # what a `train` hands over, as a refusal names it
    least_examples = 0  # a `train` of fewer examples is refused
    n_train: int

    def __init__(self, config, index: int, silence_s: float) -> None:
        self.index = index
        self.commands: queue.Queue = queue.Queue(MAX_QUEUED_PORTIONS)
        self.max_lr = peak_learning_rate(config.optim)  # what the driver may ask for at most
        self.silence_s = silence_s
        self.lock = threading.Lock()
        self.closed_epoch = -1  # a `close` that came before a portion began still closes it
        self.stopping = False

    # -- the network thread (ReplicaServer's requests) --------------------------------------------

    def describe(self) -> dict:
        return {"replica": self.index, "pid": os.getpid(), "n_train": self.n_train, **self.facts()}

    def facts(self) -> dict:
        """What ``describe`` says of this kind of role (its workers, CPUs, framework)."""
        return {}

    def check_train(self, command: Train) -> None:
        if not command.start + self.least_examples <= command.stop <= self.n_train:
            raise ControlRefused(
                f"{self.unit} {command.start}:{command.stop} outside the {self.n_train} examples"
            )

    def queued(self) -> None:
        self.wake_main()

    def close(self, epoch: int) -> None:
        with self.lock:
            self.closed_epoch = max(self.closed_epoch, epoch)
            self.closing(epoch)
        self.wake_main()

    def stop(self) -> None:
        self.stopping = True
        self.wake_main()

    def closing(self, epoch: int) -> None:
        """``close`` (network thread, under :attr:`lock`): what the role stops of ``epoch`` now
        rather than at the main thread's next turn."""

    def wake_main(self) -> None:
        """Wake the main thread from its wait for work (it waits at most ``POLL_S``)."""


@dataclass
class Portion:
    """One portion of an epoch on a role, as the driver sees it through ``status``."""

    epoch: int
    start: int
    stop: int
    before: np.ndarray  # the role's statistics summed over its workers, when it began
    started: float  # time.perf_counter()
    examples: int = 0
    loss: float = 0.0
    correct: int = 0
    data_wait_s: float = 0.0
    store_wait_s: float = 0.0
    seconds: float = 0.0  # set once done

    @property
    def running(self) -> bool:
        return not self.seconds

    def figures(self) -> dict:
        return {
            "start": self.start,
            "examples": self.examples,
            "loss": self.loss,
            "correct": self.correct,
            "data_wait_s": self.data_wait_s,
            "store_wait_s": self.store_wait_s,
        }


class PortionRole(ReplicaRole):
    """A role training the driver's portions one at a time, on an arena whose ``stats`` rows
    count each worker's examples, loss and correct answers (see the module docstring).

    The main thread calls :meth:`begin` when it takes a portion and :meth:`finish` once it is
    done; ``status`` (network thread) reads both.
    """

    arena: object  # the role's arena (set by the engine it trains with)
    portion_type: type[Portion] = Portion  # a role may keep more of each portion

    def __init__(self, config, index: int, silence_s: float) -> None:
        super().__init__(config, index, silence_s)
        self.metrics_port = config.cluster.metrics_port
        self.portion: Portion | None = None  # the one under way, or the last one finished
        self.finished: list[Portion] = []  # the epoch's finished portions, in order
        self.epoch_started = 0.0  # when the epoch's first portion began here
        self.endpoint = None  # its Prometheus endpoint (cluster.metrics_port)

    def totals(self) -> np.ndarray:
        """The statistics of every worker summed (a row of the arena's ``stats``)."""
        return self.arena.array("stats").sum(axis=0)

    # -- the network thread ------------------------------------------------------------------------

    def status(self) -> dict:
        """The epoch's portions here: finished (each one's figures) and the one under way, and
        the epoch's figures so far (see :func:`hogwild.cluster.coordinator.status_events`)."""
        with self.lock:
            portion = self.portion
            if portion is None:
                return {"replica": self.index, "state": "idle"}
            finished = list(self.finished)
            running = portion.running
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
                now = self.totals() - portion.before
                trained = int(now[STAT_EXAMPLES])
                out["portion"] = {
                    "start": portion.start,
                    "stop": portion.stop,
                    "examples": trained,
                    "seconds": time.perf_counter() - portion.started,
                }
                examples += trained
                loss += float(now[STAT_LOSS])
            last = portion.started + portion.seconds if not running else time.perf_counter()
            out.update(examples=examples, loss=loss, seconds=last - self.epoch_started)
            out.update(self.more_status())
            return out

    def more_status(self) -> dict:
        """What ``status`` adds for this kind of role (under :attr:`lock`)."""
        return {}

    # -- the main thread ---------------------------------------------------------------------------

    def started(self, address: str) -> None:
        self.endpoint = serve_metrics(
            "replica", f"replica {self.index}", self.metrics_port, self.status
        )

    def begin(self, command: Train) -> bool:
        """Take ``command`` as the portion under way (its counters from now; a new epoch's first
        starts the epoch's list); whether it was closed before it began (it then trains
        nothing). :meth:`beginning` runs under the lock, so a ``close`` sees it begun or not."""
        previous = self.portion
        with self.lock:
            started = time.perf_counter()
            if previous is None or previous.epoch != command.epoch:
                self.finished, self.epoch_started = [], started
            self.portion = self.portion_type(
                command.epoch, command.start, command.stop, self.totals().copy(), started
            )
            closed = command.epoch <= self.closed_epoch
            self.beginning(command, closed)
            return closed

    def beginning(self, command: Train, closed: bool) -> None:
        """(Main thread, under :attr:`lock`.) What the role sets as a portion begins."""

    def finish(self, portion: Portion, **figures) -> None:
        """``portion`` is done, with ``figures`` (its fields: ``examples``, ``loss``...) where
        the role did not count them into it as it went: the driver sees it finished."""
        unknown = set(figures) - {f.name for f in dataclasses.fields(portion)}
        if unknown:
            raise TypeError(f"a portion has no figures {sorted(unknown)}")
        with self.lock:
            for name, value in figures.items():
                setattr(portion, name, value)
            portion.seconds = time.perf_counter() - portion.started
            self.finished.append(portion)

    def release_endpoint(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
