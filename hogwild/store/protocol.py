"""The parameter-store seam (docs/design.md): where parameters come from and where progress goes.

``train.parameters`` names a store (:mod:`hogwild.store.registry`); the trainer and the workers
talk to it only through the two classes here and never know which one they have.

Parent side, :class:`ParameterStore`: planned from the job (``config``, ``network``, the workers'
placements), it adds its regions to the job's arena layout, attaches to the arena once it exists
(placing pages), takes the model's state (initial or restored from a checkpoint: :meth:`load`),
makes one model again at every epoch end while the workers are idle (:meth:`end_epoch`), gives a
consistent snapshot for evaluation and checkpoints, tells each worker how to open its side
(:meth:`worker_spec`, plain data that crosses process creation) and releases what it holds.

Worker side, :class:`WorkerStore`: the ``params`` and ``velocity`` arrays the worker trains on,
:meth:`~WorkerStore.span` (how many of the next examples to train before the store wants to look:
its push and pull cadences, DistBelief's ``n_push`` and ``n_fetch``, fall on unit boundaries),
:meth:`~WorkerStore.trained` after every span (with the training context, from which a store may
take the fully connected layers' activation and error vectors instead of their deltas, Adam
section 3.2.6), :meth:`~WorkerStore.finish` when the worker's share of an epoch is done (push what
is left and wait for it), ``wait_s`` (seconds the compute loop waited for the store) and close.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from hogwild.config import Config
    from hogwild.model.network import Network
    from hogwild.numa.placement import WorkerPlacement
    from hogwild.shm.arena import Arena, ArenaLayout


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to open its side of a store: the store's name and plain values."""

    store: str
    worker: int
    values: dict[str, Any] = field(default_factory=dict)


class ParameterStore(ABC):
    """The parent side of a parameter store."""

    name: ClassVar[str]
    #: Examples between exchanges when ``train.n_push`` / ``train.n_fetch`` are 0 (the
    #: default): what an exchange with this store's home is worth its cost at (0: none).
    cadence: ClassVar[int] = 0

    @classmethod
    def own_cadence(cls, config: Config) -> int:
        """The cadence a job with ``train.n_push`` (or ``n_fetch``) 0 runs: :attr:`cadence`
        unless the store knows better for this job."""
        return cls.cadence

    @classmethod
    def version_words(cls, n_params: int) -> int:
        """An upper bound on the length of :meth:`~hogwild.store.exchange.Home.versions` for a
        model of ``n_params`` parameters (0: its homes have no versions): the words a region
        needs that hands one home's pulled versions to another's
        (:mod:`hogwild.partition.host_rows`)."""
        return 0

    @classmethod
    def cadences(cls, config: Config) -> tuple[int, int]:
        """``train.n_push`` and ``train.n_fetch`` as this store runs them (0: its own)."""
        train = config.train
        own = 0 if train.n_push and train.n_fetch else cls.own_cadence(config)
        return train.n_push or own, train.n_fetch or own

    def __init__(
        self, config: Config, network: Network, placements: tuple[WorkerPlacement, ...]
    ) -> None:
        self.config, self.network, self.placements = config, network, tuple(placements)
        self.placed: bool | None = None  # whether libnuma placed the pages (None: not yet)

    @abstractmethod
    def add_regions(self, layout: ArenaLayout) -> None:
        """Add the store's regions (parameters, optimizer state, copies) to the job's layout."""

    @abstractmethod
    def attach(self, arena: Arena) -> None:
        """Take views of the store's regions in the new arena and place their pages."""

    @abstractmethod
    def load(self, params: np.ndarray, velocity: np.ndarray) -> None:
        """Make ``params`` and ``velocity`` (initial, or restored) the state every worker sees."""

    @abstractmethod
    def end_epoch(self) -> None:
        """One model again, for evaluation and the checkpoint (every worker has finished)."""

    @abstractmethod
    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """The model's parameters and velocity as one consistent state (valid until training)."""

    @abstractmethod
    def worker_spec(self, worker: int) -> WorkerSpec:
        """What ``worker`` needs to open its side (:meth:`open_worker`)."""

    @classmethod
    @abstractmethod
    def open_worker(
        cls, spec: WorkerSpec, arena: Arena, network: Network, job: Config
    ) -> WorkerStore:
        """The worker side, in the worker's process."""

    @property
    def writers_per_copy(self) -> int:
        """The most workers that write one copy of the parameters (all of them: one copy)."""
        return len(self.placements)

    def compile_kernels(self) -> None:  # noqa: B027 - stores without kernels need nothing here
        """Compile (into numba's cache) what the workers' side runs, before they start."""

    def watch_home(self, alive: Callable[[], bool]) -> None:  # noqa: B027 - a local home: no wait
        """While the parent side waits on a remote home, ask ``alive()`` now and then; False, or
        what it raises, ends the wait (a cluster driver checks its roles: a dead server ends
        the wait with the job's error, not after every retry)."""

    def home_status(self) -> list[dict]:
        """The counters of the parameters' home when it is remote (a server's each), else []."""
        return []

    def describe(self) -> dict:
        """Where the parameters are, for the job's start record."""
        return {"store": self.name}

    def summary(self) -> str | None:
        """One line for the start of the job: what was chosen and why (None: nothing to say)."""
        return None

    def close(self) -> None:  # noqa: B027 - the arena owns what most stores hold
        """Release what the store holds beyond the arena (connections, threads)."""


class WorkerStore:
    """The worker side of a store: the arrays to train on, and the cadence of the exchanges.

    This base class trains on ``params`` and ``velocity`` as they are and exchanges nothing (the
    one shared copy); stores with copies override the methods.
    """

    def __init__(self, params: np.ndarray, velocity: np.ndarray) -> None:
        self.params, self.velocity = params, velocity

    def start_epoch(self, lr: float) -> None:
        """A share of an epoch begins, trained at learning rate ``lr``."""

    def span(self, examples: int) -> int:
        """How many of the next ``examples`` to train before calling :meth:`trained`."""
        return examples

    def trained(self, examples: int, context) -> None:
        """``examples`` more were trained (the last of them are in ``context``'s rows)."""

    def finish(self) -> None:
        """The worker's share of the epoch is done: push what is left, wait until it is home."""

    @property
    def wait_s(self) -> float:
        """Seconds the compute loop has waited for the store, in total."""
        return 0.0

    def close(self) -> None:
        """Stop the store's threads and drop its views (before the arena is unmapped)."""


def open_worker_store(spec: WorkerSpec, arena: Arena, network: Network, job: Config) -> WorkerStore:
    """Open the worker side of the store ``spec`` names (looked up in the registry)."""
    from hogwild.store.registry import store_class

    return store_class(spec.store).open_worker(spec, arena, network, job)
