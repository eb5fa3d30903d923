"""The receiving end of a partitioned replica's link between hosts: frames into arena rows.

Each host group's parent binds one PULL socket at its address (``model.partition_hosts``) and runs
a :class:`Receiver` thread on it; every sender (a partition process, a parent) holds one PUSH
socket per other group (:class:`~hogwild.partition.sending.Outbox`). Beyond loopback both ends
use CURVE with the job's key directory (``cluster.keys``; the ZAP handler admits its authorised
clients only). With the job's roster (a key pair per role: a spread replica's link) the ZAP
handler admits every role of the job, so the receiver also checks who sent each message: the
roster role of the host group the message comes from (``senders``), else it is refused and
counted as forged.

The receiver reads each payload frame straight into the
row it belongs in (``recv_into``) and then advances the row's counter, exactly as a partition on
this host would after writing it (:mod:`hogwild.partition.process`): the partitions here cannot
tell a slice that came over the network from one written next door. Frames of an example that
arrive before the example itself (another sender's socket overtook the feeder's) wait in memory
until its LOAD. Every field is checked (:mod:`hogwild.partition.frames`); a message that fails is
dropped and counted, never applied.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict

import numpy as np
import zmq

from hogwild.config.checks import PARTITION_BEAT_S
from hogwild.net.address import check_bind, parse_address
from hogwild.partition import frames as fr
from hogwild.partition.hosts import LEADER, HostGroups
from hogwild.partition.plan import PartitionPlan
from hogwild.partition.process import (
    DONE,
    GEN,
    STAT_CORRECT,
    STAT_EXAMPLES,
    STAT_LOSS,
    bwd_column,
    fwd_column,
    slot_width,
)
from hogwild.partition.sending import Outbox, zmq_context

log = logging.getLogger(__name__)

POLL_MS = 50
ROUNDS = (fr.FLUSH, fr.FLUSHED, fr.FETCH, fr.FETCHED)
BEAT_S = PARTITION_BEAT_S  # a host unheard for model.partition_silence_s is lost


def bind_receiver(address: str, keys: str | None):
    """A PULL socket bound at ``address`` (CURVE server when ``keys``); returns ``(socket,
    security)`` (``security``: the ZAP handler to close with it, or None)."""
    from hogwild.net.auth import secure_server

    where = parse_address(address)
    check_bind(where, keys)
    sock = zmq_context().socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    security = None
    try:
        if keys:
            security = secure_server(zmq_context(), sock, keys)
        sock.bind(where.endpoint)
    except BaseException:
        sock.close(0)
        if security is not None:
            security.close()
        raise
    return sock, security


def rows_of(plan: PartitionPlan, partitions) -> list[tuple[int, int]]:
    """The parameter rows of ``partitions``, in order."""
    return [r for p in partitions for r in plan.param_rows(p)]


def gather_rows(vector: np.ndarray, rows) -> np.ndarray:
    return np.concatenate([vector[a:b] for a, b in rows]) if rows else vector[:0].copy()


def scatter_rows(values: np.ndarray, vector: np.ndarray, rows) -> None:
    at = 0
    for a, b in rows:
        vector[a:b] = values[at : at + b - a]
        at += b - a


class Receiver:
    """One host group's link thread: applies the partitions' blocks to this host's arena,
    records the parents' messages for the parent (:attr:`ready`, :attr:`rows`, :attr:`beats`,
    :attr:`failed`, :attr:`asked`, :attr:`stop`), and beats to the groups this one answers to
    (the leader to its followers, a follower to the leader) from a socket of its own, so that a
    parent busy evaluating or writing a checkpoint still sounds alive."""

    def __init__(
        self,
        sock,
        security,
        plan: PartitionPlan,
        groups: HostGroups,
        group: int,
        arena,
        n_slots: int,
        mean: float,
        std: float,
        keys: str | None = None,
        roles=(),
        senders=(),
    ):
        self.keys, self.roles = keys, tuple(roles)
        self.senders = tuple(senders)
        if security is not None and security.roles and len(self.senders) != groups.n_groups:
            raise ValueError(
                f"a link receiver under the job's roster needs each of the {groups.n_groups} host "
                f"groups' sender role, got {self.senders!r}"
            )
        self.sock, self.security = sock, security
        self.plan, self.groups, self.group = plan, groups, group
        self.arena, self.n_slots = arena, n_slots
        self.mean, self.std = mean, std
        self.expect = fr.Expect(
            plan.k, n_slots, len(plan.boundaries), group, groups.group_of, plan.network.n_classes
        )
        # what may wait for its LOAD: one example a slot, each of its messages once
        self.max_pending = (n_slots, plan.k * (2 * len(plan.boundaries) + 1))
        self.width = slot_width(len(plan.segments))
        self.act, self.dact = arena.array("act"), arena.array("dact")
        self.sync, self.stats = arena.array("sync"), arena.array("stats")
        self.slot_label, self.slot_loss = arena.array("slot_label"), arena.array("slot_loss")
        self.params, self.velocity = arena.array("params"), arena.array("velocity")
        self.slot_lr = arena.array("slot_lr")
        self.input_size = plan.network.input_size
        self.slot_gen = [0] * n_slots  # a follower's: the example each slot holds
        self.pending: dict[tuple[int, int], list] = defaultdict(list)
        self.lock = threading.Lock()
        self.ready: set[int] = set()
        self.rows: dict[int, int] = {}  # group: the last rows request it answered
        now = time.monotonic()
        self.beats = dict.fromkeys(range(groups.n_groups), now)
        self.failed: str | None = None
        self.asked = 0  # a follower: the leader's last rows request
        # a cluster replica's rounds: per kind, per sender, the last request (FLUSH, FETCH: at a
        # follower, from the leader) or answer (FLUSHED, FETCHED: at the leader, per follower)
        self.rounds: dict[int, dict[int, int]] = {kind: {} for kind in ROUNDS}
        # the leader: the request of each kind its followers must answer now (0: none asked)
        self.awaiting = {fr.FLUSHED: 0, fr.FETCHED: 0}
        # a follower: the last round its partitions flushed (the parent sets it), and the LOADs
        # taken in all and by the last FLUSH (a FETCH is taken only when idle and flushed)
        self.flushed_round = 0
        self.loads = self.loads_at_flush = 0
        self.stop = False
        self.refused = 0
        self.forged: dict[str, int] = defaultdict(int)  # by sender role: refused as misaddressed
        self.blocks = 0  # the partitions' messages taken (FORWARD, BACKWARD, DONE, LOAD)
        self.broken: str | None = None  # why this thread ended early
        self._quit = threading.Event()
        self.thread = threading.Thread(target=self._run, name="partition-link", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self._quit.set()
        self.thread.join()
        self.sock.close(0)
        self.sock = None
        if self.security is not None:
            self.security.close()
            self.security = None
        self.act = self.dact = self.sync = self.stats = self.params = self.velocity = None
        self.slot_label = self.slot_loss = self.slot_lr = None
        self.pending.clear()

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        if self.group == LEADER:
            targets = [g for g in range(self.groups.n_groups) if g != LEADER]
        else:
            targets = [LEADER]
        beats = None
        try:
            beats = Outbox(self.groups.addresses, targets, self.keys, self.roles)
            self._serve(beats, targets)
        except Exception as exc:  # the parent stops the job saying so, rather than stalling
            self.broken = (
                f"the link's receiver at {self.groups.addresses[self.group]} failed: {exc!r}"
            )
            log.exception("partition link: the receiver failed")
        finally:
            if beats is not None:
                beats.close()

    def _serve(self, beats: Outbox, targets) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        beat = fr.encode(fr.BEAT, self.group, a=self.group)
        last_beat = 0.0
        while not self._quit.is_set():
            now = time.monotonic()
            if now - last_beat > BEAT_S:
                last_beat = now
                for g in targets:
                    beats.send(g, beat)
            if not poller.poll(POLL_MS):
                continue
            while not self._quit.is_set():
                try:
                    first = self.sock.recv(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                try:
                    self._take(first)
                except fr.FrameError as exc:
                    self.refused += 1
                    log.warning("partition link: refused a message: %s", exc)
                self._drain()

    def _more(self) -> bool:
        return bool(self.sock.getsockopt(zmq.RCVMORE))

    def _drain(self) -> None:
        while self._more():
            self.sock.recv()

    def _last(self, what: str) -> None:
        """Refuse a message with frames beyond the planned ones (before anything is applied)."""
        if self._more():
            raise fr.FrameError(f"{what}: more frames than planned")

    def _into(self, view: np.ndarray, what: str) -> None:
        """The next payload frame, read into ``view`` (exactly its size)."""
        if not self._more():
            raise fr.FrameError(f"{what}: a payload frame is missing")
        n = self.sock.recv_into(view)
        if n != view.nbytes:
            raise fr.FrameError(f"{what}: a frame of {n} bytes, expected {view.nbytes}")

    def _from_group(self, h: fr.Header) -> int:
        """The host group a (checked) message says it comes from."""
        if h.kind in (fr.FORWARD, fr.BACKWARD, fr.LOAD, fr.DONE):
            return self.groups.group_of[h.source]
        if h.kind in (fr.SETUP, fr.ROWS_ASK, fr.STOP, fr.FLUSH, fr.FETCH):
            return LEADER
        return h.source

    def _check_sender(self, first, h: fr.Header) -> None:
        """Under the job's roster, refuse a message whose sender is not the role of the group
        it comes from (every role of the job may connect; only the replica's own may speak)."""
        if self.security is None or not self.security.roles:
            return
        from hogwild.net.auth import sender_role

        role, expected = sender_role(first), self.senders[self._from_group(h)]
        if role != expected:
            if role in self.forged or len(self.forged) < 64:  # a bounded table
                self.forged[role] += 1
            raise fr.FrameError(
                f"{fr.KIND_NAMES[h.kind]} from {role or 'a key of no role'}: only {expected} "
                "sends it here"
            )

    def _take(self, first) -> None:
        h = fr.decode(first if isinstance(first, bytes) else first.bytes)
        self.expect.check(h)
        self._check_sender(first, h)
        kind = h.kind
        if kind in (fr.BEAT, fr.READY, fr.ROWS_ASK, fr.STOP, fr.DONE, *ROUNDS):
            self._last(fr.KIND_NAMES[kind])
        if kind in (fr.FORWARD, fr.BACKWARD, fr.DONE):
            self._block(h)
            self.blocks += 1
        elif kind == fr.LOAD:
            self._load(h)
            self.blocks += 1
        elif kind == fr.BEAT:
            self.beats[h.source] = time.monotonic()
        elif kind == fr.READY:
            with self.lock:
                self.ready.add(h.source)
            self.beats[h.source] = time.monotonic()
        elif kind == fr.ROWS:
            self._rows(h)
        elif kind == fr.ROWS_ASK:
            self.asked = max(self.asked, h.a)
        elif kind == fr.STOP:
            self.stop = True
        elif kind in ROUNDS:  # a cluster replica's flush and fetch rounds, numbered
            self._round(h)
        elif kind == fr.FAILED:
            if not self._more():
                raise fr.FrameError("FAILED without its text")
            text = self.sock.recv()[: fr.MAX_TEXT_BYTES].decode("utf-8", "replace")
            self._last("FAILED")
            self.failed = f"partition host {self.groups.addresses[h.source]}: {text}"
        else:
            raise fr.FrameError(f"{fr.KIND_NAMES[kind]} is not taken here")

    def _round(self, h: fr.Header) -> None:
        """Record a round's request (at a follower: only the leader's next one, a FETCH only
        when idle and flushed) or answer (at the leader: only to the request it awaits)."""
        name = fr.KIND_NAMES[h.kind]
        with self.lock:
            seen = self.rounds[h.kind]
            if h.kind in (fr.FLUSHED, fr.FETCHED):
                if h.a != self.awaiting[h.kind]:
                    raise fr.FrameError(
                        f"{name} {h.a} from group {h.source}: round {self.awaiting[h.kind]} is "
                        "the one asked"
                    )
            else:
                last = seen.get(h.source, 0)
                if h.a != last + 1:
                    raise fr.FrameError(f"{name} {h.a}: the next round is {last + 1}")
                if h.kind == fr.FETCH and (
                    self.flushed_round != self.rounds[fr.FLUSH].get(LEADER, 0)
                    or self.loads != self.loads_at_flush
                ):
                    raise fr.FrameError(
                        f"FETCH {h.a}: this host's partitions are not idle and flushed (an "
                        "epoch's model is taken only between portions)"
                    )
                if h.kind == fr.FLUSH:
                    # every LOAD of the portion has been taken here already, though LOADs come
                    # from the leader's partition processes and FLUSH from its parent, over other
                    # connections: the leader asks FLUSH only once every example of the portion
                    # completed, and an example completes only after this host's partitions ran
                    # it forward, which they do only on its LOAD taken here. Were FLUSH ever
                    # sent sooner, a late LOAD would make the next FETCH refused as not idle and
                    # stall the rounds until FLUSH_TIMEOUT_S
                    self.loads_at_flush = self.loads
            seen[h.source] = h.a

    def await_round(self, kind: int, asked: int) -> None:
        """The leader: its followers' answers of ``kind`` (FLUSHED, FETCHED) must be to
        request ``asked`` from now on (set before the request is sent)."""
        with self.lock:
            self.awaiting[kind] = asked

    def _current(self, s: int) -> int:
        from hogwild.shm.atomics import atomic_load

        if self.group == LEADER:  # the feeder (partition 0, here) publishes the slot's example
            return int(atomic_load(self.sync, s * self.width + GEN))
        return self.slot_gen[s]

    def _targets(self, h: fr.Header) -> list[np.ndarray]:
        """Where the payload of a FORWARD or BACKWARD goes in slot ``h.slot``'s rows."""
        b = self.plan.boundaries[h.boundary - 1]
        if h.kind == fr.FORWARD:
            if h.source not in b.producers or not any(
                self.groups.group_of[c] == self.group for c in b.contributors
            ):
                raise fr.FrameError(f"FORWARD of boundary {h.boundary} from {h.source}: unplanned")
            lo, hi = b.slices[h.source]
            return [self.act[h.slot, b.block + lo : b.block + hi]]
        owners = [q for q in b.producers if self.groups.group_of[q] == self.group]
        if h.source not in b.contributors or not owners:
            raise fr.FrameError(f"BACKWARD of boundary {h.boundary} from {h.source}: unplanned")
        row = self.dact[h.source, h.slot]
        return [row[b.block + b.slices[q][0] : b.block + b.slices[q][1]] for q in owners]

    def _block(self, h: fr.Header) -> None:
        current = self._current(h.slot)
        what = f"{fr.KIND_NAMES[h.kind]} of slot {h.slot}, example {h.generation}"
        if h.generation < current or (h.generation > current and self.group == LEADER):
            raise fr.FrameError(f"{what}: the slot holds example {current}")
        targets = [] if h.kind == fr.DONE else self._targets(h)
        if h.generation > current:  # overtook its LOAD: kept until the example is here
            key = (h.slot, h.generation)
            slots, per_example = self.max_pending
            if (key not in self.pending and len(self.pending) >= slots) or len(
                self.pending.get(key, ())
            ) >= per_example:
                raise fr.FrameError(f"{what}: more early messages than the plan can send")
            kept = []
            for view in targets:
                buffer = np.empty_like(view)
                self._into(buffer, what)
                kept.append(buffer)
            self._last(what)
            self.pending[(h.slot, h.generation)].append((h, kept))
            return
        for view in targets:
            self._into(view, what)
        self._last(what)
        self._count(h)

    def _count(self, h: fr.Header, kept=None) -> None:
        """Advance slot ``h.slot``'s counter for a block that is in its row now."""
        from hogwild.shm.atomics import atomic_add

        base = h.slot * self.width
        if kept is not None:
            for view, values in zip(self._targets(h), kept, strict=True):
                view[:] = values
        if h.kind == fr.FORWARD:
            atomic_add(self.sync, base + fwd_column(h.boundary), 1)
        elif h.kind == fr.BACKWARD:
            atomic_add(self.sync, base + bwd_column(h.boundary), 1)
        else:  # DONE, at the leader: the last one to finish counts the example
            if atomic_add(self.sync, base + DONE, 1) == self.plan.k - 1:
                s, p = h.slot, h.source
                self.stats[p, STAT_LOSS] += self.slot_loss[s, 0]
                self.stats[p, STAT_CORRECT] += self.slot_loss[s, 1]
                self.stats[p, STAT_EXAMPLES] += 1

    def _load(self, h: fr.Header) -> None:
        from hogwild.model.passes import load_example
        from hogwild.shm.atomics import atomic_store

        s = h.slot
        if h.generation <= self.slot_gen[s]:
            raise fr.FrameError(f"LOAD of example {h.generation} into slot {s}: not new")
        image = np.empty(self.input_size, dtype=np.uint8)
        self._into(image, "LOAD")
        self._last("LOAD")
        base = s * self.width
        for col in range(1, self.width):  # every partition here is done with the last one
            atomic_store(self.sync, base + col, 0)
        load_example(image, self.act[s], self.mean, self.std)
        self.slot_label[s] = h.a
        self.slot_lr[s] = h.f
        for early, kept in self.pending.pop((s, h.generation), []):
            self._count(early, kept)
        self.slot_gen[s] = h.generation
        self.loads += 1
        atomic_store(self.sync, base + GEN, h.generation)  # publishes the example here

    def _rows(self, h: fr.Header) -> None:
        rows = rows_of(self.plan, self.groups.members(h.source))
        n = sum(b - a for a, b in rows)
        values = np.empty(n, dtype=np.float32)
        velocities = np.empty(n, dtype=np.float32)
        self._into(values, "ROWS (parameters)")
        self._into(velocities, "ROWS (velocity)")
        self._last("ROWS")
        scatter_rows(values, self.params, rows)
        scatter_rows(velocities, self.velocity, rows)
        with self.lock:
            self.rows[h.source] = max(self.rows.get(h.source, 0), h.a)

    # -- for the parent --------------------------------------------------------------------------

    def silent(self, group: int) -> float:
        return time.monotonic() - self.beats[group]

    def round(self, kind: int, group: int) -> int:
        """The last request (or answer) of a round of ``kind`` heard from ``group`` (0: none)."""
        with self.lock:
            return self.rounds[kind].get(group, 0)


def setup_frames(setup: dict, params: np.ndarray, velocity: np.ndarray) -> list:
    """SETUP's payload: the job as JSON, then the model."""
    text = json.dumps(setup).encode("utf-8")
    if len(text) > fr.MAX_SETUP_BYTES:
        raise ValueError(f"a partition host's setup of {len(text)} bytes")
    return [text, params, velocity]
