"""What a parameter server's update threads work on: shards, and one record per kind of work.

A :class:`Shard` is one shard's memory (values, the rule's state, named vectors, its versions),
owned by one update thread. Everything that thread does to it arrives as a piece of work, one
small record per kind (:class:`PushDeltas`, :class:`PushVectors`, :class:`Pull`,
:class:`Assign`, :class:`AddToVector`, :class:`VectorOp`, :class:`Snapshot`, :class:`Restore`,
:class:`Barrier`), each holding only the fields its kind needs. Every record carries, from
:class:`Work`, what the engine and the replication need of any work: the shard (``local``), the
request (``header``), the version it was given, the buffers it keeps alive until applied
(``keep``, ``free``) and whether it was answered already (``acked``). Its :attr:`Work.kind` (a
:class:`Kind` number) picks its applier (:mod:`~hogwild_plugins.ps.appliers`); :attr:`Work.writes`
says whether it may change its shard (every vector operation counts: some of them write).

The records use slots and are made once per request, on the network thread: the update thread
allocates nothing to take one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from hogwild_plugins.ps.layout import FcLayer

from hogwild.net.wire import ErrorCode, Header, WireError

__all__ = [
    "AddToVector",
    "Assign",
    "Barrier",
    "Kind",
    "Pull",
    "PushDeltas",
    "PushVectors",
    "Restore",
    "Shard",
    "Snapshot",
    "SnapshotRound",
    "VectorOp",
    "Work",
    "Write",
]


class Kind:
    """The kinds of work (:attr:`Work.kind`), one per record class."""

    DELTAS, VECTORS, PULL, ASSIGN, VECOP, SNAPSHOT, RESTORE, BARRIER, INTO = range(9)


@dataclass
class Shard:
    """One shard's memory, owned by one update thread.

    Attributes:
        index: The shard's number in the job.
        lo: Its global offset.
        values: float32 parameters (the thread first-touches them).
        state: The rule's state (same length; empty for SGD).
        applied: Version of the last change applied.
        snapshotted: Version of the last snapshot taken for the store.
        vectors: Named vectors beside the parameters (vector operations).
        thread: The update thread that owns it.
        initial: ``(values, state)`` copied in at first touch (None: zeros).
        writes_queued: Writes queued for the shard (by ``UpdateEngine.put``).
        writes_done: Writes its thread finished (applied or failed); equal to
            ``writes_queued`` when none is pending (see ``UpdateEngine.read_now``).
        promised: Names of vectors that pushes acknowledged before they are applied will
            create (:meth:`promise`): they hold their room, so an acknowledged push never finds
            the shard full when its thread applies it.
    """

    index: int
    lo: int
    values: np.ndarray
    state: np.ndarray
    applied: int = 0
    snapshotted: int = 0
    vectors: dict[str, np.ndarray] = field(default_factory=dict)
    thread: int = 0
    initial: tuple | None = None
    writes_queued: int = 0
    writes_done: int = 0
    max_vectors: int = 32
    refuse_nonfinite: bool = True  # ps.nonfinite = "refuse": no operation leaves NaN in values
    nonfinite_refused: int = 0  # operations refused for that (counted by the update thread)
    promised: set[str] = field(default_factory=set)
    _zeros: np.ndarray | None = None

    def vector(self, name: str, write: bool = True) -> np.ndarray:
        """The named vector (``"params"``: the parameters). One never written reads as zeros
        without being kept (``write=False``: one shared array of zeros the caller must not
        write); a write creates it (zeros), up to :attr:`max_vectors`.

        Raises:
            WireError: ``BAD_NAME``: a write would make one vector more than the limit.
        """
        if name == "params":
            return self.values
        vec = self.vectors.get(name)
        if vec is None:
            if not write:
                if self._zeros is None:
                    self._zeros = np.zeros_like(self.values)
                return self._zeros
            self.check_room(name)
            vec = self.vectors[name] = np.zeros_like(self.values)
            self.promised.discard(name)  # after it exists: counted once meanwhile (a union)
        return vec

    def check_room(self, name: str) -> None:
        """Raise ``BAD_NAME`` unless ``name`` exists, is promised, or there is room for one
        more vector (the vectors and the names promised count together)."""
        if name in self.vectors or name in self.promised:
            return
        if len(self.vectors.keys() | self.promised) >= self.max_vectors:
            raise WireError(
                f"shard {self.index} holds {self.max_vectors} named vectors already "
                f"(ps.max_vectors); {name!r} would be one more",
                ErrorCode.BAD_NAME,
            )

    def promise(self, name: str) -> None:
        """Hold room for ``name`` until a write creates it (the network thread, admitting a push
        into it that may be acknowledged before its update thread applies it).

        Raises:
            WireError: ``BAD_NAME``: no room (see :meth:`check_room`).
        """
        self.check_room(name)
        if name not in self.vectors:
            self.promised.add(name)


class SnapshotRound:
    """Copies of the changed shards, collected from every thread (a :class:`Snapshot` each).

    Attributes:
        items: ``(shard index, applied version, values copy, state copy)`` per changed shard.
        applied_updates: The changes the threads had applied in total, when they copied.
        done: Set once every thread added its copies.
    """

    def __init__(self, threads: int, full: bool = False) -> None:
        self.pending, self.full = threads, full
        self.items: list[tuple[int, int, np.ndarray, np.ndarray]] = []
        self.applied_updates = 0
        self._lock = threading.Lock()
        self.done = threading.Event()

    def add(self, items: list, applied_updates: int) -> None:
        with self._lock:
            self.items.extend(items)
            self.applied_updates += applied_updates
            self.pending -= 1
            if self.pending == 0:
                self.done.set()


@dataclass(slots=True)
class Work:
    """What every piece of work for one shard carries.

    Attributes:
        local: The shard's index among this server's shards.
        header: The request it answers (None: the server's own work, answered by nobody).
        version: The shard's version it makes (0: none given).
        keep: The request's frames, kept alive until the work is applied.
        free: Called once it is applied or dropped (pool blocks go back).
        acked: Answered already (``ack = "queued"``, or by the replication): send no reply.
        replicated: The replication answers it (it has told nobody yet): a refusal by its
            applier is the request's own fault, refused alike on every copy.
        settled: Counted in its shard's ``writes_done`` (a write is counted once).
        failed: Why it failed to apply (None: it did not fail); read by the replication,
            which answers the client after the update thread is done with it.
        refused: The code of its applier's refusal (the request's own fault: the shard is as
            it was); None for a failure that is not a refusal (a bug).
    """

    kind: ClassVar[int]
    writes: ClassVar[bool] = False
    result: ClassVar[float] = 0.0  # the value the ACK carries (a reduction's, see VectorOp)

    local: int
    header: Header | None = None
    version: int = 0
    keep: object = None
    free: Callable[[], None] | None = None
    acked: bool = False
    replicated: bool = False
    settled: bool = False
    failed: str | None = None
    refused: int | None = None

    def drop_buffers(self) -> None:
        """Let go of every buffer the work holds (it is applied, or never will be)."""
        self.keep = self.free = None


@dataclass(slots=True, kw_only=True)
class Write(Work):
    """Work that may change its shard.

    Attributes:
        coef: The staleness coefficient the primary gave it (copies apply the same; 1 for kinds
            no staleness scales).
    """

    writes: ClassVar[bool] = True

    coef: float = 1.0


@dataclass(slots=True, kw_only=True)
class PushDeltas(Write):
    """API (a): ``delta`` added to the parameters ``[offset, offset + length)`` of the shard,
    through the rule, scaled by ``coef``."""

    kind: ClassVar[int] = Kind.DELTAS

    offset: int
    length: int
    delta: np.ndarray | None

    def drop_buffers(self) -> None:
        self.keep = self.free = self.delta = None


@dataclass(slots=True, kw_only=True)
class PushVectors(Write):
    """API (b): a fully connected layer's rows ``[first_row, first_row + rows)`` on this shard
    updated from k activation vectors and the k error vectors of those rows.

    Attributes:
        layer: The layer.
        first_row: The layer's first output row on this shard.
        length: Floats of the layer on this shard (rows times the layer's inputs).
        activations: float32 [k, n_in].
        errors_by_row: float32 [rows, k]: the errors of this shard's rows, transposed.
        decay: Weight decay per unit of the layer's update (see the kernels).
    """

    kind: ClassVar[int] = Kind.VECTORS

    layer: FcLayer
    first_row: int
    length: int
    activations: np.ndarray | None
    errors_by_row: np.ndarray | None
    decay: float = 0.0

    def drop_buffers(self) -> None:
        self.keep = self.free = self.activations = self.errors_by_row = None


@dataclass(slots=True, kw_only=True)
class Pull(Work):
    """A copy of the parameters ``[offset, offset + length)`` of the shard, answered as DATA."""

    kind: ClassVar[int] = Kind.PULL

    offset: int
    length: int


@dataclass(slots=True, kw_only=True)
class Assign(Write):
    """The parameters ``[offset, offset + length)`` overwritten with ``values`` (a restore)."""

    kind: ClassVar[int] = Kind.ASSIGN

    offset: int
    length: int
    values: np.ndarray | None

    def drop_buffers(self) -> None:
        self.keep = self.free = self.values = None


@dataclass(slots=True, kw_only=True)
class AddToVector(Write):
    """``delta`` added to the named vector ``name`` at ``[offset, offset + length)`` as it is
    (``y += d``: no rule, no staleness; a version only with replication)."""

    kind: ClassVar[int] = Kind.INTO

    name: str
    offset: int
    length: int
    delta: np.ndarray | None

    def drop_buffers(self) -> None:
        self.keep = self.free = self.delta = None


@dataclass(slots=True, kw_only=True)
class VectorOp(Write):
    """Vector operation ``op`` (a :data:`~hogwild_plugins.ps.vector_ops.VECTOR_OPS` code) on the
    named vectors ``names`` with scalar ``alpha``; ``result``: a reduction's value."""

    kind: ClassVar[int] = Kind.VECOP

    op: int
    names: tuple[str, ...]
    alpha: float = 0.0
    result: float = 0.0


@dataclass(slots=True, kw_only=True)
class Restore(Write):
    """A copy's catch-up: the shard's ``values``, rule ``state``, named ``vectors`` (name to
    values, or None) and applied version (:attr:`version`) replaced."""

    kind: ClassVar[int] = Kind.RESTORE

    values: np.ndarray | None
    state: np.ndarray | None
    vectors: dict | None = None

    def drop_buffers(self) -> None:
        self.keep = self.free = self.values = self.state = self.vectors = None


@dataclass(slots=True, kw_only=True)
class Snapshot(Work):
    """Copies of the thread's changed shards into ``round`` (taken between two updates)."""

    kind: ClassVar[int] = Kind.SNAPSHOT

    round: SnapshotRound


@dataclass(slots=True, kw_only=True)
class Barrier(Work):
    """Nothing: done once everything queued before it for the shard is applied."""

    kind: ClassVar[int] = Kind.BARRIER
