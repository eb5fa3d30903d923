"""The messages between the trainer and its workers: commands down, answers up.

Each is a small frozen dataclass (pickled by ``multiprocessing`` between processes of one job on
one machine; nothing here ever crosses a network). Commands: :class:`Train`, :class:`Evaluate`,
:class:`Stop`. Answers: :class:`Ready`, :class:`Trained`, :class:`Evaluated`, and the three
failures, :class:`Failed` (a traceback), :class:`DataFailed` (a one-line data error the user
can act on) and :class:`StoppedFailed` (a parameter server stopped the bucket: no restart
helps); :class:`Wake` is the parent's own, put on the answer queue by another of its threads.
:class:`WorkerSetup` is everything a worker process is started with.
"""

from __future__ import annotations

from dataclasses import dataclass

from hogwild.numa.placement import WorkerPlacement
from hogwild.store.protocol import WorkerSpec


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker process is started with.

    Attributes:
        worker: Its index.
        trainer_pid: The trainer's pid, and ``trainer_started`` its start time (psutil), so the
            worker can tell the trainer died even when its own parent is a forkserver.
        arena_name, layout_json: The job's arena and its layout.
        config: The resolved job config (``Config.to_dict()``).
        plan: The :class:`~hogwild.data.plan.DataPlan` as a dict.
        placement: Where it runs.
        store: How to open its side of the parameter store.
    """

    worker: int
    trainer_pid: int
    trainer_started: float
    arena_name: str
    layout_json: str
    config: dict
    plan: dict
    placement: WorkerPlacement
    store: WorkerSpec


@dataclass(frozen=True)
class Train:
    """Train ``order[start:stop]`` of epoch ``epoch`` at learning rate ``lr``, or, if
    ``lr_end`` is given, at a rate moving from ``lr`` to ``lr_end`` across the shard
    (:func:`hogwild.optim.schedule.rate_within`)."""

    epoch: int
    lr: float
    start: int
    stop: int
    seed: int
    lr_end: float | None = None


@dataclass(frozen=True)
class Evaluate:
    """Loss and accuracy of test examples ``start:stop``."""

    start: int
    stop: int


@dataclass(frozen=True)
class Stop:
    """Detach and exit."""


@dataclass(frozen=True)
class Wake:
    """Not from a worker: another thread of the parent has work for the thread waiting on the
    answers (:meth:`~hogwild.training.gang.WorkerGang.wake`)."""


@dataclass(frozen=True)
class Pinned:
    """The worker is pinned to its CPU and named: other jobs' planning sees its core taken."""

    worker: int


@dataclass(frozen=True)
class Ready:
    worker: int
    pid: int
    context_bytes: int


@dataclass(frozen=True)
class Trained:
    worker: int
    epoch: int
    examples: int
    loss: float
    correct: int
    data_wait_s: float
    store_wait_s: float


@dataclass(frozen=True)
class Evaluated:
    worker: int
    examples: int
    loss: float
    correct: int


@dataclass(frozen=True)
class Failed:
    worker: int
    traceback: str


@dataclass(frozen=True)
class DataFailed:
    worker: int
    message: str


@dataclass(frozen=True)
class StoppedFailed:
    """A worker's parameter server refused it ``STOPPED`` (a :class:`~hogwild.errors.
    StoppedError`): the message, one line."""

    worker: int
    message: str
