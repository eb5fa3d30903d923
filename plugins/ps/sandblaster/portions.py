"""Which replica computes which portion of a batch: Sandblaster's load balancing, I/O-free.

DistBelief section 4.2: the coordinator gives each of the N replicas "a small portion of work,
much smaller than 1/Nth of the total size of a batch, and assigns replicas new portions whenever
they are free", so faster replicas do more; "to further manage slow model replicas at the end of
a batch, the coordinator schedules multiple copies of the outstanding portions and uses the
result from whichever model replica finishes first" (MapReduce's backup tasks); sequential
portions go to the same replica (data affinity); replicas fetch the parameters at the start of a
batch and send their gradients every few completed portions.

:class:`PortionScheduler` keeps that bookkeeping and does no I/O (../shared/CONVENTIONS.md,
after dask's worker state machine): it changes only through its event methods (:meth:`join`,
:meth:`leave`, :meth:`begin`, :meth:`seal`, :meth:`open`, :meth:`fetched`, :meth:`finished`,
:meth:`pushed`) and answers :meth:`request` with an instruction (:class:`Fetch`,
:class:`Compute`, :class:`Push`, :data:`WAIT`). Its invariants:

* A portion's gradient reaches the parameter server exactly once: a replica adds a portion's
  gradient to the ones it will push only when :meth:`finished` accepted it (the first copy to
  finish); every later copy is discarded and counted (``duplicates``). The batch is complete
  when every portion was accepted *and* pushed, so the coordinator reads a whole gradient.
* The loss of a portion is counted with its gradient (when pushed), never twice.
* Affinity: :meth:`begin` cuts the portions into one contiguous stripe per replica, taken front
  to back; a replica whose stripe is empty steals the back half of the longest stripe left, so
  both keep sequential runs (a stripe whose replica left is taken whole). Backup copies start
  only when no portion is left unassigned, go to a replica not already running that portion,
  oldest first, at most ``max_copies`` running at once.
* A replica that leaves (killed, timed out) loses only its outstanding portions: the one it was
  running (unless a copy runs elsewhere) and those accepted but not yet pushed, which go back to
  be assigned again (``lost``). Not covered: a replica that dies *during* a push may have reached
  some shards and not others; its portions are computed again and the shards it reached count
  them twice. Closing that needs a push the shards can deduplicate (see the package docstring).

With ``fetch_barrier`` (the default) no portion is handed out until every replica fetched the
batch's parameters, the coordinator sealed the batch (:meth:`seal`: no fetch after it) and
opened it (:meth:`open`): the coordinator accumulates the gradient in the parameters' own place
(see :mod:`.batch`), so no replica may fetch once it starts preparing that place; a replica that
joins later waits for the next batch.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from hogwild.errors import HogwildError

__all__ = [
    "WAIT",
    "Compute",
    "Fetch",
    "Phase",
    "PortionScheduler",
    "Push",
    "SchedulerError",
    "Wait",
]


class SchedulerError(HogwildError):
    """An event that does not fit the scheduler's state (a replica that breaks the protocol)."""


@dataclass(frozen=True)
class Fetch:
    """Pull the parameters of ``batch``, then report :meth:`PortionScheduler.fetched`."""

    batch: int


@dataclass(frozen=True)
class Compute:
    """Compute the gradient of ``portion`` (a backup copy when ``backup``), then report it."""

    batch: int
    portion: int
    backup: bool = False


@dataclass(frozen=True)
class Push:
    """Push the summed gradient of ``portions``, then report :meth:`PortionScheduler.pushed`."""

    batch: int
    portions: tuple[int, ...]


@dataclass(frozen=True)
class Wait:
    """Nothing to do now: ask again after the next event."""


WAIT = Wait()


class Phase(Enum):
    IDLE = "idle"  # no batch begun
    FETCH = "fetch"  # replicas fetch the parameters (barrier: no portion handed out yet)
    SEALED = "sealed"  # barrier: every replica fetched; no more fetches; the coordinator prepares
    RUN = "run"  # portions handed out
    DONE = "done"  # every portion pushed


TODO, RUNNING, ACCEPTED, PUSHING, PUSHED = range(5)


@dataclass
class _Replica:
    fetched: int = -1  # the last batch whose parameters it fetched
    current: int | None = None  # the portion it computes
    accepted: list[int] = field(default_factory=list)  # accepted, not pushed yet
    pushing: tuple[int, ...] = ()
    done: int = 0  # portions accepted from it (all batches)
    backups: int = 0  # backup copies it was given (all batches)


@dataclass
class Stats:
    """Counters over every batch."""

    batches: int = 0
    portions: int = 0  # portions accepted
    backups: int = 0  # backup copies handed out
    duplicates: int = 0  # results discarded: another copy finished first
    stale: int = 0  # results discarded: from an earlier batch, or an unknown replica
    lost: int = 0  # portions handed out again because their replica left


class PortionScheduler:
    """Portions of one batch at a time among the replicas that ask for work.

    Args:
        push_every: A replica pushes its accumulated gradient once it holds this many accepted
            portions (and at the end of the batch).
        max_copies: Copies of one portion running at once (1: no backup tasks).
        fetch_barrier: Hand out portions only once every replica fetched and the coordinator
            called :meth:`seal` and :meth:`open` (see the module docstring).
    """

    def __init__(self, *, push_every: int = 4, max_copies: int = 2, fetch_barrier: bool = True):
        if push_every < 1 or max_copies < 1:
            raise ValueError(f"push_every={push_every} and max_copies={max_copies} must be >= 1")
        self.push_every, self.max_copies, self.fetch_barrier = push_every, max_copies, fetch_barrier
        self.replicas: dict[int, _Replica] = {}
        self.stats = Stats()
        self.phase = Phase.IDLE
        self.batch = -1
        self.loss = 0.0
        self._state: list[int] = []
        self._runners: list[set[int]] = []
        self._started: list[int] = []  # when the first copy of each portion started
        self._loss: list[float] = []
        self._stripes: dict[int, deque[int]] = {}
        self._clock = 0
        self._pushed = 0

    # ------------------------------------------------------------------ replicas

    def join(self, replica: int) -> None:
        """A replica is ready for work (it fetches the parameters of the next batch it joins)."""
        if replica in self.replicas:
            raise SchedulerError(f"replica {replica} joined twice")
        self.replicas[replica] = _Replica()

    def leave(self, replica: int) -> list[int]:
        """A replica is gone; the portions handed out again because of it (its lost work)."""
        state = self.replicas.pop(replica, None)
        if state is None or self.phase not in (Phase.FETCH, Phase.SEALED, Phase.RUN):
            return []
        lost = list(state.accepted) + list(state.pushing)
        if state.current is not None:
            runners = self._runners[state.current]
            runners.discard(replica)
            if not runners and self._state[state.current] == RUNNING:
                lost.append(state.current)
        for portion in lost:
            self._state[portion] = TODO
            self._runners[portion].clear()
        stripe = self._stripes.setdefault(replica, deque())
        stripe.extendleft(sorted(lost, reverse=True))
        self.stats.lost += len(lost)
        return sorted(lost)

    # ------------------------------------------------------------------ the batch

    def begin(self, batch: int, n_portions: int) -> None:
        """Start ``batch`` of ``n_portions`` portions, striped over the replicas present."""
        if self.phase in (Phase.FETCH, Phase.SEALED, Phase.RUN):
            raise SchedulerError(f"batch {batch} begun while batch {self.batch} is not complete")
        if batch <= self.batch or n_portions < 1:
            raise SchedulerError(f"batch {batch} of {n_portions} portions after batch {self.batch}")
        self.batch, self.loss, self._pushed = batch, 0.0, 0
        self._state = [TODO] * n_portions
        self._runners = [set() for _ in range(n_portions)]
        self._started = [0] * n_portions
        self._loss = [0.0] * n_portions
        ids = sorted(self.replicas)
        self._stripes = {}
        for i, replica in enumerate(ids):
            lo, hi = n_portions * i // len(ids), n_portions * (i + 1) // len(ids)
            self._stripes[replica] = deque(range(lo, hi))
        if not ids:
            self._stripes[-1] = deque(range(n_portions))  # nobody yet: anyone steals from it
        for state in self.replicas.values():
            state.current, state.accepted, state.pushing = None, [], ()
        self.stats.batches += 1
        self.phase = Phase.FETCH if self.fetch_barrier else Phase.RUN

    @property
    def all_fetched(self) -> bool:
        """Every replica present fetched this batch's parameters (and there is at least one)."""
        return bool(self.replicas) and all(r.fetched == self.batch for r in self.replicas.values())

    def seal(self) -> None:
        """Barrier mode: every replica fetched; from now on nobody fetches this batch."""
        if self.phase != Phase.FETCH or not self.all_fetched:
            raise SchedulerError(f"seal() in phase {self.phase.value}, all fetched: "
                                 f"{self.all_fetched}")  # fmt: skip
        self.phase = Phase.SEALED

    def open(self) -> None:
        """Barrier mode: the coordinator prepared the gradient's place; hand out portions."""
        if self.phase != Phase.SEALED:
            raise SchedulerError(f"open() in phase {self.phase.value}")
        self.phase = Phase.RUN

    @property
    def complete(self) -> bool:
        return self.phase == Phase.DONE

    @property
    def outstanding(self) -> list[int]:
        """Portions not pushed yet."""
        return [p for p, s in enumerate(self._state) if s != PUSHED]

    # ------------------------------------------------------------------ requests

    def request(self, replica: int) -> Fetch | Compute | Push | Wait:
        """What ``replica``, free now, should do next."""
        state = self._replica(replica)
        if state.current is not None or state.pushing:
            raise SchedulerError(
                f"replica {replica} asked for work while it holds portion {state.current} "
                f"or a push of {state.pushing}"
            )
        if self.phase in (Phase.IDLE, Phase.DONE):
            return WAIT
        if state.fetched != self.batch:
            may = self.phase == Phase.FETCH or (self.phase == Phase.RUN and not self.fetch_barrier)
            return Fetch(self.batch) if may else WAIT
        if self.phase in (Phase.FETCH, Phase.SEALED):
            return WAIT
        if len(state.accepted) >= self.push_every:
            return self._push(state)
        portion = self._next_own(replica)
        if portion is not None:
            return self._assign(replica, state, portion, backup=False)
        if state.accepted:
            return self._push(state)
        portion = self._backup_for(replica)
        if portion is not None:
            state.backups += 1
            self.stats.backups += 1
            return self._assign(replica, state, portion, backup=True)
        return WAIT

    def _replica(self, replica: int) -> _Replica:
        state = self.replicas.get(replica)
        if state is None:
            raise SchedulerError(f"replica {replica} has not joined (or has left)")
        return state

    def _push(self, state: _Replica) -> Push:
        state.pushing, state.accepted = tuple(state.accepted), []
        for portion in state.pushing:
            self._state[portion] = PUSHING
        return Push(self.batch, state.pushing)

    def _next_own(self, replica: int) -> int | None:
        stripe = self._stripes.get(replica)
        if not stripe:
            longest = max(self._stripes, key=lambda r: len(self._stripes[r]), default=None)
            if longest is None or not self._stripes[longest]:
                return None
            victim = self._stripes[longest]
            # the victim keeps the front half, the thief takes the back; all of a stripe whose
            # replica left
            keep = len(victim) // 2 if longest in self.replicas else 0
            stripe = deque(victim.popleft() for _ in range(keep))
            self._stripes[longest], stripe = stripe, victim
            self._stripes[replica] = stripe
        return stripe.popleft()

    def _backup_for(self, replica: int) -> int | None:
        best = None
        for portion, runners in enumerate(self._runners):
            if (
                self._state[portion] == RUNNING
                and replica not in runners
                and len(runners) < self.max_copies
                and (best is None or self._started[portion] < self._started[best])
            ):
                best = portion
        return best

    def _assign(self, replica: int, state: _Replica, portion: int, backup: bool) -> Compute:
        if not self._runners[portion]:
            self._clock += 1
            self._started[portion] = self._clock
        self._state[portion] = RUNNING
        self._runners[portion].add(replica)
        state.current = portion
        return Compute(self.batch, portion, backup)

    # ------------------------------------------------------------------ reports

    def fetched(self, replica: int, batch: int) -> None:
        """``replica`` holds the parameters of ``batch``."""
        self._replica(replica).fetched = batch

    def finished(self, replica: int, batch: int, portion: int, loss: float) -> bool:
        """``replica`` computed ``portion`` (summed loss ``loss``): keep its gradient?

        Returns:
            True: the first copy to finish; the replica adds the gradient to its next push.
            False: discarded (another copy finished first, or the batch is over).
        """
        state = self.replicas.get(replica)
        if state is None or batch != self.batch:
            self.stats.stale += 1
            return False
        if state.current != portion:
            raise SchedulerError(
                f"replica {replica} reported portion {portion} but was given {state.current}"
            )
        state.current = None
        self._runners[portion].discard(replica)
        if self._state[portion] != RUNNING:
            self.stats.duplicates += 1
            return False
        self._state[portion] = ACCEPTED
        self._loss[portion] = float(loss)
        state.accepted.append(portion)
        state.done += 1
        self.stats.portions += 1
        return True

    def pushed(self, replica: int, batch: int, portions: tuple[int, ...]) -> None:
        """``replica``'s push of ``portions`` was acknowledged by every shard."""
        state = self.replicas.get(replica)
        if state is None or batch != self.batch:
            self.stats.stale += 1
            return
        if tuple(portions) != state.pushing:
            raise SchedulerError(
                f"replica {replica} reported a push of {portions}, was told {state.pushing}"
            )
        state.pushing = ()
        for portion in portions:
            self._state[portion] = PUSHED
            self.loss += self._loss[portion]
        self._pushed += len(portions)
        if self._pushed == len(self._state):
            self.phase = Phase.DONE

    def done_by(self) -> dict[int, int]:
        """Portions accepted from each replica present (all batches)."""
        return {r: s.done for r, s in sorted(self.replicas.items())}


def portions_of(n_examples: int, portion: int) -> int:
    """How many portions of ``portion`` examples cover ``n_examples`` (the last may be short)."""
    return math.ceil(n_examples / portion)
