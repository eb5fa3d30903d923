"""A deterministic simulation of the replicated parameter server: a seed makes a schedule.

A :class:`World` holds ``n`` :class:`~hogwild_plugins.ps.simulation.server.SimServer` s (the real
state machines), clients that push ``(sender, seq)`` updates and keep a ledger of what was
acknowledged, the :class:`~hogwild_plugins.ps.simulation.etcd.SimEtcd`, and a network of messages
in flight. Each step, a seeded random choice among what can happen next
(:mod:`~hogwild_plugins.ps.simulation.draw` draws it; the world makes it happen): a server's
replication thread runs to its next blocking point, a message is delivered (any of those in flight:
they are reordered), dropped or duplicated, a copy that does not answer is given up on (the peer
timeout), a client sends or re-sends (a pull its server answered ``READS_WAITING``, serving but
inside its wait for reads, goes again to that server with no map read, as the real client's held
path: ``Client.held``), the clock ticks (heartbeats, leases expire), a server is paused (SIGSTOP) or
resumed, killed or restarted (on its store, if it has one: the newest epoch of each bucket's record
it saw outlives it), a lease is ended early (the driver's ``revoked/<i>`` marker, then, at a drawn
delay, its revoke, not sent once it is too late: the lease lapses; a server whose map read finds
the marker naming a lease its process held stops, as the real one exits 2, and is taken away as
a dead process: a restart is a new incarnation), etcd is wiped. Besides
these choices, an update's application on a server may fail (``fail``: a rare draw for each
application, from a generator of its own seeded by the seed, so that the choices a seed makes
are the same with it or without it): the server stops the bucket, as the real one does. And a
copy's network thread may take a while to read a primary's message past its gate (``split``:
a rare draw per message, from a generator of its own too): its replication thread runs a few
steps before the message's content is taken, and nothing else reaches that network thread
meanwhile; and a record a server writes may be read back in a step of its own (the same draw).
Opt-in (not in :data:`FAULTS`, so that every seed's schedule stays what it was without them):
``unbuilt`` (a primary's parcel not taken) and ``cut``, a server's host off the network with both
sides alive: the messages from and to it wait (in TCP's buffers) until it is back, its heartbeat
fails, its reads of the map fail (its replication thread goes on to its batch), and a record
write waits and reaches etcd once the link returns (its answer read as usual).

After every step the world asks its :class:`~hogwild_plugins.ps.simulation.invariants.Invariants`
(:meth:`World.check`), which it feeds what its clients and faults see, whether the job's
invariants still hold (every acknowledged update kept, one primary acknowledging per bucket and
epoch, ...), besides every machine's own ``validate_state``. A violation raises
:class:`Violation` carrying the whole schedule and every server's stories, so that a failing seed
explains itself (:func:`run_seed` replays one).
"""

from __future__ import annotations

import functools
import pickle
import random
from dataclasses import dataclass, field

from hogwild_plugins.ps.failover import REVOKED_TTLS
from hogwild_plugins.ps.simulation.draw import FAULTS, EventDraw
from hogwild_plugins.ps.simulation.etcd import SimEtcd
from hogwild_plugins.ps.simulation.invariants import Broken, Invariants
from hogwild_plugins.ps.simulation.messages import Exchange, Peer
from hogwild_plugins.ps.simulation.server import SimServer
from hogwild_plugins.ps.simulation.store import SimStore

__all__ = ["Client", "Config", "Violation", "World", "established", "run_seed"]

FAIL_RATE = 0.01  # of the applications of an update on a server (a seed in thirty or so)
SPLIT_RATE = 0.02  # of the primaries' messages past a copy's gate
SPLIT_STEPS = 4  # at most this many of the replication thread's steps before the content
UNBUILT_RATE = 0.2  # of the parcels a primary takes, with the opt-in fault "unbuilt"
REVOKE_DRAW_TTLS = 2  # a revoke is drawn as late as -this x TTL (at once) .. past too late
FULL_CHECK = frozenset(
    {"tick", "kill", "restart", "expire", "revoke", "wipe"}
)  # may change every server


class Violation(AssertionError):
    """An invariant broken: the message names it, then the schedule and the stories."""


@dataclass
class Client:
    """A client pushing one update at a time, re-sending it until it is acknowledged."""

    sender: int
    seq: int = 0
    outstanding: tuple[int, int] | None = None  # (seq, shard)
    ledger: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # -> (shard, v)
    reads: dict[int, list] = field(default_factory=dict)  # shard -> [(served at, updates read)]
    # a pull answered READS_WAITING, (server, shard, expected): sent again to that server, with
    # no map read, as the real client does (routing's held path)
    held: tuple[int, int, frozenset] | None = None


@dataclass(frozen=True)
class Config:
    """The simulated job: servers, copies, buckets and their shards, clients, lease TTL, and
    how many servers have a store (the first ``stores``; the others keep nothing across a
    restart), and whether the driver's revokes come back late (drawn; False: each at once
    with its marker, as the simulator had it before they came apart, which replays the seeds
    found then). ``ttls``: each server's own lease TTL (as ``ps serve --lease-s`` may give
    servers different ones; empty: every server's is ``ttl``). ``replaced_stops``: whether a
    server whose map read finds ``revoked/<i>`` naming a lease its process held stops, as the
    real one exits 2 (False: it goes on and registers again, as the simulator had it before the
    stop was modelled, which replays the seeds found then, and stands for a holder whose
    replication thread reads no map while the driver revokes it)."""

    servers: int = 3
    copies: int = 3
    min_copies: int = 2
    bucket_shards: tuple[tuple[int, ...], ...] = ((0,), (1, 2))
    clients: int = 2
    ttl: int = 10
    settle: int = 4
    stores: int = 2
    late_revokes: bool = True
    ttls: tuple[int, ...] = ()
    replaced_stops: bool = True

    def __post_init__(self) -> None:
        if self.ttls and (
            len(self.ttls) != self.servers
            or not all(isinstance(t, int) and t >= 1 for t in self.ttls)
        ):
            raise ValueError(
                f"Config.ttls must give each of the {self.servers} servers a lease TTL of whole "
                f"ticks >= 1 (or be empty), got {self.ttls!r}"
            )

    def ttl_of(self, server: int) -> int:
        """Server ``server``'s lease TTL (ticks)."""
        return self.ttls[server] if self.ttls else self.ttl

    @property
    def longest_ttl(self) -> int:
        """The longest of the servers' lease TTLs (ticks)."""
        return max(self.ttls) if self.ttls else self.ttl


class World:
    """One seeded run (see the module docstring)."""

    def __init__(self, seed: int, config: Config = Config(), faults=FAULTS) -> None:
        self.seed, self.config, self.faults = seed, config, frozenset(faults)
        self.rng = random.Random(seed)
        self.failures = random.Random(f"fail {seed}")  # draws whether an application fails
        self.splits = random.Random(f"split {seed}")  # draws how long a message's read lasts
        self.unbuilts = random.Random(f"unbuilt {seed}")  # draws whether a parcel is not taken
        self.time = 0
        self.etcd = SimEtcd(config.servers, len(config.bucket_shards))
        self.bucket_shards = {b: list(s) for b, s in enumerate(config.bucket_shards)}
        self.bucket_of = {s: b for b, shards in self.bucket_shards.items() for s in shards}
        self.network: list[tuple[object, object]] = []  # (destination, message)
        self.incarnations = [0] * config.servers
        self.stores = {i: SimStore() for i in range(min(config.stores, config.servers))}
        self.cut: set[int] = set()  # the servers whose host is off the network ("cut")
        # the driver's early ends under way: server -> (its lease, the marker's, marked at, the
        # tick its revoke comes back at: drawn, from a generator of its own as ``fail``'s)
        self.revoking: dict[int, tuple[int, int, int, int]] = {}
        self.revokes = random.Random(f"revoke {seed}")
        self.servers: dict[int, SimServer | None] = {}
        for i in range(config.servers):
            self.servers[i] = self._start(i)
        self.clients = [Client(sender=100 + c) for c in range(config.clients)]
        self.draw = EventDraw(config.servers, config.clients)  # which event comes next
        self.schedule: list[str] = []
        self.counts = {
            "acknowledged": 0, "faults": 0, "died_with_every_copy": 0, "failed_applications": 0,
            "split_messages": 0, "parcels_not_built": 0, "replaced_stops": 0,
            "died_with_a_stop": 0,  # of died_with_every_copy: acknowledged, gone with a stop
        }  # fmt: skip
        self.invariants = Invariants(self.servers, self.etcd, self.bucket_shards, config.min_copies)
        self.touched: set[int] = set()  # the servers a step changed (their machines checked)
        self.full_checks = False  # check everything after every step, not only what it touched
        self._settled_turn: dict[int, int] = {}  # settle(): when each server last took its turn
        self._settled_turns = 0

    # ------------------------------------------------------------------ processes

    def _start(self, i: int) -> SimServer:
        self.incarnations[i] += 1
        c = self.config
        server = SimServer(
            i, self.incarnations[i], self.bucket_shards, c.copies, c.min_copies, self.etcd,
            functools.partial(self._post, i, self.incarnations[i]), self._now, c.ttl_of(i),
            c.settle,
            self._application_fails, self.stores.get(i), self._split, self._parcel_unbuilt,
            c.replaced_stops,
        )  # fmt: skip
        server.register()
        return server

    def _post(self, src: int, incarnation: int, dst, body) -> None:
        self.network.append((dst, (src, incarnation, body)))

    def _now(self) -> int:
        return self.time

    def _application_fails(self, what: str) -> bool:
        """Whether an update's application fails: a draw, whichever it is (``what`` names it,
        for a test's own ``fails`` to pick by; the stop it makes is in the schedule)."""
        if "fail" not in self.faults or self.failures.random() >= FAIL_RATE:
            return False
        self.counts["faults"] += 1
        self.counts["failed_applications"] += 1
        return True

    def _split(self, what: str) -> int:
        """How many of its replication thread's steps a copy's network thread takes to read a
        primary's message past the gate, or whether a record written is read back in a step of
        its own (``what`` names which): 0 mostly; a draw, whichever it is."""
        if "split" not in self.faults or self.splits.random() >= SPLIT_RATE:
            return 0
        self.counts["faults"] += 1
        self.counts["split_messages"] += 1
        return self.splits.randint(1, SPLIT_STEPS)

    def _parcel_unbuilt(self, what: str) -> bool:
        """Whether a primary's parcel for a ``Sync`` cannot be taken (the engine's barrier timed
        out, its queues full): only with the fault ``unbuilt``, which is not among
        :data:`FAULTS` (its draws would change every seed's schedule); a draw."""
        if "unbuilt" not in self.faults or self.unbuilts.random() >= UNBUILT_RATE:
            return False
        self.counts["faults"] += 1
        self.counts["parcels_not_built"] += 1
        return True

    def live(self) -> list[SimServer]:
        return [s for s in self.servers.values() if s is not None]

    # ------------------------------------------------------------------ a step

    def step(self) -> None:
        """One seeded choice among what can happen now
        (:mod:`~hogwild_plugins.ps.simulation.draw`), then the invariants."""
        self.apply(self.draw.next(self, self.rng))

    def apply(self, event: tuple) -> None:
        """Make ``event`` happen (a step's choice, or a test's script), then the invariants."""
        self.touched = set(range(self.config.servers)) if event[0] in FULL_CHECK else set()
        try:
            self.schedule.append(self._do(event))
            for s in self.live():  # what a server said in the step (a bucket it stopped)
                if s.notes:
                    self.schedule += [f"    {note}" for note in s.notes]
                    s.notes.clear()
        except Broken as exc:  # what a client was answered broke an invariant
            raise self.violation(str(exc)) from None
        self.check(full=self.full_checks)

    def quiet(self) -> bool:
        """Nothing under way: no message in flight, every replication thread waiting for news."""
        return not self.network and not any(
            s.runnable() or s.waiting is not None or s.snapshots.sending for s in self.live()
        )

    def settle(self, limit: int = 500, turns: bool = False) -> None:
        """Run the threads and deliver the messages, in a fixed order and with no fault, until
        nothing is under way (or ``limit`` steps): the first server ready runs, or, with
        ``turns``, the servers ready take turns (the one that ran longest ago first). A healing
        world takes turns: real threads run side by side, so one server that always has a step
        to take (a primary re-sending a snapshot that a stale primary refuses) must not keep the
        others, the stale one among them, from ever reading the map. The established start
        keeps the fixed order (every seed's schedule starts from it)."""
        for _ in range(limit):
            for n, (dst, message) in enumerate(self.network):
                if not self._to_paused(dst) and not self._severed(dst, message[0]):
                    # a paused server's messages wait in its socket, a cut host's in TCP's
                    self.apply(("deliver", n))
                    break
            else:
                ready = [s.me for s in self.live() if not s.paused and s.runnable()]
                if not ready:
                    return
                turn = (
                    min(ready, key=lambda me: self._settled_turn.get(me, -1)) if turns else ready[0]
                )
                self._settled_turn[turn] = self._settled_turns
                self._settled_turns += 1
                self.apply(("run", turn))

    def _to_paused(self, dst) -> bool:
        """Whether a message to ``dst`` (a server, a primary's exchange, a client) would wait
        for a paused server, or for a network thread still reading a primary's message."""
        if isinstance(dst, tuple):
            if dst[0] != "server":
                return False
            if dst[1] in self.cut:
                return True
            server = self.servers[dst[1]]
            return server is not None and server.paused
        server = self.servers[dst]
        return server is not None and (server.paused or server.reading is not None)

    def _do(self, event: tuple) -> str:
        kind = event[0]
        if kind == "run":
            s = self.servers[event[1]]
            self.touched.add(s.me)
            line = f"{self.time}: server {s.me} runs, then waits on: {s.step()}"
            if s.stopped is not None:
                line += self._stop(s)
            return line
        if kind == "timeout":
            s = self.servers[event[1]]
            s.give_up(event[2])
            return f"{self.time}: server {s.me} gives up on server {event[2]} (peer timeout)"
        if kind in ("deliver", "drop", "duplicate"):
            dst, message = self.network[event[1]]
            if kind == "drop":
                del self.network[event[1]]
                return f"{self.time}: dropped to {dst}: {self._describe(message)}"
            if kind == "duplicate":
                self.network.append((dst, message))
                return f"{self.time}: duplicated to {dst}: {self._describe(message)}"
            del self.network[event[1]]
            return f"{self.time}: delivered to {dst}: {self._describe(message)}" + self._deliver(
                dst, message
            )
        if kind == "resend held":
            client = self.clients[event[1]]
            (server, shard, expected), client.held = client.held, None
            self.network.append((server, (None, 0, ("PULL", client.sender, shard, expected))))
            return f"{self.time}: client {client.sender} pulls shard {shard} again from {server}"
        if kind == "send":
            return f"{self.time}: " + self._send(self.clients[event[1]])
        if kind == "pull":
            return f"{self.time}: " + self._pull(self.clients[event[1]])
        if kind == "tick":
            self.time += 1
            gone = self.etcd.expire(self.time)
            for s in self.live():
                if not s.paused:
                    s.beat()
            # the driver's revokes due now, after the beats (the holder renewed up to them)
            due = [i for i, (*_, at) in self.revoking.items() if at <= self.time]
            revoked = "".join(self._revoke(i) for i in due)
            return (
                f"{self.time}: tick"
                + (f", leases {[hex(g) for g in gone]} expired" if gone else "")
                + revoked
            )
        self.counts["faults"] += 1
        i = event[1] if len(event) > 1 else None
        if kind == "pause":
            self.servers[i].paused = True
            return f"{self.time}: server {i} paused"
        if kind == "resume":
            self.servers[i].paused = False
            return f"{self.time}: server {i} resumed"
        if kind == "cut":
            self.cut.add(i)
            self.servers[i].cut_off = True
            return f"{self.time}: server {i}'s host is cut off (both sides alive)"
        if kind == "heal":
            self.cut.discard(i)
            self.servers[i].cut_off = False
            return f"{self.time}: server {i}'s host is back on the network"
        if kind == "kill":
            self.cut.discard(i)  # a restarted process comes back on the network
            dead, self.servers[i] = self.servers[i], None
            gone = self.invariants.killed(i, dead)
            self.counts["died_with_every_copy"] += len(gone)
            return f"{self.time}: server {i} killed" + (f"; {gone} died with it" if gone else "")
        if kind == "restart":
            self.servers[i] = self._start(i)
            return f"{self.time}: server {i} restarted (incarnation {self.incarnations[i]})"
        if kind == "expire":  # the driver ending a server's lease it lost: marked first
            lease = self.servers[i].lease
            ttl = self.config.ttl_of(i)
            marker = self.etcd.mark(i, lease, ttl, self.time)
            if marker is None:
                return f"{self.time}: server {i}'s lease is gone already"
            # at once half the time (as before the marker's renewal), else up to past the
            # time the driver still sends it: then never
            late = self.revokes.randrange(-REVOKE_DRAW_TTLS * ttl, self._too_late(i) + 1)
            late = late if self.config.late_revokes else 0
            self.revoking[i] = (lease, marker, self.time, self.time + max(0, late))
            if late > 0:
                return (
                    f"{self.time}: server {i}'s lease marked revoked, its revoke {late} ticks late"
                )
            return f"{self.time}: server {i}'s lease marked revoked" + self._revoke(i)
        if kind == "revoke":  # a scripted schedule's: the revoke comes back now, if still due
            return f"{self.time}: " + (
                self._revoke(i)[2:] if i in self.revoking else "no revoke due"
            )
        assert kind == "wipe"
        self.etcd.wipe()
        self.revoking.clear()  # the leases are gone: the driver's revokes find nothing
        self.invariants.wiped(self.incarnations)
        return f"{self.time}: etcd wiped"

    def _stop(self, server: SimServer) -> str:
        """``server`` stopped itself (its map read found its lease revoked by the driver, which
        replaces it: the real process exits 2): taken away as a dead process, its store kept;
        what happened, for the schedule. Taken away at once, as the real one refuses every
        primary's message from that read on (``REPLACED``); its final flush writes its shards
        to its store, but no bucket resumes from a store, so what only it held is gone as with
        a kill (counted apart: ``died_with_a_stop``)."""
        i = server.me
        self.cut.discard(i)  # a process started again comes back on the network
        self.servers[i] = None
        self.touched = set(range(self.config.servers))  # as a kill: who lives changed
        self.counts["replaced_stops"] += 1
        gone = self.invariants.killed(i, server)
        self.counts["died_with_every_copy"] += len(gone)
        self.counts["died_with_a_stop"] += len(gone)
        return "; it stopped (replaced)" + (f"; {gone} died with it" if gone else "")

    def _too_late(self, i: int) -> int:
        """The first delay of a revoke of server ``i``'s lease after its marker that the
        driver no longer sends."""
        return REVOKED_TTLS * self.config.ttl_of(i) + 1

    def _revoke(self, i: int) -> str:
        """Server ``i``'s revoke, due now: sent if the driver is still in time (its marker then
        renewed), else not (the lease lapses by itself); what happened, for the schedule."""
        lease, marker, marked, _ = self.revoking.pop(i)
        if self.time - marked >= self._too_late(i):
            return f"; server {i}'s revoke too late to send: its lease lapses"
        self.etcd.revoke_marked(lease, marker, self.time)
        return f"; server {i}'s lease revoked early"

    def _severed(self, dst, src) -> bool:
        """Whether a message from ``src`` to ``dst`` waits for a cut host to come back (its
        bytes sit in TCP's buffers: they arrive once the link returns, late)."""
        if src in self.cut:
            return True
        if isinstance(dst, tuple):
            return dst[0] == "server" and dst[1] in self.cut
        return dst in self.cut

    def _deliver(self, dst, message) -> str:
        src, incarnation, body = message
        if self.cut and self._severed(dst, src):
            self.network.append((dst, message))
            return " (waits: a host on its way is cut off)"
        if isinstance(dst, tuple) and dst[0] == "client":
            return self._reply(self.clients[dst[1] - 100], body)
        if isinstance(dst, tuple):  # a copy's answer to a primary's exchange
            _, me, wanted = dst
            server = self.servers[me]
            self.touched.add(me)
            if server is None or server.incarnation != wanted:
                return " (lost: that process is gone)"
            if server.paused:
                self.network.append((dst, message))  # it waits in the socket
                return " (waits: the server is paused)"
            exchange, index, answer = body
            server.answered(exchange, index, answer)
            return ""
        server = self.servers[dst]
        self.touched.add(dst)
        if server is None:
            return " (lost: the server is down)"
        if server.paused:
            self.network.append((dst, message))
            return " (waits: the server is paused)"
        if server.reading is not None:
            self.network.append((dst, message))
            return " (waits: its network thread still reads a message)"
        if isinstance(body[0], Exchange):  # a primary's message to this copy
            exchange, index, peer = body
            to, me = ("server", src, incarnation), server.incarnation

            def reply(answer: tuple[str, int]) -> None:
                self.invariants.answered(server, peer, answer)
                self.network.append((to, (dst, me, (exchange, index, answer))))

            return server.handle_peer(peer, reply)
        if body[0] == "PULL":  # answered by the serving primary past its wait for reads
            _, sender, shard, expected = body
            refused = server.refusal(shard, "PULL")
            if refused is None and not server.answers_reads(shard):
                # serving, inside its wait for reads: told so, the client holds the pull for
                # this server (the real adapter's READS_WAITING); else it reads the map anew
                refused = "READS_WAITING" if server.serving(shard) else "NOT_PRIMARY"
            if refused == "READS_WAITING":
                waiting = (refused, dst, shard, expected)
                self.network.append((("client", sender), (dst, server.incarnation, waiting)))
            if refused:
                return f" -> {refused}"
            read = ("READ", shard, len(self.schedule), frozenset(server.values[shard]), expected)
            self.network.append((("client", sender), (dst, server.incarnation, read)))
            return f" -> {sorted(read[3])}"
        sender, seq, shard = body  # a client's push
        refused = server.submit(sender, seq, shard)
        if refused:
            reply = (dst, server.incarnation, (refused, seq, shard, 0))
            self.network.append((("client", sender), reply))
            return f" -> {refused}"
        return " -> queued"

    def _pull(self, client: Client) -> str:
        shard = self.rng.choice(list(self.bucket_of))
        record = self.etcd.record(self.bucket_of[shard])
        if record is None:
            return f"client {client.sender} finds no primary for shard {shard}"
        mine = frozenset(k for k, (s, _) in client.ledger.items() if s == shard)
        self.network.append((record.primary, (None, 0, ("PULL", client.sender, shard, mine))))
        return f"client {client.sender} pulls shard {shard} from {record.primary}"

    def _reply(self, client: Client, body) -> str:
        if body[0] == "READ":
            _, shard, served, values, expected = body
            self.invariants.read(client.sender, shard, served, values, expected, client.reads)
            return ""
        if body[0] == "READS_WAITING":
            _, server, shard, expected = body
            client.held = (server, shard, expected)
            return ""
        code, seq, shard, version = body
        if code != "ACK":
            return ""
        self.invariants.acknowledged(client.sender, seq, shard, version, client.ledger)
        self.counts["acknowledged"] += 1
        if client.outstanding == (seq, shard):
            client.outstanding = None
        return ""

    def _send(self, client: Client) -> str:
        if client.outstanding is None:
            client.seq += 1
            client.outstanding = (client.seq, self.rng.choice(list(self.bucket_of)))
        seq, shard = client.outstanding
        record = self.etcd.record(self.bucket_of[shard])
        if record is None:
            return f"client {client.sender} finds no primary for shard {shard}"
        self.network.append((record.primary, (None, 0, (client.sender, seq, shard))))
        return (
            f"client {client.sender} sends ({client.sender}, {seq}) of shard {shard} "
            f"to {record.primary}"
        )

    @staticmethod
    def _describe(message) -> str:
        src, incarnation, body = message
        if isinstance(body[0], Exchange):
            _, index, what = body
            if isinstance(what, Peer):
                item = what.item if what.kind == "PREPARE" else ""
                if what.kind == "SNAPSHOT":
                    item = f"values {list(what.item[0])} table {list(what.item[1])}"
                if what.kind == "CATCHUP":
                    item = f"holding v{what.version} of epoch {what.log_epoch}"
                return (
                    f"{what.kind} shard {what.shard} v{what.version} epoch {what.epoch} "
                    f"from {src} {item}"
                )
            return f"answer {what} from {src}"
        return f"{body} from {src}"

    # ------------------------------------------------------------------ invariants

    def violation(self, what: str) -> Violation:
        lines = [f"seed {self.seed}: {what}", "schedule:"]
        lines += [f"  {n}: {e}" for n, e in enumerate(self.schedule)]
        lines.append("stories:")
        lines += [s.stories() for s in self.live()]
        lines.append(f"etcd: {self.etcd.keys}")
        return Violation("\n".join(lines))

    def check(self, full: bool = False) -> None:
        """Every touched machine's own invariants, then the job's (:meth:`Invariants.check
        <hogwild_plugins.ps.simulation.invariants.Invariants.check>`: after a step, only what
        it can have changed). ``full`` checks everything, as if everything had changed: each
        seed ends with it, and a test holds the incremental check to finding every violation at
        the step the full one does."""
        if full:
            self.touched = set(range(self.config.servers))
        try:
            self.invariants.check(self.touched, full)
        except Broken as exc:
            raise self.violation(str(exc)) from None


_ESTABLISHED: dict[Config, tuple[bytes, dict[str, tuple]]] = {}
# The world's generators, kept beside its pickle as their states: a generator's state pickles as
# 625 integers, slower to read back than to set on a new generator.
_GENERATORS = ("rng", "failures", "splits", "unbuilts", "revokes")


def established(config: Config = Config()) -> World:
    """A world whose buckets all have a serving primary and every copy in sync: the fault-free
    start of every job, run once per configuration and copied for each seed after."""
    if config not in _ESTABLISHED:
        world = World(-1, config, ())
        world.settle()
        while not all(any(s.roles[b].serving for s in world.live()) for b in world.bucket_shards):
            world.apply(("tick",))
            world.settle()
        world.schedule.append("(the established start ends here)")
        for server in world.live():  # its stories start afresh in each copy (cheaper to copy)
            for machine in (*server.roles.values(), server.copy_side, server.commit_round):
                machine.transitions.clear()
        states = {name: getattr(world, name).getstate() for name in _GENERATORS}
        for name in _GENERATORS:
            setattr(world, name, None)
        _ESTABLISHED[config] = pickle.dumps(world), states
    frozen, states = _ESTABLISHED[config]
    world = pickle.loads(frozen)
    for name, state in states.items():
        generator = random.Random(0)
        generator.setstate(state)
        setattr(world, name, generator)
    return world


def run_seed(
    seed: int, steps: int = 60, config: Config = Config(), faults=FAULTS, cold: bool | None = None
) -> World:
    """Run one seeded schedule of ``steps`` steps, checked after each step and fully at the end;
    the world (raises :class:`Violation`). ``cold``: from servers that just started (a tenth of
    the seeds by default), else from the established start (:func:`established`), where the
    faults bite sooner."""
    if cold is None:
        cold = seed % 10 == 0
    if cold:
        world = World(seed, config, faults)
    else:
        world = established(config)
        world.seed, world.faults, world.rng = seed, frozenset(faults), random.Random(seed)
        world.failures = random.Random(f"fail {seed}")
        world.splits = random.Random(f"split {seed}")
        world.unbuilts = random.Random(f"unbuilt {seed}")
    for _ in range(steps):
        world.step()
    world.check(full=True)
    return world
