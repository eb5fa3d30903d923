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
:meth:`leave`, :meth:`begin`, :meth:`fetched`, :meth:`finished`, :meth:`pushed`,
:meth:`folded`) and answers :meth:`request` with an instruction (:class:`Fetch`,
:class:`Compute`, :class:`Push`, :data:`WAIT`) and the coordinator's :attr:`folds` with its
work (:class:`Fold`).

**Pushes and folds.** Each replica pushes into a vector of its own on the shards (a push into a
named vector: see :mod:`.batch`); the coordinator *folds* a push the replica reported complete
(adds the replica's vector to the batch's gradient and zeroes it). A replica is given no new
:class:`Push` while a fold of its vector is pending, so when folded its vector holds exactly one
whole push. A replica that leaves during a push may have reached some shards and not others:
its vector is zeroed instead (a :class:`Fold` with no portions), never added, and the portions
of that push are computed again elsewhere: nothing is counted twice. Every replica's vector is
zeroed when it joins (what an earlier run, or an earlier replica of that number, left there).
A push still in flight when its replica is declared gone lands in its vector after the zeroing,
but is never added: the replica is told to join again only once that push returned, and its join
zeroes the vector again before it may push. Not covered: a member process taken for gone that
lives on (cut off, not dead) and pushes after a restarted process of its number joined; the
servers do not fence a group's members one by one.

Its invariants:

* A portion's gradient reaches the batch's gradient exactly once: a replica adds a portion's
  gradient to the ones it will push only when :meth:`finished` accepted it (the first copy to
  finish); every later copy is discarded and counted (``duplicates``); a push reaches the
  gradient only through its fold. The batch is complete when every portion was accepted, pushed
  and folded, and no fold is pending, so the coordinator reads a whole gradient.
* The loss of a portion is counted with its gradient (when folded), never twice.
* Affinity: :meth:`begin` cuts the portions into one contiguous stripe per replica, taken front
  to back; a replica whose stripe is empty steals the back half of the longest stripe left, so
  both keep sequential runs (a stripe whose replica left is taken whole). Backup copies start
  only when no portion is left unassigned, go to a replica not already running that portion,
  oldest first, at most ``max_copies`` running at once.
* A replica that leaves (killed, timed out) loses only its outstanding portions: the one it was
  running (unless a copy runs elsewhere), those accepted but not yet pushed and those of a push
  it had not reported, which go back to be assigned again (``lost``). A push it reported is
  still folded.

A replica fetches the parameters once per batch, on its first request in it (the coordinator
moves the parameters only between batches), then computes; one that joins mid-batch fetches and
takes part at once.
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
    "Fold",
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


@dataclass(frozen=True)
class Fold:
    """The coordinator's work for ``replica``'s vector: add it to the gradient (when
    ``portions``, the push it holds) and zero it; then report :meth:`PortionScheduler.folded`."""

    replica: int
    portions: tuple[int, ...] = ()


class Phase(Enum):
    IDLE = "idle"  # no batch begun
    RUN = "run"  # portions handed out
    DONE = "done"  # every portion folded


TODO, RUNNING, ACCEPTED, PUSHING, REPORTED, FOLDED = range(6)


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
            portions (and at the end of the batch); more, when its previous push is still
            waiting to be folded (it computes on meanwhile).
        max_copies: Copies of one portion running at once (1: no backup tasks).
    """

    def __init__(self, *, push_every: int = 4, max_copies: int = 2):
        if push_every < 1 or max_copies < 1:
            raise ValueError(f"push_every={push_every} and max_copies={max_copies} must be >= 1")
        self.push_every, self.max_copies = push_every, max_copies
        self.replicas: dict[int, _Replica] = {}
        self._folds: dict[int, Fold] = {}  # pending, by replica (at most one each)
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
        self._folds.setdefault(replica, Fold(replica))  # its vector zeroed before it pushes

    def leave(self, replica: int) -> list[int]:
        """A replica is gone; the portions handed out again because of it (its lost work)."""
        state = self.replicas.pop(replica, None)
        if state is None or self.phase != Phase.RUN:
            return []
        if state.pushing:  # its vector may hold part of that push: zeroed, never added
            self._folds[replica] = Fold(replica)
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
        if self.phase == Phase.RUN:
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
        self.phase = Phase.RUN

    @property
    def complete(self) -> bool:
        return self.phase == Phase.DONE

    @property
    def outstanding(self) -> list[int]:
        """Portions not folded yet."""
        return [p for p, s in enumerate(self._state) if s != FOLDED]

    @property
    def folds(self) -> list[Fold]:
        """The coordinator's pending work, oldest first (see the module docstring)."""
        return list(self._folds.values())

    # ------------------------------------------------------------------ requests

    def request(self, replica: int) -> Fetch | Compute | Push | Wait:
        """What ``replica``, free now, should do next."""
        state = self._replica(replica)
        if state.current is not None or state.pushing:
            raise SchedulerError(
                f"replica {replica} asked for work while it holds portion {state.current} "
                f"or a push of {state.pushing}"
            )
        if self.phase != Phase.RUN:
            return WAIT
        if state.fetched != self.batch:
            return Fetch(self.batch)
        may_push = replica not in self._folds  # its vector holds nothing pending
        if len(state.accepted) >= self.push_every and may_push:
            return self._push(state)
        portion = self._next_own(replica)
        if portion is not None:
            return self._assign(replica, state, portion, backup=False)
        if state.accepted:
            return self._push(state) if may_push else WAIT
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
        """``replica``'s push of ``portions`` was acknowledged by every shard: fold it."""
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
            self._state[portion] = REPORTED
        self._folds[replica] = Fold(replica, tuple(portions))

    def folded(self, fold: Fold) -> None:
        """The coordinator added ``fold``'s vector to the gradient (if it held a push) and zeroed
        it."""
        if self._folds.get(fold.replica) != fold:
            raise SchedulerError(f"{fold} is not pending (pending: {self.folds})")
        del self._folds[fold.replica]
        for portion in fold.portions:
            self._state[portion] = FOLDED
            self.loss += self._loss[portion]
        self._pushed += len(fold.portions)
        if self.phase == Phase.RUN and self._pushed == len(self._state) and not self._folds:
            self.phase = Phase.DONE

    def done_by(self) -> dict[int, int]:
        """Portions accepted from each replica present (all batches)."""
        return {r: s.done for r, s in sorted(self.replicas.items())}


def portions_of(n_examples: int, portion: int) -> int:
    """How many portions of ``portion`` examples cover ``n_examples`` (the last may be short)."""
    return math.ceil(n_examples / portion)
