"""The epochs of a cluster job across its model replicas, as a state machine that does no I/O.

The driver feeds it what it learns from the replicas (:class:`Joined`, :class:`Progress`,
:class:`ShareDone`, :class:`Lost`) through :meth:`Coordinator.handle`, and does what it answers:
instructions to send (:class:`StartShare`, :class:`CloseShare`) and the end of an epoch
(:class:`EpochEnd`, after which the driver evaluates, checkpoints, and calls
:meth:`Coordinator.advance`; or :class:`Finished`). Sockets, processes and clocks live in
:mod:`hogwild.cluster.driver`; this module is tested without any (dask's worker state machine is
the model, CONVENTIONS.md).

What it decides:

- **Shards**: every epoch is a fresh permutation of the training set (each replica computes it
  from the seed and the epoch), cut into one contiguous shard per replica.
- **Warm start** (DistBelief 4.1): in the first epoch of a fresh job, replica 0 trains alone until
  it has trained ``warm_start`` examples (or finished its shard), then the others start theirs.
- **The epoch rule** (Adam 3.2.5, across replicas): once ``ceil(fraction * replicas)`` replicas
  have finished their shard, the others are told to stop at their next chunk (replicas that have
  not started are skipped); the epoch ends when every replica has answered.
- **A replica that dies** (:class:`Lost`; the driver restarts it, ``cluster.restarts``) is a
  straggler that lost its work, and the rule above says what becomes of its share. While the
  epoch still waits for finished shards, its share is handed out again, whole, when it rejoins
  (:class:`Joined`): a shard is a contiguous range split over the replica's workers, so what was
  trained of it is no prefix that could be skipped. Once enough shards finished, it is counted
  as done, with nothing: a closed straggler's remainder is not trained either. Either way the
  examples it trained before it died are in the model (their updates were pushed) but in none
  of the epoch's figures (their loss and counts died with it), so nothing is counted twice, and
  no share waits for an answer that cannot come. A replica that has not rejoined when an epoch
  begins gets its share when it does, or never if the epoch closes first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# -- events (what the driver learned) -----------------------------------------------------------


@dataclass(frozen=True)
class Joined:
    """Replica ``replica`` is up and idle."""

    replica: int


@dataclass(frozen=True)
class Progress:
    """Replica ``replica`` has trained ``examples`` of its share of ``epoch`` so far."""

    replica: int
    epoch: int
    examples: int


@dataclass(frozen=True)
class Lost:
    """Replica ``replica`` died: whatever it was doing is gone (it may join again)."""

    replica: int


@dataclass(frozen=True)
class ShareDone:
    """Replica ``replica`` finished (or stopped) its share of ``epoch``."""

    replica: int
    epoch: int
    examples: int
    loss: float
    correct: int
    data_wait_s: float = 0.0
    store_wait_s: float = 0.0


# -- instructions (what the driver must do) ----------------------------------------------------


@dataclass(frozen=True)
class StartShare:
    """Tell ``replica`` to train ``order[start:stop]`` of ``epoch``'s permutation."""

    replica: int
    epoch: int
    lr: float
    start: int
    stop: int
    seed: int


@dataclass(frozen=True)
class CloseShare:
    """Tell ``replica`` to stop its share of ``epoch`` at its next chunk."""

    replica: int
    epoch: int


@dataclass(frozen=True)
class EpochEnd:
    """Every replica answered for ``epoch``: evaluate, checkpoint, then :meth:`advance`."""

    epoch: int
    lr: float
    examples: int
    loss: float
    correct: int
    data_wait_s: float
    store_wait_s: float
    per_replica: dict[int, int]


@dataclass(frozen=True)
class Finished:
    """Every epoch is done."""


WAITING, TRAINING, CLOSING, DONE = "waiting", "training", "closing", "done"


@dataclass
class _Share:
    state: str = WAITING
    examples: int = 0
    done: ShareDone | None = None


@dataclass
class Coordinator:
    """Epochs across ``replicas`` model replicas (see the module docstring).

    Args:
        replicas: How many replicas the job has.
        n_train: Training examples per epoch (the permutation's length).
        epochs: The job's last epoch + 1.
        start_epoch: The first epoch to train (a resumed job starts later).
        seed: The job's seed (each share's data-order seed derives from it).
        lr_of: The learning rate of an epoch (the job's schedule).
        warm_start: Examples replica 0 trains alone in a fresh job's first epoch (0: none).
        fraction: The epoch rule's fraction of replicas.
    """

    replicas: int
    n_train: int
    epochs: int
    start_epoch: int
    seed: int
    lr_of: Callable[[int], float]
    warm_start: int = 0
    fraction: float = 1.0
    epoch: int = -1
    joined: set[int] = field(default_factory=set)
    shares: dict[int, _Share] = field(default_factory=dict)
    closed: bool = False

    def __post_init__(self) -> None:
        if self.replicas < 1 or not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"{self.replicas} replicas, fraction {self.fraction}")

    # -- derived ---------------------------------------------------------------------------------

    @property
    def needed(self) -> int:
        """Finished shards that end an epoch (the rest are closed)."""
        return max(1, math.ceil(self.fraction * self.replicas - 1e-9))

    def shard(self, replica: int) -> tuple[int, int]:
        """Replica ``replica``'s contiguous part of every epoch's permutation."""
        start = round(replica * self.n_train / self.replicas)
        stop = round((replica + 1) * self.n_train / self.replicas)
        return start, stop

    @property
    def warming(self) -> bool:
        """Whether replica 0 trains alone right now (the first epoch of a fresh job)."""
        return (
            self.warm_start > 0
            and self.epoch == 0
            and self.start_epoch == 0
            and self.shares.get(0, _Share()).state == TRAINING
            and self.shares[0].examples < self.warm_start
            and any(s.state == WAITING for r, s in self.shares.items() if r != 0)
        )

    def remaining(self, replica: int) -> int | None:
        """Examples replica ``replica`` trains before its next event: the end of its share, or
        of the warm start while it trains alone; 0 once it was told to stop at its next chunk;
        None when it trains nothing now."""
        share = self.shares.get(replica)
        if share is None or share.state not in (TRAINING, CLOSING):
            return None
        if share.state == CLOSING:
            return 0
        start, stop = self.shard(replica)
        left = max(0, stop - start - share.examples)
        if self.warming and replica == 0:
            left = min(left, max(0, self.warm_start - share.examples))
        return left

    def state_of(self, replica: int) -> str:
        share = self.shares.get(replica)
        return share.state if share else ("idle" if replica in self.joined else "starting")

    # -- events ----------------------------------------------------------------------------------

    def handle(self, event) -> list:
        """Apply one event; the instructions it gives rise to, in order."""
        if isinstance(event, Joined):
            self.joined.add(event.replica)
            if self.epoch < 0:
                return self._begin(self.start_epoch) if len(self.joined) == self.replicas else []
            return self._after_warm_start()  # a replica back from the dead takes its share
        if isinstance(event, Lost):
            return self._lost(event.replica)
        if not isinstance(event, Progress | ShareDone):
            raise TypeError(f"not a coordinator event: {event!r}")
        if event.epoch != self.epoch or event.replica not in self.shares:
            return []  # a late answer about an epoch that is over
        share = self.shares[event.replica]
        if isinstance(event, Progress):
            share.examples = max(share.examples, event.examples)
            return self._after_warm_start()
        if share.state == DONE:
            return []
        share.state, share.done, share.examples = DONE, event, event.examples
        return self._after_done()

    def advance(self) -> list:
        """The driver finished the epoch's evaluation and checkpoint: go on."""
        return self._begin(self.epoch + 1)

    # -- the rules -------------------------------------------------------------------------------

    def _begin(self, epoch: int) -> list:
        if epoch >= self.epochs:
            self.epoch = epoch
            return [Finished()]
        self.epoch, self.closed = epoch, False
        self.shares = {r: _Share() for r in range(self.replicas)}
        warm = self.warm_start > 0 and epoch == 0 and self.start_epoch == 0
        first = [0] if warm and self.replicas > 1 else list(range(self.replicas))
        return [self._start(r) for r in first if r in self.joined]  # the others when they join

    def _start(self, replica: int) -> StartShare:
        self.shares[replica].state = TRAINING
        start, stop = self.shard(replica)
        seed = (self.seed * 1_000_003 + self.epoch * 1_009 + replica) % 2**31
        return StartShare(replica, self.epoch, self.lr_of(self.epoch), start, stop, seed)

    def _after_warm_start(self) -> list:
        if self.warming or self.closed:
            return []
        return [
            self._start(r)
            for r, s in sorted(self.shares.items())
            if s.state == WAITING and r in self.joined
        ]

    def _lost(self, replica: int) -> list:
        """A replica died (see the module docstring): its share again, or done with nothing."""
        self.joined.discard(replica)
        share = self.shares.get(replica)
        if share is None or share.state in (WAITING, DONE):
            return []
        if self.closed:  # CLOSING: the answer it owed will not come
            share.state, share.examples = DONE, 0
            return self._after_done()
        self.shares[replica] = _Share()  # TRAINING: handed out again, whole, when it rejoins
        return self._after_warm_start()  # a warm start without replica 0 ends here

    def _after_done(self) -> list:
        out = []
        finished = sum(s.state == DONE for s in self.shares.values())
        if not self.closed and finished >= self.needed:
            self.closed = True
            for replica, share in sorted(self.shares.items()):
                if share.state == TRAINING:
                    share.state = CLOSING
                    out.append(CloseShare(replica, self.epoch))
                elif share.state == WAITING:  # closed before it started: nothing to wait for
                    share.state = DONE
        out += self._after_warm_start()
        if all(s.state == DONE for s in self.shares.values()):
            out.append(self._epoch_end())
        return out

    def _epoch_end(self) -> EpochEnd:
        done = [s.done for s in self.shares.values() if s.done is not None]
        return EpochEnd(
            self.epoch,
            self.lr_of(self.epoch),
            sum(d.examples for d in done),
            sum(d.loss for d in done),
            sum(d.correct for d in done),
            sum(d.data_wait_s for d in done),
            sum(d.store_wait_s for d in done),
            {r: s.examples for r, s in self.shares.items()},
        )


def replicas_training(coordinator: Coordinator) -> Sequence[int]:
    """The replicas with a share under way (the driver polls them)."""
    return [r for r, s in coordinator.shares.items() if s.state in (TRAINING, CLOSING)]
