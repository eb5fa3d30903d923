"""A simulated server's snapshot thread: the parcels of its roles' ``Sync``, sent step by step.

As the real server's (:mod:`~hogwild_plugins.ps.replication.sync_parcels` takes a parcel,
:mod:`~hogwild_plugins.ps.replication.snapshot_sender` sends it): a role's ``Sync`` takes its
parcel at once on the replication thread (:meth:`SimSnapshotThread.send`: a catch-up probe of
each shard no commit round has open, and every shard's snapshot, read together) and leaves its
exchanges to this thread, one parcel at a time, in order. Each parcel's work is a generator that
yields wherever the real thread blocks (an exchange with the copy), so the world interleaves its
steps with the replication thread's (other buckets' rounds, reads of the map, the role deposed
and elected again). What a parcel came to (delivered, fenced) goes into :attr:`outcomes`, which
the replication thread tells the roles at a later turn; a ``FENCED`` answer is kept in the
outcome, never told to a role from here.
"""

from __future__ import annotations

from collections.abc import Iterator

from hogwild_plugins.ps.simulation.messages import Exchange, Peer

from hogwild.net.wire import ErrorCode

__all__ = ["SimSnapshotThread"]


class SimSnapshotThread:
    """The snapshot thread of one simulated server (see the module docstring).

    Args:
        server: The :class:`~hogwild_plugins.ps.simulation.server.SimServer` (its roles, commit
            round, logs, values and lease, read when a parcel is taken; its ``send`` into the
            world's network).
    """

    def __init__(self, server) -> None:
        self.server = server
        self.sending: list[Iterator[str]] = []  # the parcels' flows (one runs at a time)
        self.waiting: Exchange | None = None  # the running flow's exchange, if any
        self.fenced = False  # a copy answered the running flow FENCED
        # what each parcel came to, not told to the roles yet: (action, delivered, fenced)
        self.outcomes: list[tuple] = []

    @property
    def busy(self) -> bool:
        """A parcel under way, or an outcome its replication thread has not told yet."""
        return bool(self.sending or self.outcomes)

    def send(self, action) -> Iterator[str]:
        """The executor's ``send_snapshot`` effect, as the real server's: the parcel taken now,
        sent by this thread (None: under way); False: not sent (the role no longer waits for it,
        or the world drew that its parcel cannot be taken)."""
        yield from ()
        server = self.server
        if not self.awaited(action):
            return False  # deposed since it asked: nothing goes out
        if server.unbuilt is not None and server.unbuilt(f"the parcel of {action}"):
            return False  # not taken: the copy is unreachable under the Sync's ticket
        self.sending.append(self._flow(action, *self.take(action)))
        return None

    def awaited(self, action) -> bool:
        """Whether ``action``'s role still waits for its answer."""
        return self.server.roles[action.bucket].awaits(action)

    def take(self, action) -> tuple[list, dict]:
        """As the real server's: a probe of each shard no round has open (does the copy's log
        hold this side's committed state? then no snapshot), and every shard's snapshot, taken
        together now: ``(probes, {shard: snapshot})``."""
        server = self.server
        bucket, copy, epoch = action.bucket, action.server, action.epoch
        probes, snapshots = [], {}
        for shard in server.bucket_shards[bucket]:
            version, table = server.commit_round.snapshot_point(shard)
            log = server.logs[shard]
            if version == log.committed:  # (no round open on it)
                probe = Peer(
                    "CATCHUP", bucket, shard, epoch, server.lease, server.me, version,
                    log_epoch=log.epoch,
                )  # fmt: skip
                probes.append((copy, probe))
            item = (tuple(server.values[shard]), tuple(table))
            snapshot = Peer(
                "SNAPSHOT", bucket, shard, epoch, server.lease, server.me, version, item
            )
            snapshots[shard] = (copy, snapshot)
        return probes, snapshots

    def runnable(self) -> bool:
        """Whether this thread has a step to take: a parcel not started, or its exchange
        answered."""
        return bool(self.sending) and (self.waiting is None or self.waiting.complete)

    def step(self) -> str:
        """This thread to its next blocking point (or the end of its parcel)."""
        try:
            return f"(snapshot thread) {next(self.sending[0])}"
        except StopIteration:
            self.sending.pop(0)
            self.waiting = None
            action, delivered, fenced = self.outcomes[-1]
            return (
                f"(snapshot thread) bucket {action.bucket} to {action.server}: "
                f"{'delivered' if delivered else 'not delivered'}{', fenced' if fenced else ''}"
            )

    def _flow(self, action, probes: list, snapshots: dict) -> Iterator[str]:
        """This thread's work for one parcel (the real one's ``_deliver``): the probes, then the
        snapshots of the shards whose logs do not hold this side's state; its outcome appended
        to ``outcomes``."""
        self.fenced = False
        delivered = yield from self._deliver(action, probes, snapshots)
        self.outcomes.append((action, delivered and not self.fenced, self.fenced))

    def _deliver(self, action, probes: list, snapshots: dict) -> Iterator[str]:
        need = set(snapshots) - {m.shard for _, m in probes}
        if probes:
            exchange = yield from self._exchange(probes)
            answers = zip(exchange.requests, exchange.ok, exchange.codes, strict=True)
            for (_, m), ok, code in answers:
                if not ok and code != ErrorCode.NEED_SYNC.name:
                    return False  # no answer, or refused: the copy is not caught up
                if not ok:
                    need.add(m.shard)
        if not need or self.fenced:
            return True
        if not self.awaited(action):
            return False  # deposed meanwhile: no snapshot of this side's goes out
        exchange = yield from self._exchange([snapshots[s] for s in sorted(need)])
        return all(exchange.ok)

    def _exchange(self, requests: list[tuple[int, Peer]]) -> Iterator[str]:
        exchange = Exchange(requests)
        self.waiting = exchange
        for i, (dst, message) in enumerate(requests):
            self.server.send(dst, (exchange, i, message))
        while not exchange.complete:
            yield f"exchange {[(d, m.kind, m.shard, m.version) for d, m in requests]}"
        self.waiting = None
        return exchange
