"""The epochs of a cluster job across its model replicas, as a state machine that does no I/O.

The driver feeds it what it learns from the replicas (:class:`Joined`, :class:`Progress`,
:class:`PortionDone`, :class:`Lost`, each with a stimulus id) through :meth:`Coordinator.handle`,
and does what it answers: instructions to send (:class:`StartPortion`, :class:`Close`) and the
end of an epoch (:class:`EpochEnd`, after which the driver evaluates, checkpoints, and calls
:meth:`Coordinator.advance`; or :class:`Finished`). Sockets, processes and clocks live in
:mod:`hogwild.cluster.epochs`; this module is tested without any (dask's worker state machine
is the model): it keeps a bounded log of every replica's transitions with the stimulus that
caused each (:meth:`Coordinator.story`), and :meth:`Coordinator.validate_state` checks its
invariants (its tests call it after every step).

What it decides:

- **Portions**: every epoch is a fresh permutation of the training set (each replica computes it
  from the seed and the epoch), handed out in contiguous portions on demand, so a replica that
  runs faster (its core not shared with a parameter server at that moment) takes more, and the
  replicas finish an epoch within a small portion of each other instead of one whole share of
  their difference. The portions shrink as the epoch goes: each is the part not yet handed out
  over twice the replicas, never under ``min_portion`` but for the last ("factoring", Hummel,
  Schonberg & Flynn, CACM 1992): few large ones while much is left, small ones at the end. Every
  replica takes its current portion first; then, while enough is left that every replica would
  still find its next one, each holds the one after its current one too (``ahead``), so it goes
  on without waiting for the driver between them. A coordinated topology (Sandblaster,
  AllReduce: a share is its group's batch) keeps one fixed shard per replica (``guided=False``):
  portion ``r`` is replica ``r``'s and no other's.
- **Warm start** (DistBelief 4.1): in the first epoch of a fresh job, replica 0 trains alone
  until it has trained ``warm_start`` examples (or finished what it holds), then the others join
  in.
- **The epoch rule** (Adam 3.2.5, across replicas): a replica has finished the epoch when it
  trained at least one portion of it, holds nothing, and nothing is left for it. Once
  ``ceil(fraction * replicas)`` have, the others are told to stop at their next chunk (a portion
  held ahead that has not begun stops at once), what was not handed out is not trained, and
  replicas that never started are skipped; the epoch ends when no replica holds a portion.
- **A replica that dies** (:class:`Lost`; the driver restarts it, ``cluster.restarts``) loses the
  portions it held: they go back to be handed out again, whole, to whichever replica asks next
  (a fixed shard waits for its replica to rejoin), unless the epoch is closed. A portion is split
  over the replica's workers, so what was trained of it is no prefix that could be skipped. Its
  finished portions stay counted; what it trained of the lost ones is in the model (the updates
  were pushed) but in none of the epoch's figures, so nothing is counted twice, and no epoch
  waits for an answer that cannot come.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

STORY_LENGTH = 10_000  # transitions kept by Coordinator.story()

# -- events (what the driver learned) -----------------------------------------------------------


@dataclass(frozen=True)
class Joined:
    """Replica ``replica`` is up and idle."""

    replica: int
    stimulus_id: str = ""


@dataclass(frozen=True)
class Progress:
    """Replica ``replica`` has trained ``examples`` of its portion at ``start`` of ``epoch``."""

    replica: int
    epoch: int
    start: int
    examples: int
    stimulus_id: str = ""


@dataclass(frozen=True)
class Lost:
    """Replica ``replica`` died: whatever it was doing is gone (it may join again)."""

    replica: int
    stimulus_id: str = ""


@dataclass(frozen=True)
class PortionDone:
    """Replica ``replica`` finished (or stopped) its portion at ``start`` of ``epoch``."""

    replica: int
    epoch: int
    start: int
    examples: int
    loss: float
    correct: int
    data_wait_s: float = 0.0
    store_wait_s: float = 0.0
    stimulus_id: str = ""


# -- instructions (what the driver must do) ----------------------------------------------------


@dataclass(frozen=True)
class StartPortion:
    """Tell ``replica`` to train ``order[start:stop]`` of ``epoch``'s permutation (after what it
    holds already)."""

    replica: int
    epoch: int
    lr: float
    start: int
    stop: int
    seed: int


@dataclass(frozen=True)
class Close:
    """Tell ``replica`` to stop what it holds of ``epoch`` at its next chunk."""

    replica: int
    epoch: int


@dataclass(frozen=True)
class EpochEnd:
    """No replica holds a portion of ``epoch`` any more: evaluate, checkpoint, then
    :meth:`Coordinator.advance`."""

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
class _Replica:
    """One replica's part of the epoch under way."""

    state: str = WAITING
    held: list[int] = field(default_factory=list)  # its portions not yet finished, in order
    examples: int = 0  # of its current (first held) portion so far
    done: list[PortionDone] = field(default_factory=list)  # its finished portions

    @property
    def trained(self) -> int:
        return sum(d.examples for d in self.done) + (self.examples if self.held else 0)


@dataclass
class Coordinator:
    """Epochs across ``replicas`` model replicas (see the module docstring).

    Args:
        replicas: How many replicas the job has.
        n_train: Training examples per epoch (the permutation's length).
        epochs: The job's last epoch + 1.
        start_epoch: The first epoch to train (a resumed job starts later).
        seed: The job's seed (each portion's data-order seed derives from it).
        lr_of: The learning rate of an epoch (the job's schedule).
        warm_start: Examples replica 0 trains alone in a fresh job's first epoch (0: none).
        fraction: The epoch rule's fraction of replicas.
        guided: Portions on demand; False: one fixed shard per replica.
        min_portion: The smallest portion (the last ones of an epoch).
        ahead: Portions a replica holds after its current one while enough is left.
    """

    replicas: int
    n_train: int
    epochs: int
    start_epoch: int
    seed: int
    lr_of: Callable[[int], float]
    warm_start: int = 0
    fraction: float = 1.0
    guided: bool = True
    min_portion: int = 512
    ahead: int = 1
    epoch: int = -1
    joined: set[int] = field(default_factory=set)
    parts: dict[int, _Replica] = field(default_factory=dict)
    portions: list[tuple[int, int]] = field(default_factory=list)
    unassigned: list[int] = field(default_factory=list)  # portion indices, ascending
    closed: bool = False
    alone: bool = False  # the warm start: replica 0 trains alone
    ended: bool = False  # the epoch's EpochEnd was given
    log: deque = field(default_factory=lambda: deque(maxlen=STORY_LENGTH), repr=False)
    stimuli: itertools.count = field(default_factory=itertools.count, repr=False)

    def __post_init__(self) -> None:
        if self.replicas < 1 or not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"{self.replicas} replicas, fraction {self.fraction}")
        if self.min_portion < 1 or self.ahead < 0:
            raise ValueError(f"min_portion {self.min_portion}, ahead {self.ahead}")

    # -- derived ---------------------------------------------------------------------------------

    @property
    def needed(self) -> int:
        """Replicas that must have finished to end an epoch (the rest are closed)."""
        return max(1, math.ceil(self.fraction * self.replicas - 1e-9))

    def shard(self, replica: int) -> tuple[int, int]:
        """Replica ``replica``'s fixed part of every epoch's permutation (``guided=False``)."""
        start = round(replica * self.n_train / self.replicas)
        stop = round((replica + 1) * self.n_train / self.replicas)
        return start, stop

    def plan(self) -> list[tuple[int, int]]:
        """Every epoch's portions, in the order they are handed out; they tile the permutation."""
        if not self.guided or self.replicas == 1:  # one replica: nobody to balance against
            return [self.shard(r) for r in range(self.replicas)]
        out, start = [], 0
        while start < self.n_train:
            left = self.n_train - start
            size = min(left, max(self.min_portion, math.ceil(left / (2 * self.replicas))))
            out.append((start, start + size))
            start += size
        return out

    def remaining(self, replica: int) -> int | None:
        """Examples replica ``replica`` trains before its next event: the end of its current
        portion, or of the warm start while it trains alone; 0 once it was told to stop at its
        next chunk; None when it trains nothing now."""
        part = self.parts.get(replica)
        if part is None or part.state not in (TRAINING, CLOSING) or not part.held:
            return None
        if part.state == CLOSING:
            return 0
        start, stop = self.portions[part.held[0]]
        left = max(0, stop - start - part.examples)
        if replica == 0 and self.alone:
            left = min(left, max(0, self.warm_start - part.trained))
        return left

    def current(self, replica: int) -> int | None:
        """The start of the portion ``replica`` trains now; None when it holds none."""
        part = self.parts.get(replica)
        return self.portions[part.held[0]][0] if part is not None and part.held else None

    def state_of(self, replica: int) -> str:
        part = self.parts.get(replica)
        return part.state if part else ("idle" if replica in self.joined else "starting")

    # -- events ----------------------------------------------------------------------------------

    def handle(self, event) -> list:
        """Apply one event; the instructions it gives rise to, in order."""
        stimulus = (
            getattr(event, "stimulus_id", "") or f"{type(event).__name__}-{next(self.stimuli)}"
        )
        before = self._states()
        out = self._handle(event)
        self._tell(stimulus, before)
        return out

    def advance(self, stimulus_id: str = "") -> list:
        """The driver finished the epoch's evaluation and checkpoint: go on."""
        stimulus = stimulus_id or f"advance-{next(self.stimuli)}"
        before = self._states()
        out = self._begin(self.epoch + 1)
        self._tell(stimulus, before)
        return out

    def story(self, replica: int | None = None) -> list[tuple]:
        """The transitions, oldest first, each ``(stimulus_id, replica, epoch, before, after)``
        (a replica's state in the epoch: waiting, training, closing, done; None before the
        epoch's first); with ``replica``, that replica's only."""
        return [t for t in self.log if replica is None or t[1] == replica]

    def _states(self) -> tuple[int, dict[int, str]]:
        return self.epoch, {r: p.state for r, p in self.parts.items()}

    def _tell(self, stimulus: str, before: tuple[int, dict[int, str]]) -> None:
        epoch, states = before
        for replica, part in sorted(self.parts.items()):
            was = states.get(replica) if epoch == self.epoch else None
            if part.state != was:
                self.log.append((stimulus, replica, self.epoch, was, part.state))

    def validate_state(self) -> None:
        """Raise AssertionError if an invariant does not hold (tests call it after every step):
        the epoch's portions tile the permutation; each portion not yet finished is held by one
        replica or waits to be handed out, never both; a replica's state agrees with what it
        holds; a closed epoch hands nothing out; an ended epoch has nobody training."""
        assert self.joined <= set(range(self.replicas)), self.joined
        if self.epoch < 0 or self.epoch >= self.epochs:
            return
        edges = [0] + [stop for _, stop in self.portions]
        assert [start for start, _ in self.portions] == edges[:-1], self.portions
        assert edges[-1] == self.n_train and all(a < b for a, b in self.portions), self.portions
        assert self.unassigned == sorted(set(self.unassigned)), self.unassigned
        held = [i for p in self.parts.values() for i in p.held]
        assert len(held) == len(set(held)), held
        assert not set(held) & set(self.unassigned), (held, self.unassigned)
        assert all(0 <= i < len(self.portions) for i in held + self.unassigned)
        assert set(self.parts) == set(range(self.replicas)), self.parts
        for replica, part in self.parts.items():
            assert part.state in (WAITING, TRAINING, CLOSING, DONE), (replica, part.state)
            if part.held:
                assert part.state in (TRAINING, CLOSING), (replica, part)
                start, stop = self.portions[part.held[0]]
                assert 0 <= part.examples <= stop - start, (replica, part)
            else:
                assert part.examples == 0 and part.state != TRAINING, (replica, part)
            if not self.guided:
                assert set(part.held) <= {replica}, (replica, part.held)
            if self.alone and replica != 0:
                assert not part.held, (replica, part.held)
        if self.closed:
            assert not self.unassigned, self.unassigned
            assert all(p.state in (CLOSING, DONE) for p in self.parts.values()), self.parts
        if self.ended:
            assert all(p.state in (WAITING, DONE) for p in self.parts.values()), self.parts
        trained = sum(d.examples for p in self.parts.values() for d in p.done)
        assert trained <= self.n_train, trained

    def _handle(self, event) -> list:
        if isinstance(event, Joined):
            self.joined.add(event.replica)
            if self.epoch < 0:
                return self._begin(self.start_epoch) if len(self.joined) == self.replicas else []
            return self._hand_out()  # a replica back from the dead takes what is left
        if isinstance(event, Lost):
            return self._lost(event.replica)
        if not isinstance(event, Progress | PortionDone):
            raise TypeError(f"not a coordinator event: {event!r}")
        part = self.parts.get(event.replica)
        if event.epoch != self.epoch or part is None or not part.held:
            return []  # a late answer about an epoch that is over, or a portion given back
        start, stop = self.portions[part.held[0]]
        if event.start != start:
            return []  # not its current portion: one already counted, or lost, or not begun
        examples = min(event.examples, stop - start)  # never more than the portion has
        if isinstance(event, Progress):
            part.examples = max(part.examples, examples)
            return self._hand_out()
        part.held.pop(0)  # a replica trains what it holds in order, and reports each in order
        part.done.append(replace(event, examples=examples))
        part.examples = 0
        return self._after_answer(event.replica)

    # -- the rules -------------------------------------------------------------------------------

    def _begin(self, epoch: int) -> list:
        if epoch >= self.epochs:
            self.epoch, self.ended = epoch, True
            return [Finished()]
        self.epoch, self.closed, self.ended = epoch, False, False
        self.parts = {r: _Replica() for r in range(self.replicas)}
        self.portions = self.plan()
        self.unassigned = list(range(len(self.portions)))
        fresh = self.warm_start > 0 and epoch == 0 and self.start_epoch == 0
        self.alone = fresh and self.replicas > 1
        return self._hand_out()

    def _eligible(self, replica: int) -> list[int]:
        """Unassigned portions ``replica`` may take, in order."""
        if self.guided:
            return self.unassigned
        return [i for i in self.unassigned if i == replica]

    def _hand_out(self) -> list:
        """Portions for the replicas that can take more, in replica order (only replica 0
        during the warm start); a replica that holds nothing and finds nothing left for it has
        finished the epoch, and the epoch rule is applied before anyone takes more."""
        if self.closed or self.ended:
            return []
        zero = self.parts[0]
        if self.alone and (
            0 not in self.joined
            or zero.trained >= self.warm_start
            or not (zero.held or self._eligible(0))
        ):
            self.alone = False  # the warm start is over: trained enough, died, or nothing left
        takers = [r for r in ([0] if self.alone else sorted(self.joined))
                  if self.parts[r].state != CLOSING]  # fmt: skip
        self._finish_idle(takers)
        out = self._close_when_enough()
        if not self.closed:
            for replica in takers:  # first everyone's current portion
                if not self.parts[replica].held:
                    out += self._take(replica)
            # then the ones ahead, while every replica that will take part would find a next one
            # (during the warm start: the others waiting for its end too)
            sharing = len(self.joined) if self.alone else len(takers)
            for replica in takers:
                held = self.parts[replica].held
                while len(held) < self._wanted() and len(self._eligible(replica)) >= sharing:
                    out += self._take(replica)
            self._finish_idle(takers)  # fewer portions than replicas: nothing for some
        return out + self._end_when_idle()

    def _finish_idle(self, replicas: list[int]) -> None:
        """Those of ``replicas`` that hold nothing and find nothing left have finished."""
        for replica in replicas:
            part = self.parts[replica]
            if not part.held and not self._eligible(replica):
                part.state = DONE

    def _wanted(self) -> int:
        """How many portions a replica holds while enough is left: its current one and
        ``ahead`` more (a fixed shard: its own, alone)."""
        return 1 + self.ahead if self.guided else 1

    def _take(self, replica: int) -> list[StartPortion]:
        """The next portion ``replica`` may take, if any, as the instruction to start it."""
        eligible = self._eligible(replica)
        if not eligible:
            return []
        index, part = eligible[0], self.parts[replica]
        self.unassigned.remove(index)
        part.held.append(index)
        part.state = TRAINING
        start, stop = self.portions[index]
        seed = (self.seed * 1_000_003 + self.epoch * 1_009 + index) % 2**31
        return [StartPortion(replica, self.epoch, self.lr_of(self.epoch), start, stop, seed)]

    def _after_answer(self, replica: int) -> list:
        part = self.parts[replica]
        if part.state != CLOSING:
            return self._hand_out()
        if not part.held:
            part.state = DONE
        return self._end_when_idle()

    def _lost(self, replica: int) -> list:
        """A replica died (see the module docstring): what it held goes back, or is dropped."""
        self.joined.discard(replica)
        part = self.parts.get(replica)
        if part is None or part.state in (WAITING, DONE):
            return []
        lost, part.held, part.examples = part.held, [], 0
        if self.closed:  # CLOSING: the answers it owed will not come
            part.state = DONE
            return self._end_when_idle()
        part.state = WAITING
        self.unassigned = sorted(self.unassigned + lost)
        return self._hand_out()  # to whoever may take them now (a warm start ends here)

    def _close_when_enough(self) -> list:
        """The epoch rule: once enough replicas finished, the others stop at their next chunk,
        and what was not handed out is not trained."""
        # replicas that trained their part and found nothing more (one that never had any, in
        # an epoch of fewer portions than replicas, finished nothing)
        finished = sum(p.state == DONE and bool(p.done) for p in self.parts.values())
        if self.closed or finished < self.needed:
            return []
        self.closed, self.unassigned, out = True, [], []
        for replica, part in sorted(self.parts.items()):
            if part.state == TRAINING:
                part.state = CLOSING
                out.append(Close(replica, self.epoch))
            elif part.state == WAITING:  # closed before it started: nothing to wait for
                part.state = DONE
        return out

    def _end_when_idle(self) -> list:
        """The epoch's end, once no replica holds a portion and nothing is left to hand out."""
        busy = any(p.state in (TRAINING, CLOSING) for p in self.parts.values())
        if self.ended or busy or (self.unassigned and not self.closed):
            return []
        self.ended = True
        return [self._epoch_end()]

    def _epoch_end(self) -> EpochEnd:
        done = [d for p in self.parts.values() for d in p.done]
        return EpochEnd(
            self.epoch,
            self.lr_of(self.epoch),
            sum(d.examples for d in done),
            sum(d.loss for d in done),
            sum(d.correct for d in done),
            sum(d.data_wait_s for d in done),
            sum(d.store_wait_s for d in done),
            {r: sum(d.examples for d in p.done) for r, p in self.parts.items()},
        )


def status_events(replica: int, status: dict) -> list:
    """What replica ``replica``'s ``status`` answer tells: its finished portions of the epoch
    (:class:`PortionDone`, in the order it trained them), then the progress of the one under way.

    The answer's shape (both kinds of replica give it): ``epoch``; ``finished``, a list of
    ``{start, examples, loss, correct, data_wait_s, store_wait_s}``; ``portion``, the one under
    way, ``{start, stop, examples, seconds}``. It came over the network: an entry whose fields
    have the wrong types is left out, and a negative or infinite figure is read as 0 (the
    coordinator also caps a portion's examples at its size).
    """
    epoch = status.get("epoch")
    if not _count(epoch):
        return []
    out: list = []
    finished = status.get("finished")
    for item in finished if isinstance(finished, list) else []:
        if isinstance(item, dict) and _count(item.get("start")) and _count(item.get("examples")):
            out.append(
                PortionDone(
                    replica,
                    epoch,
                    item["start"],
                    item["examples"],
                    _number(item.get("loss")),
                    int(_number(item.get("correct"))),
                    _number(item.get("data_wait_s")),
                    _number(item.get("store_wait_s")),
                )
            )
    portion = status.get("portion")
    if (
        isinstance(portion, dict)
        and _count(portion.get("start"))
        and _count(portion.get("examples"))
    ):
        out.append(Progress(replica, epoch, portion["start"], portion["examples"]))
    return out


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value) -> float:
    """A loss, a count or seconds: finite and not negative, else 0."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok and value >= 0 else 0.0


def replicas_training(coordinator: Coordinator) -> Sequence[int]:
    """The replicas holding a portion (the driver polls them)."""
    return [r for r, p in coordinator.parts.items() if p.state in (TRAINING, CLOSING)]
