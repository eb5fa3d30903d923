"""Stores whose workers train on copies of the parameters exchanged with a home: the common part.

A copy per worker, or per NUMA node, lives in the arena beside a *home* (DistBelief's model
replicas and parameter server, Adam section 3.3, on one machine or over the network). A copy's
*leader* (its only worker, or the node's first) runs an :class:`~hogwild.store.exchange.Exchanger`
that pushes the copy's progress home every ``train.n_push`` examples and pulls the others' every
``train.n_fetch`` (0, the default: the store's :attr:`cadence`); the node's other workers train
on the copy without locks, as Adam's workers share a machine's weights. At every epoch end, with
every worker idle, the store makes one model (:meth:`CopiesStore.end_epoch`: fold the copies'
progress home, give every copy the result; the velocity, optimizer state that is not exchanged
during an epoch, becomes the copies' mean), so evaluation, checkpoints and resume see one model.
Subclasses say where home is: the arena (:mod:`hogwild.store.replicate`) or a parameter server
(the ``ps`` plugin), and how often an exchange with it pays (:meth:`CopiesStore.own_cadence`).

**A public seam.** :class:`CopiesStore` and :class:`~hogwild.store.exchange.Home` are meant to be
subclassed outside the engine (the ``ps`` plugin does); what a subclass may rely on and must
provide is this, and nothing else of the module:

* it sets :attr:`~CopiesStore.name`, :attr:`~CopiesStore.home_is_local` and
  :attr:`~CopiesStore.cadence` (or overrides :meth:`~CopiesStore.own_cadence`);
* it implements :meth:`~CopiesStore.gather_home` (bring every copy's unpushed progress home,
  every worker idle), :meth:`~CopiesStore.home_spec` (what a leader needs to reach home, plain
  values) and :meth:`~CopiesStore.open_home` (the leader's :class:`~hogwild.store.exchange.Home`,
  built from those values in the worker's process);
* it may override :meth:`~CopiesStore.load` (then calling :meth:`~CopiesStore.spread_home`),
  :meth:`~CopiesStore.attach`, :meth:`~CopiesStore.auto_fc_push`, :meth:`~CopiesStore.describe`,
  :meth:`~CopiesStore.home_name` and the parent-side methods of
  :class:`~hogwild.store.protocol.ParameterStore`;
* it reads, once attached, ``config``, ``network``, ``params`` and ``velocity`` (the arena's
  home copy), ``layers`` (the fully connected layers), ``n_push`` and ``n_fetch``;
* for a partitioned replica's hosts (:mod:`hogwild.partition.host_rows`,
  :mod:`hogwild.partition.takes`) it may override
  :meth:`~hogwild.store.protocol.ParameterStore.version_words` (default 0: no ``versions``
  region), and its home :meth:`~hogwild.store.exchange.Home.versions` (default None) and
  :meth:`~hogwild.store.exchange.Home.adopt` (default: nothing): a home that returns versions
  needs its store's ``version_words`` to cover them, or a host's take raises.

``train.replicas = "auto"`` chooses (:func:`choose_copies`): a copy per worker while the copies
take at most an eighth of the machine's memory (and a quarter of the free ``/dev/shm``), else a
copy per NUMA node, else one copy; one worker (or one node, when copies per worker do not fit)
needs no copy at all. The start-up line says which and why.
"""

from __future__ import annotations

import mmap
import os
import shutil
from dataclasses import dataclass

import numpy as np
import psutil

from hogwild.config.checks import push_decay_problem
from hogwild.errors import ConfigError
from hogwild.model.network import COL_C, COL_IN, COL_O, COL_OP, COL_OUT, COL_W, OP_FC
from hogwild.numa.pinning import bind_memory, first_touch, interleave_memory
from hogwild.numa.placement import plan_parameters
from hogwild.optim.interval import training_unit
from hogwild.store.exchange import Exchanger, FcLayer, Home, VectorBuffer
from hogwild.store.protocol import ParameterStore, WorkerSpec, WorkerStore
from hogwild.store.shared import add_home_regions, worker_nodes

PAGE = mmap.PAGESIZE
COPY_REGIONS = ("copy_params", "copy_velocity", "copy_base")
MEMORY_SHARE = 8  # copies per worker may take 1/8 of the machine's memory
SHM_SHARE = 4  # ... and 1/4 of the free /dev/shm
# The store's own ramp at most this many examples per step: the full cadence of 64 within 16,128
# examples per copy whatever the copies (64 x copies measured up to four copies, which it is;
# bench/results/copies_at_start.md)
RAMP_CAP = 256


@dataclass(frozen=True)
class CopyChoice:
    """How many copies, of what, and why (the start-up line quotes ``reason``)."""

    per: str  # "worker", "node" or "one" (no copies: the workers train on home)
    reason: str


def choose_copies(
    requested: str,
    n_workers: int,
    n_nodes: int,
    copy_bytes: int,
    memory_bytes: int,
    shm_free_bytes: int,
    home_is_local: bool = True,
) -> CopyChoice:
    """Resolve ``train.replicas`` (``auto``, ``worker`` or ``node``) for this job and machine.

    ``home_is_local``: the home is in this arena, so the workers may train on it directly ("one");
    a remote home (the parameter servers) always needs at least a copy per node.
    """
    if requested == "worker":
        return CopyChoice("worker", "train.replicas = 'worker'")
    if requested == "node":
        return CopyChoice("node", "train.replicas = 'node'")
    if n_workers == 1:
        if not home_is_local:
            return CopyChoice("worker", "one worker: its copy is the replica's")
        return CopyChoice("one", "one worker: no other writer to keep apart")
    total = n_workers * copy_bytes
    budget = min(memory_bytes // MEMORY_SHARE, shm_free_bytes // SHM_SHARE)
    need = f"{n_workers} x {_mb(copy_bytes)} = {_mb(total)}"
    if total <= budget:
        return CopyChoice(
            "worker",
            f"copies per worker ({need}) fit in 1/{MEMORY_SHARE} of memory and 1/{SHM_SHARE} "
            "of the free /dev/shm",
        )
    if (n_nodes > 1 or not home_is_local) and n_nodes * copy_bytes <= budget:
        return CopyChoice(
            "node", f"copies per worker ({need}) would not fit comfortably; one per node does"
        )
    if not home_is_local:
        return CopyChoice("node", f"copies per worker ({need}) would not fit comfortably")
    return CopyChoice(
        "one",
        f"copies per worker ({need}) would not fit comfortably"
        + ("" if n_nodes > 1 else " and there is one NUMA node"),
    )


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def fc_layers(network) -> tuple[FcLayer, ...]:
    """The network's fully connected layers, for vectors instead of deltas."""
    return tuple(
        FcLayer(int(r[COL_W]), int(r[COL_C]), int(r[COL_O]), int(r[COL_IN]), int(r[COL_OUT]), i)
        for i, r in enumerate(network.ops)
        if r[COL_OP] == OP_FC
    )


class CopiesStore(ParameterStore):
    """Copies per worker or per node, each exchanged with a home by its leader's thread."""

    #: Whether home is in the arena (workers may then train on it directly, without copies).
    home_is_local = True
    #: An exchange with a home copy in shared memory is a pass over the parameters: every 64
    #: examples costs little beside the training (``bench/figures/parameter_stores.py``).
    cadence = 64
    #: The cadences' warm-up at the job's start (:meth:`~hogwild.store.exchange.Exchanger.
    #: cadences_now`) when ``train.cadence_ramp`` is -1: a copy exchanges every unit at first,
    #: the cadence one more every ``cadence_ramp`` examples per copy it trains (more copies,
    #: more deltas that agree, a slower ramp), at most :data:`RAMP_CAP`; 0: the full cadence
    #: from the first example.
    cadence_ramp = 0

    def __init__(self, config, network, placements) -> None:
        super().__init__(config, network, placements)
        train = config.train
        self.n_push, self.n_fetch = self.cadences(config)
        self.copy_floats = -(-network.n_params * 4 // PAGE) * PAGE // 4
        self.unit = training_unit(config)
        self.layers = fc_layers(network)
        self.choice = choose_copies(
            train.replicas,
            len(placements),
            len(worker_nodes(placements)),
            len(COPY_REGIONS) * self.copy_floats * 4,  # bytes of one copy's regions
            psutil.virtual_memory().total,
            _shm_free(),
            self.home_is_local,
        )
        mode = "interleave" if self.choice.per == "one" else "replicate"
        self.plan = plan_parameters(
            placements, mode, "node" if mode == "interleave" else self.choice.per
        )
        self.vectors = self._resolve_fc_push(train.fc_push)
        if self.vectors:  # a push of vectors carries the weight decay of its examples
            units = self.n_push if train.batch == 1 else max(1, self.n_push // train.batch)
            what = f"{self.name}'s n_push" + ("" if train.batch == 1 else " / train.batch")
            problem = push_decay_problem(config.optim, units, what)
            if problem:
                raise ConfigError(problem)

    def auto_fc_push(self) -> str:
        """How fully connected layers travel with ``train.fc_push = "auto"``: as deltas.

        A home in this machine's memory adds a delta in one pass; forming the update from k
        activation and error vectors instead costs k multiply-adds per weight.
        """
        return "deltas"

    def _resolve_fc_push(self, requested: str) -> bool:
        if self.choice.per == "one":
            return False
        wanted = self.auto_fc_push() if requested == "auto" else requested
        if wanted != "vectors":
            return False
        if self.choice.per != "worker":
            if requested == "auto":
                return False
            raise ConfigError(
                f"train.fc_push = 'vectors' needs one writer per copy: {self.choice.reason} "
                "gives a copy per node, written by all of its workers; set "
                "train.replicas = 'worker' or train.fc_push = 'deltas'"
            )
        return bool(self.layers)

    @property
    def writers_per_copy(self) -> int:
        if self.choice.per == "one":
            return len(self.placements)
        return max(
            self.plan.replica_of_worker.count(row) for row in set(self.plan.replica_of_worker)
        )

    @property
    def n_copies(self) -> int:
        return 0 if self.choice.per == "one" else self.plan.n_copies

    def _vector_floats(self) -> int:
        return VectorBuffer.floats(self.layers, self.n_push + self.unit)

    # -- the arena ----------------------------------------------------------------------------

    def add_regions(self, layout) -> None:
        add_home_regions(layout, self.network.n_params)
        if self.n_copies:
            for name in COPY_REGIONS:
                layout.add(name, np.float32, (self.n_copies, self.copy_floats), align=PAGE)
        if self.vectors and self.n_copies:
            layout.add("vectors", np.float32, (self.n_copies, 2, self._vector_floats()), align=PAGE)

    def attach(self, arena) -> None:
        n = self.network.n_params
        self.params, self.velocity = arena.array("params"), arena.array("velocity")
        self.copies = (
            tuple(arena.array(name)[:, :n] for name in COPY_REGIONS) if self.n_copies else None
        )
        nodes = worker_nodes(self.placements)
        self.placed = True
        for array in (self.params, self.velocity):
            first_touch(array)  # map the reserved pages here so mbind can move them
            self.placed &= interleave_memory(array, nodes)
        for array in self.copies or ():
            for row, node in enumerate(self.plan.nodes):
                first_touch(array[row])
                self.placed &= bind_memory(array[row], node)

    def load(self, params: np.ndarray, velocity: np.ndarray) -> None:
        self.params[:] = params
        self.velocity[:] = velocity
        self.spread_home()

    def spread_home(self) -> None:
        """Give every copy the home parameters and velocity; the bases agree with home."""
        if self.copies is None:
            return
        params, velocity, base = self.copies
        params[:] = self.params
        base[:] = self.params
        velocity[:] = self.velocity

    def end_epoch(self) -> None:
        if self.copies is None:
            if not self.home_is_local:
                self.gather_home()  # a remote home's model, into the arena's home copy
            return
        self.gather_home()
        np.mean(self.copies[1], axis=0, out=self.velocity)  # every copy takes the mean velocity
        self.spread_home()

    def gather_home(self) -> None:
        """Bring every copy's unpushed progress home (every worker is idle)."""
        raise NotImplementedError

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        return self.params, self.velocity

    # -- the workers' side ---------------------------------------------------------------------

    def worker_spec(self, worker: int) -> WorkerSpec:
        row = self.plan.replica_of_worker[worker]
        return WorkerSpec(
            self.name,
            worker,
            {
                "row": row if self.n_copies else -1,
                "leader": bool(self.n_copies) and self.plan.replica_of_worker.index(row) == worker,
                "n_push": self.n_push,
                "n_fetch": self.n_fetch,
                "unit": self.unit,
                "vectors": self.vectors,
                "ramp": self.ramp,
                **self.home_spec(worker),
            },
        )

    def home_spec(self, worker: int) -> dict:
        """What a leader needs to reach home (plain values)."""
        return {}

    @classmethod
    def open_home(cls, spec: WorkerSpec, arena, network, job) -> Home:
        """The leader's :class:`~hogwild.store.exchange.Home`."""
        raise NotImplementedError

    @classmethod
    def open_worker(cls, spec: WorkerSpec, arena, network, job) -> WorkerStore:
        values = spec.values
        if values["row"] < 0:
            return WorkerStore(arena.array("params"), arena.array("velocity"))
        n, row = network.n_params, values["row"]
        params, velocity, base = (arena.array(name)[row, :n] for name in COPY_REGIONS)
        if not values["leader"]:
            return WorkerStore(params, velocity)
        layers = fc_layers(network) if values["vectors"] else ()
        buffers = tuple(arena.array("vectors")[row]) if layers else None
        exchanger = Exchanger(
            cls.open_home(spec, arena, network, job),
            params,
            base,
            values["n_push"],
            values["n_fetch"],
            values["unit"],
            layers,
            buffers,
            weight_decay=job.optim.weight_decay,
            batch=job.train.batch,
            name=f"worker {spec.worker} exchange",
            ramp=values["ramp"],
        )
        return CopyWorkerStore(params, velocity, exchanger)

    # -- reports ------------------------------------------------------------------------------

    @property
    def ramp(self) -> int:
        """Examples a copy trains per step of its cadence's ramp at the job's start; 0: none.

        ``train.cadence_ramp`` if set, else the store's :attr:`cadence_ramp` per copy, at most
        :data:`RAMP_CAP`. One copy has no other copy's deltas to agree with: no ramp.
        """
        if self.n_copies < 2:
            return 0
        asked = self.config.train.cadence_ramp
        return asked if asked >= 0 else min(self.cadence_ramp * self.n_copies, RAMP_CAP)

    def describe(self) -> dict:
        return {
            "store": self.name,
            "per": self.choice.per,
            "copies": self.n_copies,
            "nodes": list(self.plan.nodes),
            "n_push": self.n_push,
            "n_fetch": self.n_fetch,
            "cadence_ramp": self.ramp,
            "fc_push": "vectors" if self.vectors else "deltas",
            "placed_by_libnuma": self.placed,
            "why": self.choice.reason,
        }

    def summary(self) -> str:
        if not self.n_copies:
            return f"parameters: one copy, no exchanges ({self.choice.reason})"
        what = {"worker": "a copy per worker", "node": "a copy per NUMA node"}[self.choice.per]
        ramped = f" (from every example, one more every {self.ramp:,})" if self.ramp else ""
        nodes = ", ".join(map(str, sorted(set(self.plan.nodes))))
        return (
            f"parameters: {what} (nodes {nodes}; {self.choice.reason}), exchanged with "
            f"{self.home_name()}: push every {self.n_push:,} examples, pull every "
            f"{self.n_fetch:,}{ramped}; fully connected layers as "
            f"{'activation and error vectors' if self.vectors else 'deltas'}; pages "
            + {True: "bound by libnuma", False: "placed by first touch", None: "not placed yet"}[
                self.placed
            ]
        )

    def home_name(self) -> str:
        return "the home copy"


class CopyWorkerStore(WorkerStore):
    """A leader's side: trains on its copy, its exchanger counts and exchanges."""

    def __init__(self, params, velocity, exchanger: Exchanger) -> None:
        super().__init__(params, velocity)
        self.exchanger = exchanger

    def start_epoch(self, lr: float) -> None:
        self.exchanger.start_epoch(lr)

    def span(self, examples: int) -> int:
        return self.exchanger.span(examples)

    def trained(self, examples: int, context) -> None:
        self.exchanger.trained(examples, context)

    def finish(self) -> None:
        self.exchanger.finish()

    @property
    def wait_s(self) -> float:
        return self.exchanger.wait_s

    def close(self) -> None:
        self.exchanger.close()


def _shm_free() -> int:
    try:
        return shutil.disk_usage("/dev/shm").free
    except OSError:
        return psutil.virtual_memory().available if os.name == "posix" else 0
