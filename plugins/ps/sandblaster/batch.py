"""One batch pass: the board replicas ask for work, and the coordinator's gathering of the gradient.

:class:`Board` puts the :class:`~.portions.PortionScheduler` behind a lock and a condition so that
replicas (threads of this process, :mod:`.replica`) and the coordinator can wait on it: a replica
blocks in :meth:`Board.request` until there is work (or :data:`STOP`), the coordinator in
:meth:`Board.run_batch` until every replica fetched and until every portion is pushed. It is the
in-process transport; a networked one would carry the same calls as messages, the scheduler
unchanged. Every wait has a deadline (:class:`BatchTimeout` names what was outstanding).

:class:`BatchObjective` is the coordinator's ``evaluate()`` for
:class:`~.lbfgs.SandblasterLBFGS`: the loss and gradient of the batch at ``"params"``, with the
gradient left on the shards as ``"grad"``, through shard operations only.

**Where the gradient is summed.** Replicas push their accumulated gradients with
:meth:`~hogwild_plugins.ps.client.PSClient.push_deltas`, the only push the servers take, and it
goes into the parameters, through the server's rule. So, with the servers' rule ``"sgd"`` and
``ps.lr = 1`` (the defaults), a pass runs (``fetch_barrier``):

1. ``begin``: every replica pulls ``"params"`` (= x) and reports it;
2. once all have: ``copy(params -> sandblaster.x)``, ``fill(params, 0)``, then portions go out;
3. the replicas' pushes sum their gradients into ``"params"`` (0 + g1 + g2 + ..., exact in
   float32 up to summation order; adding them onto x and subtracting x after would lose the
   gradient's low bits to x's magnitude);
4. when every portion is pushed: ``copy(params -> grad)``, ``copy(sandblaster.x -> params)``,
   ``scale(1/n, grad)``, and for L2 ``axpy(l2, params, grad)`` with the loss's ``0.5 l2 x.x``
   from ``dot``.

The price: during a pass ``"params"`` holds a partial gradient, so no replica may fetch after
step 2 (a late replica waits a batch), and a server that flushes its shards to LMDB mid-pass
writes the partial gradient, not the parameters. A push into a named vector
(``PUSH_DELTAS`` naming ``"grad"``, added without the rule and without a version change) would
remove all three; the package docstring describes it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from hogwild_plugins.ps.sandblaster.lbfgs import GRAD, PARAMS
from hogwild_plugins.ps.sandblaster.portions import (
    Compute,
    Fetch,
    PortionScheduler,
    Push,
    Wait,
    portions_of,
)
from hogwild_plugins.ps.sandblaster.vectors import ShardVectors

from hogwild.errors import HogwildError

__all__ = ["STOP", "BatchObjective", "BatchTimeout", "Board", "Stop", "check_rule"]

SAVED = "sandblaster.x"


class BatchTimeout(HogwildError):
    """A batch pass made no progress in time (no replica, or replicas that stopped answering)."""


@dataclass(frozen=True)
class Stop:
    """The board is closed: the replica's loop ends."""


STOP = Stop()


class Board:
    """The scheduler, shared by replica threads and the coordinator (lock and condition).

    Args:
        scheduler: The portion scheduler (its ``fetch_barrier`` must match the objective's).
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

    def run_batch(self, batch: int, n_portions: int, prepare=None) -> float:
        """Run one pass: begin, wait for the fetches, ``prepare()``, open, wait for the pushes.

        Returns:
            The summed loss the replicas reported for the portions they pushed.

        Raises:
            BatchTimeout: ``timeout_s`` passed with no event that moved the batch on.
        """
        s = self.scheduler
        with self._cond:
            s.begin(batch, n_portions)
            self._cond.notify_all()
            if s.fetch_barrier:
                self._wait(lambda: s.all_fetched, f"batch {batch}: replicas to fetch")
                s.seal()
        if s.fetch_barrier:
            if prepare is not None:
                prepare()  # shard operations, outside the lock: replicas only wait meanwhile
            with self._cond:
                s.open()
                self._cond.notify_all()
        with self._cond:
            self._wait(lambda: s.complete, f"batch {batch}: portions")
            return s.loss

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


def check_rule(status: list[dict]) -> None:
    """The servers (``PSClient.status()``) must apply pushes as plain sums: rule ``"sgd"``.

    Raises:
        HogwildError: A server with another rule (its ``ps.lr`` must also be 1, which the status
            does not show).
    """
    wrong = {s.get("address", "?"): s.get("rule") for s in status if s.get("rule") != "sgd"}
    if wrong:
        raise HogwildError(
            f"Sandblaster sums gradients by pushing them into the parameters, which needs the "
            f"servers' rule 'sgd' with ps.lr = 1; servers {wrong} have other rules"
        )


class BatchObjective:
    """The coordinator's ``evaluate()``: one batch pass over the replicas, through shard ops.

    Args:
        vectors: The coordinator's shard operations (its own client).
        board: The board the replicas ask.
        n_examples: Examples in the batch (the loss and gradient are their mean).
        portion: Examples per portion (much smaller than ``n_examples`` / replicas).
        l2: L2 regularisation: ``0.5 * l2 * x.x`` is added to the loss, ``l2 * x`` to the gradient.
    """

    def __init__(
        self,
        vectors: ShardVectors,
        board: Board,
        n_examples: int,
        portion: int,
        l2: float = 0.0,
    ) -> None:
        if not board.scheduler.fetch_barrier:
            raise HogwildError(
                "the batch pass sums gradients in the parameters' place and needs fetch_barrier"
            )
        self.v, self.board = vectors, board
        self.n_examples, self.portion, self.l2 = n_examples, portion, l2
        self.n_portions = portions_of(n_examples, portion)
        self.batch = 0

    def __call__(self) -> float:
        v = self.v

        def prepare() -> None:
            v.copy(PARAMS, SAVED)
            v.fill(PARAMS, 0.0)

        self.batch += 1
        total = self.board.run_batch(self.batch, self.n_portions, prepare)
        v.copy(PARAMS, GRAD)
        v.copy(SAVED, PARAMS)
        v.scale(1.0 / self.n_examples, GRAD)
        loss = total / self.n_examples
        if self.l2:
            loss += 0.5 * self.l2 * v.dot(PARAMS, PARAMS)
            v.axpy(self.l2, PARAMS, GRAD)
        return loss
