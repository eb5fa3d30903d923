"""One batch pass: the board replicas ask for work, and the coordinator's gathering of the gradient.

:class:`Board` puts the :class:`~.portions.PortionScheduler` behind a lock and a condition so that
replicas (:mod:`.replica`) and the coordinator can wait on it: a replica blocks in
:meth:`Board.request` until there is work (or :data:`STOP`), the coordinator in
:meth:`Board.run_batch` until every portion is folded, folding pushes as they are reported.
Replicas that are threads of the coordinator's process call it directly; member processes call
it through :mod:`.board_service`, which carries the same calls as messages. Every wait has a
deadline (:class:`BatchTimeout` names what was outstanding).

:class:`BatchObjective` is the coordinator's ``evaluate()`` for
:class:`~.lbfgs.SandblasterLBFGS`: the loss and gradient of the batch at ``"params"``, with the
gradient left on the shards as ``"grad"``, through shard operations only.

**Where the gradient is summed.** Replica ``r`` pushes its accumulated gradients into a vector
of its own, :func:`replica_vector` (``PSClient.push_deltas(..., into=...)``: ``y += d`` on each
shard, beside the parameters, without the servers' rule or a version). A pass:

1. ``fill(grad, 0)``; the batch begins; each replica fetches ``"params"`` on its first request
   (the parameters do not move during a pass) and computes portions;
2. for each push a replica reports complete, the coordinator folds its vector:
   ``axpy(1, sandblaster.g<r>, grad)``, ``fill(sandblaster.g<r>, 0)`` (a vector a replica left
   holding part of a push is only zeroed; see :mod:`.portions`);
3. when every portion is folded: ``scale(1/n, grad)``, and for L2 ``axpy(l2, params, grad)``
   with the loss's ``0.5 l2 x.x`` from ``dot``.

The sum is formed in float32 on the shards as the pushes arrive (exact up to summation order).
Per-replica vectors, rather than pushing straight into ``"grad"``, are what make a replica that
dies mid-push harmless: its partial push stays in its own vector, which is zeroed, never added,
while its portions are computed again elsewhere; pushed straight into ``"grad"``, the shards it
reached would count those portions twice. The price is two vector operations per push, issued
while the replicas go on computing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hogwild_plugins.ps.sandblaster.lbfgs import GRAD, PARAMS
from hogwild_plugins.ps.sandblaster.portions import (
    Compute,
    Fetch,
    Fold,
    PortionScheduler,
    Push,
    Wait,
    portions_of,
)
from hogwild_plugins.ps.sandblaster.vectors import VectorOps

from hogwild.errors import HogwildError

__all__ = [
    "REJOIN",
    "STOP",
    "BatchObjective",
    "BatchTimeout",
    "Board",
    "Rejoin",
    "Stop",
    "check_servers",
    "replica_vector",
]


def replica_vector(replica: int) -> str:
    """The named vector replica ``replica`` pushes its gradients into."""
    return f"sandblaster.g{replica}"


class BatchTimeout(HogwildError):
    """A batch pass made no progress in time (no replica, or replicas that stopped answering)."""


@dataclass(frozen=True)
class Stop:
    """The board is closed: the replica's loop ends."""


STOP = Stop()


@dataclass(frozen=True)
class Rejoin:
    """The board was replaced, or took the replica for gone (a board in another process,
    :mod:`.board_service`): drop what it accrued and join again."""


REJOIN = Rejoin()


class Board:
    """The scheduler, shared by replica threads and the coordinator (lock and condition).

    Args:
        scheduler: The portion scheduler.
        timeout_s: How long :meth:`run_batch` waits for any one event before it gives up.
    """

    def __init__(self, scheduler: PortionScheduler, timeout_s: float = 60.0) -> None:
        self.scheduler, self.timeout_s = scheduler, timeout_s
        self._cond = threading.Condition()
        self._closed = False
        self._events = 0  # every event counts: a wait times out only when none came
        self.failures: list[str] = []  # replicas that left with an error

    # ------------------------------------------------------------------ replica side

    def join(self, replica: int) -> None:
        with self._cond:
            self.scheduler.join(replica)
            self._events += 1
            self._cond.notify_all()

    def leave(self, replica: int, error: str | None = None) -> list[int]:
        with self._cond:
            lost = self.scheduler.leave(replica)
            if error:
                self.failures.append(f"replica {replica}: {error}")
            self._events += 1
            self._cond.notify_all()
            return lost

    def request(self, replica: int, timeout_s: float = 1.0) -> Fetch | Compute | Push | Wait | Stop:
        """The replica's next instruction, waiting up to ``timeout_s`` for one (then WAIT)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._closed:
                    return STOP
                instruction = self.scheduler.request(replica)
                left = deadline - time.monotonic()
                if not isinstance(instruction, Wait) or left <= 0:
                    return instruction
                self._cond.wait(left)

    def fetched(self, replica: int, batch: int) -> None:
        self._event(self.scheduler.fetched, replica, batch)

    def finished(self, replica: int, batch: int, portion: int, loss: float) -> bool:
        return self._event(self.scheduler.finished, replica, batch, portion, loss)

    def pushed(self, replica: int, batch: int, portions: tuple[int, ...]) -> None:
        self._event(self.scheduler.pushed, replica, batch, portions)

    def _event(self, method, *args):
        with self._cond:
            result = method(*args)
            self._events += 1
            self._cond.notify_all()
            return result

    def close(self) -> None:
        """Every replica's next request returns :data:`STOP`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ coordinator side

    def run_batch(self, batch: int, n_portions: int, fold: Callable[[Fold], None]) -> float:
        """Run one pass: begin, ``fold()`` each push as it is reported, until all are folded.

        Args:
            batch: The pass's number (increasing).
            n_portions: Its portions.
            fold: The coordinator's shard operations for one :class:`~.portions.Fold` (run
                outside the lock: replicas go on computing meanwhile).

        Returns:
            The summed loss the replicas reported for the portions folded.

        Raises:
            BatchTimeout: ``timeout_s`` passed with no event that moved the batch on.
        """
        s = self.scheduler
        with self._cond:
            s.begin(batch, n_portions)
            self._cond.notify_all()
        while True:
            with self._cond:
                self._wait(lambda: s.complete or s.folds, f"batch {batch}: portions")
                if s.complete:
                    return s.loss
                pending = s.folds
            for item in pending:
                fold(item)
            with self._cond:
                for item in pending:
                    s.folded(item)
                self._events += 1
                self._cond.notify_all()

    def _wait(self, ready, what: str) -> None:
        """Wait (lock held) until ``ready()``; the deadline restarts whenever anything happens."""
        s = self.scheduler
        while not ready():
            if not s.replicas and self.failures:
                raise BatchTimeout(f"waiting for {what}: every replica left: {self.failures[-3:]}")
            before = self._events
            if not self._cond.wait(self.timeout_s) and before == self._events:
                fetched = sorted(r for r, st in s.replicas.items() if st.fetched == s.batch)
                raise BatchTimeout(
                    f"waiting for {what}: nothing happened in {self.timeout_s} s; replicas "
                    f"present {sorted(s.replicas)}, fetched {fetched}, portions outstanding "
                    f"{s.outstanding[:10]}{'...' if len(s.outstanding) > 10 else ''}; "
                    f"failures: {self.failures[-3:] or 'none'}"
                )


def check_servers(status: list[dict]) -> None:
    """The servers (``PSClient.status()``) must serve Sandblaster's vectors.

    Sandblaster touches the shards only through vector operations and pushes into named vectors,
    which bypass the servers' update rule (so ``rule`` and ``lr`` do not matter). Replicated
    servers (``copies > 1``) replicate them like any write; one whose replication failed (a bug:
    it handed its buckets to the others) is refused.

    Raises:
        HogwildError: A server whose replication failed.
    """
    failed = [
        (s.get("address", "?"), s["replication"]["failure"])
        for s in status
        if (s.get("replication") or {}).get("failure")
    ]
    if failed:
        raise HogwildError(f"Sandblaster: replication failed on {failed}")


class BatchObjective:
    """The coordinator's ``evaluate()``: one batch pass over the replicas, through shard ops.

    Args:
        vectors: The coordinator's shard operations (its own client).
        board: The board the replicas ask.
        n_examples: Examples in the batch (the loss and gradient are their mean).
        portion: Examples per portion (much smaller than ``n_examples`` / replicas).
        l2: L2 regularisation: ``0.5 * l2 * x.x`` is added to the loss, ``l2 * x`` to the gradient.
        grad: The vector the gradient is gathered in (``"grad"``, which L-BFGS reads; several
            worker groups on one server group each need their own).
    """

    def __init__(
        self,
        vectors: VectorOps,
        board: Board,
        n_examples: int,
        portion: int,
        l2: float = 0.0,
        grad: str = GRAD,
    ) -> None:
        self.v, self.board, self.grad = vectors, board, grad
        self.n_examples, self.portion, self.l2 = n_examples, portion, l2
        self.n_portions = portions_of(n_examples, portion)
        self.batch = 0

    def __call__(self) -> float:
        v = self.v
        v.fill(self.grad, 0.0)
        self.batch += 1
        total = self.board.run_batch(self.batch, self.n_portions, self._fold)
        v.scale(1.0 / self.n_examples, self.grad)
        loss = total / self.n_examples
        if self.l2:
            loss += 0.5 * self.l2 * v.dot(PARAMS, PARAMS)
            v.axpy(self.l2, PARAMS, self.grad)
        return loss

    def _fold(self, fold: Fold) -> None:
        """Add replica ``fold.replica``'s vector to the gradient (if it holds a push), zero it."""
        vector = replica_vector(fold.replica)
        if fold.portions:
            self.v.axpy(1.0, vector, self.grad)
        self.v.fill(vector, 0.0)
