"""Where a client's requests go when servers keep copies, decided apart from the sockets.

A request to replicated servers (``copies > 1``) goes to its bucket's primary as etcd names it.
One that its server could not take (``NOT_PRIMARY`` or ``FENCED``: that server lives but serves
the bucket no longer) or that got no answer at all is sent again, with its number, to the
bucket's next primary, until the client's failover time runs out. A pull refused
``READS_WAITING`` (its server is the bucket's primary, waiting out its predecessor's lease
before it answers reads) goes again to the same server after :data:`READS_WAIT_PAUSE_S`, with no
map read, when every request left waits so. Requests that every server refused (it lives: no
one to ping) skip the round's first map read and wait for the map after a pause; refused again
and again by the server the map still names (a winner catching its copies up, a bucket short of
``ps.min_copies``), they back off: the pause doubles from :data:`REFUSED_PAUSE_S` to
:data:`REFUSED_PAUSE_MAX_S`, and starts over once the map moves or a request is answered. Two
things are decided here:

* :func:`reply_outcome`: what one reply means for its request (done, re-route it, a push refused
  as too stale, or an error to raise). A table lookup: it runs for every reply.
* :class:`Rerouting`: after an exchange left requests unanswered, which servers to ping, which
  buckets to wait on (and how long for a new epoch), and where each request goes next. It is a
  state machine with no I/O in the manner of dask's worker state: one entry,
  :meth:`Rerouting.handle` (a stimulus in, a list of actions out), a bounded :meth:`story` of
  its transitions with their stimulus ids, and :meth:`validate_state`. The client's connection
  (:class:`~hogwild_plugins.ps.connection.Connection`) carries the actions out (reads etcd, pings,
  waits, re-sends) and feeds back what it found, so a test drives every decision with no socket.

The invariant it keeps: a request is re-sent only once the map names a primary for its bucket,
and a request whose primary did not answer (and still does not answer a ping) waits for a newer
epoch of its bucket, or a lease's time, before it goes back to the same server.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from hogwild.net.wire import ErrorCode, MsgType

__all__ = [
    "AwaitMap",
    "Exhausted",
    "MapRead",
    "MapSettled",
    "Outcome",
    "Pause",
    "Ping",
    "Pinged",
    "ReadMap",
    "Resend",
    "Rerouting",
    "Unfinished",
    "Waiting",
    "reply_outcome",
    "FAILOVER_TIMEOUT_S",
    "PING_TIMEOUT_S",
    "REFUSED_PAUSE_S",
    "REFUSED_PAUSE_MAX_S",
    "READS_WAIT_PAUSE_S",
    "REROUTE_WAIT_S",
]

FAILOVER_TIMEOUT_S = 0.5  # replicated: a request's timeout (one retry), then the map is read
REROUTE_WAIT_S = 3.0  # replicated: a failed request's wait for the map to move (lease unknown)
REFUSED_PAUSE_S = 0.01  # replicated: a refused request's first pause (a primary catching up)
# replicated: the longest pause of a request refused again and again by the server the map still
# names (a winner catching its copies up, a bucket short of ps.min_copies): the pause doubles from
# REFUSED_PAUSE_S each such round up to this, and starts over once the map moves or a request is
# answered. At a steady 10 ms, each round with its map read, a 1.8 s catch-up once took 88 rounds
# of client, server and etcd CPU; doubled to 0.2 s it takes about a dozen, each at most 0.2 s late
REFUSED_PAUSE_MAX_S = 0.2
# replicated: a pull refused READS_WAITING goes again to the same primary after this pause, with
# no map read (the wait is a lease long, 1-2 s: at ~10 ms a round, each refusal re-reading the
# map would load etcd with two range reads per client every round, during a failover)
READS_WAIT_PAUSE_S = 0.1
PING_TIMEOUT_S = 0.3  # how long a silent primary has to answer a ping
MAX_DOUBLINGS = 8  # the back-off's exponent stops here (REFUSED_PAUSE_MAX_S is reached sooner)
LEASE_MARGIN_S = 1.0  # beyond a lease: etcd's expiry round
STORY_LENGTH = 256

RE_ROUTE = frozenset(
    {ErrorCode.NOT_PRIMARY, ErrorCode.FENCED, ErrorCode.STOPPED, ErrorCode.READS_WAITING}
)
"""Refusals that say "not here": the server lives, the bucket is served elsewhere (a bucket
stopped on its primary is handed to a copy), or "not yet" (``READS_WAITING``: the bucket's
primary, its reads waiting out its predecessor's lease; :class:`Waiting`'s ``held``)."""


class Outcome(IntEnum):
    """What one reply means for its request."""

    DONE = 0  # answered: versions and the caller's callback take it
    RE_ROUTE = 1  # not done: it goes again, to its bucket's next primary
    STALE = 2  # done: a push refused as too stale (counted, not raised)
    ERROR = 3  # done: an error the exchange raises once every request is done


def reply_outcome(kind: int, code: int, replicated: bool) -> Outcome:
    """The :class:`Outcome` of a reply of type ``kind`` with error ``code`` (for an ERROR)."""
    if kind != MsgType.ERROR:
        return Outcome.DONE
    if replicated and code in RE_ROUTE:
        return Outcome.RE_ROUTE
    return Outcome.STALE if code == ErrorCode.STALE else Outcome.ERROR


# ------------------------------------------------------------------ stimuli


@dataclass(frozen=True)
class Waiting:
    """One request left unanswered by an exchange.

    Attributes:
        request: The request's index in the client's exchange.
        bucket: Its bucket.
        server: The server it was last sent to.
        refused: It was refused as not served there (the server lives); False: no answer.
        held: It was refused ``READS_WAITING``: its server is the bucket's primary, its reads
            not open yet (implies ``refused``).
    """

    request: int
    bucket: int
    server: int
    refused: bool
    held: bool = False

    def __post_init__(self) -> None:
        if self.held and not self.refused:  # checked here: a round of held ones is not kept
            raise ValueError(f"request {self.request}: held (READS_WAITING) yet not refused")


@dataclass(frozen=True)
class Unfinished:
    """An exchange ended with ``waiting`` requests unanswered, at ``now``."""

    stimulus_id: str
    waiting: tuple[Waiting, ...]
    now: float


@dataclass(frozen=True)
class MapRead:
    """The map as the client holds it after a read (the read may have failed: then the last
    one): every bucket's primary (None: none), its epoch, and the longest lease (0: unknown)."""

    stimulus_id: str
    primaries: Sequence[int | None]
    epochs: Sequence[int]
    lease_s: float


@dataclass(frozen=True)
class Pinged:
    """``server`` answered a ping (``alive``) or did not."""

    stimulus_id: str
    server: int
    alive: bool


@dataclass(frozen=True)
class MapSettled:
    """The wait of :class:`AwaitMap` ended at ``now``; the map's primaries then."""

    stimulus_id: str
    primaries: Sequence[int | None]
    now: float


# ------------------------------------------------------------------ actions


@dataclass(frozen=True)
class ReadMap:
    """Read the map from etcd (a failure to read is no error: answer with the last map)."""


@dataclass(frozen=True)
class Ping:
    """Ping ``server`` (within :data:`PING_TIMEOUT_S`) and answer :class:`Pinged`."""

    server: int


@dataclass(frozen=True)
class Pause:
    """Sleep ``seconds``."""

    seconds: float


@dataclass(frozen=True)
class AwaitMap:
    """Read the map until each of ``buckets`` has a primary and each bucket in ``away`` has an
    epoch newer than the one given or its time passed (``{bucket: (epoch, until)}``), or the
    ``deadline``; then answer :class:`MapSettled`."""

    buckets: frozenset[int]
    deadline: float
    away: Mapping[int, tuple[int, float]]


@dataclass(frozen=True)
class Resend:
    """Send each request again, with its number and afresh, to its new server
    (``{request: server}``)."""

    servers: Mapping[int, int]


@dataclass(frozen=True)
class Exhausted:
    """Give up: no serving primary for ``buckets`` within the failover time (``server``: the
    first waiting request's last server, to name in the error)."""

    server: int
    buckets: frozenset[int]


# ------------------------------------------------------------------ the state machine

IDLE, READING, PINGING, WAITING = "idle", "reading", "pinging", "waiting"


@dataclass
class Rerouting:
    """The re-routing decisions of one exchange of a client with replicated servers.

    Args:
        deadline: When the exchange gives up (monotonic seconds).

    Phases: ``idle`` (requests out, or none waiting) -> :class:`Unfinished` -> ``reading``
    (:class:`ReadMap`) -> :class:`MapRead` -> ``pinging`` (a :class:`Ping` per primary that did
    not answer) -> :class:`Pinged` each -> ``waiting`` (:class:`AwaitMap`) -> :class:`MapSettled`
    -> ``idle`` with :class:`Resend` (or :class:`Exhausted`). A round of refused requests only
    (nothing to ping) goes from ``idle`` straight to ``waiting`` (a :class:`Pause`, backed off,
    then :class:`AwaitMap`).
    """

    deadline: float
    phase: str = IDLE
    waiting: tuple[Waiting, ...] = ()
    started: float = 0.0
    epochs: Sequence[int] = ()
    lease_s: float = 0.0
    suspects: dict[int, list[int]] = field(default_factory=dict)  # server -> its buckets
    pings: dict[int, bool | None] = field(default_factory=dict)  # server -> answered?
    away: dict[int, tuple[int, float]] = field(default_factory=dict)
    rounds: int = 0
    refusals: int = 0  # rounds in a row re-sent to the server that refused them: the back-off
    last_waiting: int = 0  # how many waited in the last round (fewer now: some were answered)
    _story: deque = field(default_factory=lambda: deque(maxlen=STORY_LENGTH))

    def handle(self, stimulus) -> list:
        """Take one stimulus; the actions the client must carry out, in order."""
        before = self.phase
        if isinstance(stimulus, Unfinished):
            actions = self._unfinished(stimulus)
        elif isinstance(stimulus, MapRead):
            actions = self._map_read(stimulus)
        elif isinstance(stimulus, Pinged):
            actions = self._pinged(stimulus)
        elif isinstance(stimulus, MapSettled):
            actions = self._settled(stimulus)
        else:
            raise TypeError(f"not a re-routing stimulus: {stimulus!r}")
        self._story.append((stimulus.stimulus_id, type(stimulus).__name__, before, self.phase,
                            tuple(type(a).__name__ for a in actions)))  # fmt: skip
        return actions

    def story(self) -> list[tuple]:
        """The latest transitions: ``(stimulus_id, stimulus, phase before, after, actions)``."""
        return list(self._story)

    def validate_state(self) -> None:
        """Raise AssertionError if the machine's state is inconsistent."""
        assert self.phase in (IDLE, READING, PINGING, WAITING), self.phase
        assert 0 <= self.refusals <= MAX_DOUBLINGS, f"back-off exponent {self.refusals}"
        buckets = {w.bucket for w in self.waiting}
        assert self.phase == IDLE or self.waiting, "a round with nothing waiting"
        assert set(self.pings) == set(self.suspects), "a ping of a server not suspected"
        assert set(self.away) <= buckets, "waiting on a bucket no request needs"
        for server, owned in self.suspects.items():
            assert all(
                any(w.server == server and w.bucket == b and not w.refused for w in self.waiting)
                for b in owned
            ), f"server {server} suspected for a bucket none of its requests waits on"
        if self.phase == PINGING:
            assert any(answer is None for answer in self.pings.values()), "pinging: none pending"
        if self.phase != PINGING:
            assert all(answer is not None for answer in self.pings.values()), "a ping pending"

    # ------------------------------------------------------------------ transitions

    def _expect(self, phase: str, stimulus) -> None:
        if self.phase != phase:
            raise ValueError(f"{type(stimulus).__name__} in phase {self.phase!r} (not {phase!r})")

    def _unfinished(self, s: Unfinished) -> list:
        self._expect(IDLE, s)
        if not s.waiting:
            return []
        if all(w.held for w in s.waiting):
            # every one waits at its bucket's primary for its reads to open: the map is current,
            # so the same server gets it again after a pause, with no map read
            self.rounds += 1
            if s.now + READS_WAIT_PAUSE_S > self.deadline:
                return [Exhausted(s.waiting[0].server, frozenset(w.bucket for w in s.waiting))]
            return [Pause(READS_WAIT_PAUSE_S), Resend({w.request: w.server for w in s.waiting})]
        if len(s.waiting) < self.last_waiting:
            self.refusals = 0  # some were answered since the last round: progress, start over
        self.last_waiting = len(s.waiting)
        self.waiting, self.started, self.rounds = tuple(s.waiting), s.now, self.rounds + 1
        self.suspects, self.pings, self.away = {}, {}, {}
        if all(w.refused for w in s.waiting):
            # every server answered (it lives): nobody to ping, so no map read to decide pings;
            # the wait's own read, after the pause, finds where each request goes
            return self._await()
        self.refusals = 0  # a request went unanswered: no refusal, its own (ping) round
        self.phase = READING
        return [ReadMap()]

    def _map_read(self, s: MapRead) -> list:
        self._expect(READING, s)
        self.epochs, self.lease_s = tuple(s.epochs), s.lease_s
        for w in self.waiting:
            # No answer from the primary the map still names: a slow one (busy with its copies)
            # answers a ping on its network thread and gets the request again at once; a dead
            # one is replaced within its lease (and etcd's expiry round).
            if not w.refused and s.primaries[w.bucket] == w.server:
                self.suspects.setdefault(w.server, []).append(w.bucket)
        if not self.suspects:
            return self._await()
        self.pings = dict.fromkeys(self.suspects)
        self.phase = PINGING
        return [Ping(server) for server in self.suspects]

    def _pinged(self, s: Pinged) -> list:
        self._expect(PINGING, s)
        if s.server not in self.pings or self.pings[s.server] is not None:
            raise ValueError(f"server {s.server}: a ping answered that was not asked")
        self.pings[s.server] = s.alive
        if any(answer is None for answer in self.pings.values()):
            return []
        wait = self.lease_s + LEASE_MARGIN_S if self.lease_s else REROUTE_WAIT_S
        for server, alive in self.pings.items():
            if not alive:
                for bucket in self.suspects[server]:
                    self.away[bucket] = (self.epochs[bucket], self.started + wait)
        return self._await()

    def _await(self) -> list:
        self.phase = WAITING
        buckets = frozenset(w.bucket for w in self.waiting)
        wait = AwaitMap(buckets, self.deadline, dict(self.away))
        if self.away:
            return [wait]
        pause = min(REFUSED_PAUSE_S * 2**self.refusals, REFUSED_PAUSE_MAX_S)
        return [Pause(pause), wait]

    def _settled(self, s: MapSettled) -> list:
        self._expect(WAITING, s)
        waiting, self.waiting = self.waiting, ()
        self.suspects, self.pings, self.away = {}, {}, {}
        self.phase = IDLE
        if s.now > self.deadline:
            return [Exhausted(waiting[0].server, frozenset(w.bucket for w in waiting))]
        servers = {}
        for w in waiting:
            primary = s.primaries[w.bucket]
            servers[w.request] = 0 if primary is None else primary
        # every one refused by the server the map still names, and sent there again: that
        # server is not ready (catching its copies up, short of min_copies), so the next
        # round pauses twice as long; a map that moved may have a ready server: start over
        again = all(w.refused and s.primaries[w.bucket] == w.server for w in waiting)
        self.refusals = min(self.refusals + 1, MAX_DOUBLINGS) if again else 0
        return [Resend(servers)]
