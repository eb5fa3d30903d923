"""A copy's communication thread: push and pull on their own cadences, off the compute loop.

DistBelief section 4.1 (Downpour): a model replica pushes its accumulated progress every
``n_push`` examples and fetches fresh parameters every ``n_fetch``. Here the compute loop only
counts (:meth:`Exchanger.span`, :meth:`Exchanger.trained`) and raises flags; the exchange itself
runs on the worker's communication thread, through the copy's :class:`Home` (the home copy in
shared memory, or the parameter server over the network), while the compute loop trains on.
Cadences fall on unit boundaries (a minibatch, or a group of examples whose fully connected
updates are applied together), so an exchange never cuts a minibatch. A request made while the
thread is still busy is merged into the next one: the copy's unpushed progress (``copy - base``,
:mod:`hogwild.store.kernels`) simply keeps growing, so nothing is lost and nothing waits.

Fully connected layers may travel as the activation and error vectors of the examples instead of
as deltas (Adam section 3.2.6, ``train.fc_push = "vectors"``): after every unit the compute loop
copies the unit's vectors into the current one of two buffers (double buffering); at a push it
takes a snapshot of the layers' weights into the base (their progress now travels as vectors),
hands the full buffer to the thread and goes on with the other one. It waits only if the thread
has not finished with that other buffer yet, and the snapshot waits for a pull that is merging
into the same weights (a short pass): both waits are measured (``wait_s``). A pull always comes
after the pushes requested before it, so a copy sees its own progress come back from home.

The thread's failures (a parameter server that stopped answering) are raised in the compute
loop at its next call, naming the thread's error.

The rules the cadences obey: :func:`hogwild.optim.interval.training_unit` (whole units) and
:func:`hogwild.config.checks.push_decay_problem` (no push decays a whole weight).

:class:`Home` is a public seam: a plugin whose home is elsewhere (the ``ps`` plugin's parameter
servers) implements it, and a :class:`~hogwild.store.copies.CopiesStore` subclass opens it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from hogwild.errors import HogwildError

POLL_S = 0.5  # the thread's idle wake-up, to notice a stop
FINISH_TIMEOUT_S = 300.0  # a flush that takes longer than this is a failure, not a wait


class ExchangeError(HogwildError):
    """The communication thread of a copy failed (or a flush did not finish in time)."""


@dataclass(frozen=True)
class FcLayer:
    """A fully connected layer's place in the flat vector and in a training context's rows."""

    w_off: int
    n_in: int
    n_out: int
    x_off: int  # input activations in a context row
    y_off: int  # output errors (dL/dz) in a context row
    index: int = -1  # the layer's index in the model's layer list

    @property
    def weights(self) -> tuple[int, int]:
        return self.w_off, self.w_off + self.n_in * self.n_out


class VectorBuffer:
    """One of a copy's two buffers of fully connected activation and error vectors.

    ``storage`` is a float32 vector laid out layer by layer: ``capacity`` rows of inputs, then
    ``capacity`` rows of errors. ``rows`` are filled; ``lr`` and ``decay`` say how home applies
    them: ``W = (1 - decay) * W - lr * errs^T acts`` (decay = the weight decay of the units).
    """

    def __init__(self, storage: np.ndarray, layers: tuple[FcLayer, ...], capacity: int):
        self.acts, self.errs = [], []
        cursor = 0
        for layer in layers:
            self.acts.append(storage[cursor : cursor + capacity * layer.n_in].reshape(capacity, -1))
            cursor += capacity * layer.n_in
            self.errs.append(
                storage[cursor : cursor + capacity * layer.n_out].reshape(capacity, -1)
            )
            cursor += capacity * layer.n_out
        self.capacity = capacity
        self.rows, self.lr, self.decay = 0, 0.0, 0.0

    @staticmethod
    def floats(layers: tuple[FcLayer, ...], capacity: int) -> int:
        return capacity * sum(layer.n_in + layer.n_out for layer in layers)


class Home(ABC):
    """Where a copy's progress goes and the others' comes from (used by the thread only)."""

    #: Bytes of values its pulls (:meth:`fetch`, :meth:`exchange`) brought from a remote home
    #: so far, for its owner to report (a home in shared memory moves none over a network).
    fetched_bytes = 0

    @abstractmethod
    def push(self, copy: np.ndarray, base: np.ndarray, ranges: np.ndarray) -> None:
        """Send the copy's unpushed progress over ``ranges`` home (and advance the base)."""

    @abstractmethod
    def fetch(self) -> np.ndarray:
        """Home's current values (the home copy itself, or a buffer the values were pulled into)."""

    @abstractmethod
    def merge(self, values: np.ndarray, copy: np.ndarray, base: np.ndarray, ranges) -> None:
        """Fold fetched ``values`` into the copy over ``ranges`` (others' progress in)."""

    def exchange(self, copy: np.ndarray, base: np.ndarray, ranges: np.ndarray) -> np.ndarray:
        """Push, then fetch and merge, over ``ranges``; returns the fetched values."""
        self.push(copy, base, ranges)
        values = self.fetch()
        self.merge(values, copy, base, ranges)
        return values

    @abstractmethod
    def push_vectors(self, layers: tuple[FcLayer, ...], buffer: VectorBuffer) -> None:
        """Apply (or send) a buffer of fully connected vectors home."""

    def own(self, ranges: np.ndarray) -> None:  # noqa: B027 - a home in shared memory has all
        """Only ``ranges`` of the copy will be pushed, merged or read (a model partition's rows,
        or a host's partitions' rows): :meth:`fetch` need only bring those, and the values it
        returns outside them may be stale."""

    def versions(self) -> np.ndarray | None:
        """The versions its pulls last brought (a remote home's, one per shard: what its pushes
        are stamped with), or None (a home without versions, or nothing pulled yet)."""
        return None

    def adopt(self, versions: np.ndarray) -> None:  # noqa: B027 - no versions, nothing to stamp
        """The copy's base was replaced, over the rows this home serves, by values another
        home of the same store pulled at ``versions`` (its :meth:`versions`; a partition host's
        take): stamp the pushes to come with them, as if this home had pulled them."""

    def cancel(self) -> None:  # noqa: B027 - a home in shared memory never waits
        """End a push or pull in progress on the thread soon (called from another thread: the
        exchanger is closing, and what is in flight is no longer wanted)."""

    def close(self) -> None:  # noqa: B027 - a home in shared memory holds nothing
        """Release connections."""


class Exchanger:
    """Counts a copy's examples and runs its pushes and pulls on a thread of its own.

    Args:
        home: Where progress goes.
        copy, base: The copy the compute loop trains on, and its base (same length).
        n_push, n_fetch: Examples between pushes, and between pulls.
        unit: Examples that are trained as one (a minibatch, or a group); cadences are rounded
            up to whole units.
        layers: The fully connected layers that travel as vectors (empty: everything as deltas).
        buffers: Two float32 vectors of :meth:`VectorBuffer.floats` each (vectors only).
        weight_decay: The job's weight decay (vectors carry the decay of their units).
        batch: The job's minibatch size (1: per-example updates; else minibatch means).
        name: The thread's name (the worker), for errors.
        owned: ``[start, stop)`` ranges, int64 [n, 2]: the only part of the copy its compute
            loop writes and reads (a model partition's rows; :meth:`Home.own` is told); None:
            the whole copy. Not with ``layers``.
        ramp: The cadences' warm-up (0: none): the copy exchanges after every unit at first
            (an example, or a minibatch), the cadence growing by one example every ``ramp``
            examples it trains until it reaches ``n_push`` and ``n_fetch`` (:meth:`cadences_now`;
            rounded up to whole units, so a minibatch of ``n_push`` or more is not ramped).
    """

    def __init__(
        self,
        home: Home,
        copy: np.ndarray,
        base: np.ndarray,
        n_push: int,
        n_fetch: int,
        unit: int,
        layers: tuple[FcLayer, ...] = (),
        buffers: tuple[np.ndarray, np.ndarray] | None = None,
        weight_decay: float = 0.0,
        batch: int = 1,
        name: str = "exchange",
        owned: np.ndarray | None = None,
        ramp: int = 0,
    ) -> None:
        if owned is not None and layers:
            raise ValueError("an exchanger of owned ranges moves deltas only, not vectors")
        # The kernels load with the first exchanger, in the leader that runs them: a process
        # that only plans a store (``hogwild info``, the cluster's driver) loads no numba.
        from hogwild.store import kernels

        self.kernels = kernels
        self.home, self.copy, self.base = home, copy, base
        self.n_push, self.n_fetch, self.unit = n_push, n_fetch, max(1, unit)
        self.layers = layers
        n = copy.shape[0]
        fc = sorted(layer.weights for layer in layers)
        self.fc_ranges = np.array(fc, dtype=np.int64).reshape(-1, 2)
        self.delta_ranges = _complement(fc, n)
        if owned is not None:
            self.delta_ranges = np.ascontiguousarray(owned, dtype=np.int64).reshape(-1, 2)
            home.own(self.delta_ranges)
        self.all_ranges = np.array([[0, n]], dtype=np.int64)
        capacity = n_push + self.unit
        self._free = [VectorBuffer(b, layers, capacity) for b in buffers] if layers else []
        self._current = self._free.pop() if layers else None
        self._lr, self._wd, self._batch = 0.0, weight_decay, batch
        self.since_push = self.since_fetch = 0
        self.ramp, self.trained_total = max(0, ramp), 0
        self._waited = 0.0
        self.pushes = self.pulls = 0
        self._cond = threading.Condition()
        self._fc_lock = threading.Lock()  # a snapshot and a merge of the fc weights never overlap
        self._want_push = self._want_pull = False
        self._ready: list[VectorBuffer] = []
        self._adopt: np.ndarray | None = None  # versions to stamp the pushes to come with
        self._busy = False
        self._stop = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- the compute loop's side -------------------------------------------------------------

    def start_epoch(self, lr: float) -> None:
        """The learning rate of the units to come (vectors carry it)."""
        self._lr = lr

    def cadences_now(self) -> tuple[int, int]:
        """The push and pull cadences for the examples to come: ``n_push`` and ``n_fetch``, or,
        in the ramp, ``1 + trained // ramp`` where that is less.

        Why a ramp: copies that start from the same weights and each train ``n_push`` examples
        before they first exchange push deltas that point the same way (a fresh network's
        gradients agree), and home adds them up: four copies of Adam's MNIST model at a cadence
        of 64 killed every unit of the second convolution in their first thousands of examples
        (a network at chance from then on) in 3 one-epoch runs of 3, and at a quarter of the
        learning rate in 2 of 3; one copy shared by the four workers trained every run
        (``bench/results/copies_at_start.md``). Once the gradients disagree the full cadence is
        safe, and saves the exchanges it was chosen to save.
        """
        if not self.ramp:
            return self.n_push, self.n_fetch
        ramped = 1 + self.trained_total // self.ramp
        return min(self.n_push, ramped), min(self.n_fetch, ramped)

    def span(self, examples: int) -> int:
        """How many of ``examples`` to train before the next :meth:`trained`."""
        if self.layers:
            return min(examples, self.unit)  # each unit's vectors are taken from the context
        n_push, n_fetch = self.cadences_now()
        due = max(1, min(n_push - self.since_push, n_fetch - self.since_fetch))
        return min(examples, -(-due // self.unit) * self.unit)

    def trained(self, examples: int, context) -> None:
        """Count ``examples`` (one unit when vectors travel) and request what is due."""
        self._raise_failure()
        if self.layers:
            self._capture(examples, context)
        n_push, n_fetch = self.cadences_now()
        self.since_push += examples
        self.since_fetch += examples
        self.trained_total += examples
        push, pull = self.since_push >= n_push, self.since_fetch >= n_fetch
        if push:
            self.since_push = 0
        if pull:
            self.since_fetch = 0
        if push or pull:
            self._request(push, pull)

    def adopt(self, versions: np.ndarray) -> None:
        """The base was just replaced with values another home pulled at ``versions`` (every
        exchange of this copy idle: a partition host's take): the thread stamps its next pushes
        with them (:meth:`Home.adopt`), before any exchange requested after this call."""
        with self._cond:
            self._adopt = versions
            self._cond.notify_all()

    def finish(self) -> None:
        """Push everything trained so far and wait until it is home (the end of a share)."""
        self._raise_failure()
        self._request(True, False)
        self.since_push = self.since_fetch = 0
        started = time.perf_counter()
        with self._cond:
            done = self._cond.wait_for(self._idle, FINISH_TIMEOUT_S)
        self._waited += time.perf_counter() - started
        self._raise_failure()
        if not done:
            raise ExchangeError(
                f"{self._thread.name}: the exchange with the parameters' home did not finish "
                f"within {FINISH_TIMEOUT_S:.0f} s"
            )

    @property
    def wait_s(self) -> float:
        return self._waited

    def close(self) -> None:
        """Stop the thread (what is queued is dropped: the parent merges or the job is over)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        # A worker's SIGTERM raises its exit wherever the compute loop is, even right after it
        # took this (reentrant) lock and before its ``with`` began, so that the lock stays held
        # by this thread: the communication thread would wait for it forever. Released here.
        with contextlib.suppress(RuntimeError):  # not held by this thread (any more)
            while True:
                self._cond.release()
        # A push or pull in progress ends now, not after its timeouts and retries (a server
        # that died mid-request would hold the worker's exit for them).
        self.home.cancel()
        self._thread.join(FINISH_TIMEOUT_S)
        self.home.close()

    def _capture(self, n: int, context) -> None:
        buffer = self._current
        if buffer.rows + n > buffer.capacity:  # a flush mid-unit cannot happen; guard anyway
            raise ExchangeError(f"{self._thread.name}: vector buffer overflow")
        scale = 1.0 / n if self._batch > 1 else 1.0
        for i, layer in enumerate(self.layers):
            self.kernels.capture_vectors(
                context.act,
                context.dact,
                n,
                layer.x_off,
                layer.y_off,
                layer.n_in,
                layer.n_out,
                scale,
                buffer.acts[i],
                buffer.errs[i],
                buffer.rows,
            )
        buffer.rows += n
        buffer.lr = self._lr
        units = n if self._batch == 1 else 1  # weight decay: once per example, or per minibatch
        buffer.decay += self._lr * self._wd * units

    def _request(self, push: bool, pull: bool) -> None:
        handed = None
        if push and self.layers and self._current.rows:
            started = time.perf_counter()
            with self._fc_lock:  # the fc progress is in the buffer now, not in copy - base
                self.kernels.copy_ranges(self.base, self.copy, self.fc_ranges)
            handed, self._current = self._current, self._take_free_buffer()
            self._waited += time.perf_counter() - started
        with self._cond:
            if handed is not None:
                self._ready.append(handed)
            self._want_push |= push
            self._want_pull |= pull
            self._cond.notify_all()

    def _take_free_buffer(self) -> VectorBuffer:
        with self._cond:
            if not self._cond.wait_for(lambda: self._free or self._error, FINISH_TIMEOUT_S):
                raise ExchangeError(f"{self._thread.name}: no vector buffer came back in time")
            self._raise_failure()
            return self._free.pop()

    def _idle(self) -> bool:
        pending = self._want_push or self._want_pull or self._ready or self._adopt is not None
        return self._error is not None or (not self._busy and not pending)

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise ExchangeError(f"{self._thread.name}: {self._error}") from self._error

    # -- the communication thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._stop or self._want_push or self._want_pull or self._ready
                    or self._adopt is not None,
                    POLL_S,
                )  # fmt: skip
                if self._stop:
                    return
                push, pull, ready = self._want_push, self._want_pull, self._ready
                adopt, self._adopt = self._adopt, None
                self._want_push = self._want_pull = False
                self._ready = []
                self._busy = bool(push or pull or ready or adopt is not None)
            if not self._busy:
                continue
            try:
                if adopt is not None:  # before the pushes it stamps
                    self.home.adopt(adopt)
                if push or pull or ready:
                    self._exchange(push, pull, ready)
            except BaseException as exc:  # noqa: BLE001 - handed to the compute loop
                with self._cond:
                    self._error = exc
            finally:
                with self._cond:
                    for buffer in ready:
                        buffer.rows, buffer.decay = 0, 0.0
                    self._free.extend(ready)
                    self._busy = False
                    self._cond.notify_all()

    def _exchange(self, push: bool, pull: bool, ready: list[VectorBuffer]) -> None:
        for buffer in ready:
            self.home.push_vectors(self.layers, buffer)
        if push:
            self.pushes += 1
        if push and pull:
            values = self.home.exchange(self.copy, self.base, self.delta_ranges)
        elif push:
            self.home.push(self.copy, self.base, self.delta_ranges)
            return
        else:
            values = self.home.fetch()
            self.home.merge(values, self.copy, self.base, self.delta_ranges)
        self.pulls += 1
        if self.layers:
            with self._fc_lock:
                self.home.merge(values, self.copy, self.base, self.fc_ranges)


def _complement(ranges: list[tuple[int, int]], n: int) -> np.ndarray:
    """The ``[start, stop)`` ranges of ``range(n)`` outside the sorted, disjoint ``ranges``."""
    out, cursor = [], 0
    for start, stop in ranges:
        if start > cursor:
            out.append((cursor, start))
        cursor = max(cursor, stop)
    if cursor < n:
        out.append((cursor, n))
    return np.array(out, dtype=np.int64).reshape(-1, 2)
