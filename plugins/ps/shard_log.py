"""One shard's log on a server of the replicated parameter server (Adam 3.3.3).

A server holds one log per shard, as that shard's primary or as one of its copies
(:mod:`~hogwild_plugins.ps.replication`): the committed version and the epoch of the primary it
came from, the updates prepared after it (a copy holds them until the primary's ``COMMIT``), and
which client requests are in, so a client's re-send to a new primary is answered instead of
applied twice. The requests are kept per client (its sender id): the last ``window`` of each,
for at most ``senders`` clients (those the job runs; the least recently heard of goes beyond
that), so no other client's traffic can push an honest client's request out of the table.
A log also keeps the newest epoch of a primary it took anything from (its *fence*): a late
``PREPARE`` or ``COMMIT`` of an older primary, one that passed the copy's gate before that newer
primary's catch-up, snapshot or takeover reached this log, is refused rather than held; and a
``PREPARE`` or ``COMMIT`` of a newer primary than the fence is refused until that primary's
catch-up or snapshot has reached the log (:meth:`ShardLog.caught_up_by`): the log may hold
another history's state until then.
Like the bucket role's state machine (:mod:`~hogwild_plugins.ps.failover`), it does no I/O:
replication carries out what it says.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["ShardLog"]


@dataclass
class ShardLog:
    """One shard's updates as this server holds them (as a copy, or as the primary): the
    committed version and the epoch of the primary it came from, the prepared ones after it, and
    which client requests are in (``(sender, seq) -> version``, so a client's re-send to a new
    primary is answered instead of applied twice)."""

    committed: int = 0
    prepared: list = field(default_factory=list)  # (version, item), consecutive after committed
    # sender -> {seq: version}, its last ``window`` requests; senders least recently heard first
    requests: OrderedDict = field(default_factory=OrderedDict)
    window: int = 256  # requests remembered per client (more than it ever has unanswered)
    senders: int = 1024  # clients remembered (more than a job's roles)
    epoch: int = 0  # the epoch of the primary whose updates ``committed`` counts (0: none yet)
    # the newest epoch of a primary this log took a message from (or served as): older refused
    fence: int = 0

    @property
    def last(self) -> int:
        return self.prepared[-1][0] if self.prepared else self.committed

    def stale(self, epoch: int) -> bool:
        """Whether a message of the primary of ``epoch`` comes from a primary older than one
        this log already took something from: that primary was deposed, its message is late."""
        return epoch < self.fence

    def prepare(self, version: int, item, epoch: int) -> bool:
        """Hold ``item`` as version ``version`` from the primary of ``epoch``; False (catch up
        first) unless it is the next one, or when it comes from an older primary than this log
        took anything from (:meth:`stale`), or from a newer one that has not caught this log up
        (:meth:`caught_up_by`). A re-sent prepare of a version already held is accepted and not
        held twice."""
        if not self.caught_up_by(epoch) or version > self.last + 1:
            return False
        if version == self.last + 1:
            self.prepared.append((version, item))
        return True

    def caught_up_by(self, epoch: int) -> bool:
        """Whether the primary of ``epoch`` may prepare and commit here: it is the newest
        primary this log took anything from (its catch-up or snapshot, or this server's own
        takeover, set the fence). A newer primary's first message to this log must be its
        catch-up or snapshot: until then this log's committed state may be another history's
        than that primary's (a deposed primary's own update, applied here and counted by no
        other copy), and its versions would name other updates than that primary's; a version
        "already held" would be acknowledged without the update, and one after it applied on
        top of memory the new primary never counted (an update there twice)."""
        return epoch == self.fence

    def committing(self, upto: int) -> int:
        """How many prepared items a commit up to ``upto`` would take (nothing changes)."""
        return sum(1 for version, _ in self.prepared if version <= upto)

    def commit(self, upto: int, epoch: int) -> list:
        """The prepared items up to ``upto``, in order, now committed by the primary of
        ``epoch``; nothing from a primary older than this log took anything from
        (:meth:`stale`). A copy takes a commit only from the primary that caught it up
        (:meth:`caught_up_by`, checked by the copy side first); a new primary commits what its
        predecessor prepared here under its own epoch (its takeover: the fence moves on)."""
        if self.stale(epoch):
            return []
        self.fence = epoch
        n = 0
        while n < len(self.prepared) and self.prepared[n][0] <= upto:
            n += 1
        items, self.prepared = self.prepared[:n], self.prepared[n:]
        if items:
            self.committed, self.epoch = items[-1][0], epoch
        return [item for _, item in items]

    def applied(self, sender: int, seq: int, version: int, epoch: int) -> bool:
        """This side, as the primary of ``epoch``, applied update ``version`` of request
        ``(sender, seq)``: recorded, so a re-send is answered instead of applied again. False,
        and nothing recorded, when a newer primary's snapshot replaced the log meanwhile (this
        side stepped down while the update was out): that state is the bucket's now."""
        if epoch < self.epoch or self.stale(epoch):
            return False
        self.fence = epoch
        self.record(sender, seq, version)
        if version > self.committed:
            self.committed, self.epoch = version, epoch
        return True

    def record(self, sender: int, seq: int, version: int) -> None:
        mine = self.requests.get(sender)
        if mine is None:
            mine = self.requests[sender] = OrderedDict()
            if len(self.requests) > self.senders:
                self.requests.popitem(last=False)  # the client least recently heard of
        else:
            self.requests.move_to_end(sender)
        mine[seq] = version
        if len(mine) > self.window:
            mine.popitem(last=False)

    def seen(self, sender: int, seq: int) -> int | None:
        """The version a request already got (0: one older than the client's window, answered
        long ago, its version forgotten), or None (never applied here).

        A client process numbers its requests in order (the high 32 bits of a number name the
        process's run of numbers, a new random one at the wrap after 2**32 requests,
        :meth:`hogwild.net.channel.Peers.next_seq`, the low ones count) and sends at
        most half a ``window`` of them for one shard in one exchange, each exchange done before
        the next (:meth:`~hogwild_plugins.ps.connection.Connection.run`), so a request of the
        same process older than the last ``window`` it had applied here was answered before
        those were sent: it is a copy the network delivered late (a host cut off for seconds
        keeps the client's re-sends in its TCP buffers, and they arrive once the link is back,
        maybe after this server became primary again). Taken as new, it was applied a second
        time under a version of its own, on every copy (issue 38's cut runs). Another process
        with the same sender id (a client started again) numbers afresh: its requests are
        new."""
        mine = self.requests.get(sender)
        if mine is None:
            return None
        version = mine.get(seq)
        if version is None and len(mine) >= self.window:
            oldest = next(iter(mine))  # the lowest of its process: recorded in order
            if seq >> 32 == oldest >> 32 and seq < oldest:
                return 0
        return version

    def size(self) -> int:
        """The requests remembered, every client's together."""
        return sum(len(mine) for mine in self.requests.values())

    def restore(self, version: int, requests: list[tuple[int, int, int]], epoch: int) -> None:
        """A snapshot at ``version`` from the primary of ``epoch`` replaced everything."""
        self.committed, self.prepared, self.epoch = version, [], epoch
        self.fence = max(self.fence, epoch)
        self.requests = OrderedDict()
        for s, q, v in requests:
            self.record(s, q, v)

    def holds(self, version: int, epoch: int) -> bool:
        """Whether this log's committed state is the one a primary's log names by ``version``
        and ``epoch`` (the epoch of the primary whose updates it counts): one primary per epoch
        gives each version to one update, and a snapshot carries its primary's state at its
        version, so two logs at the same committed version of the same epoch hold the same
        updates (by induction over the catch-ups: every copy was made current by a snapshot or
        by this check). Never a log of epoch 0: what a process started with (its initial values,
        or a state it loaded) is no primary's, and is caught up by a snapshot."""
        return epoch > 0 and self.committed == version and self.epoch == epoch

    def catch_up(self, epoch: int) -> None:
        """The primary of ``epoch`` found this log holding its committed state (:meth:`holds`):
        the updates prepared after it came from an older primary's rounds that never committed,
        and the versions they hold are the new primary's to give: dropped. From now on that
        older primary's messages are refused (:meth:`stale`)."""
        self.prepared = []
        self.fence = max(self.fence, epoch)

    def outdated(self, version: int, epoch: int) -> bool:
        """Whether a snapshot of ``epoch`` at ``version`` is older than this log: the same
        primary's (same epoch), taken before updates this log has committed since (a late
        message of an exchange that primary gave up on, overtaken by a later snapshot or by
        commits). Restoring it would take back updates that primary acknowledged. A snapshot of
        a newer epoch is never outdated (the new primary's state is the bucket's; the gate
        refuses older epochs before this is asked)."""
        return epoch == self.epoch and version < self.committed

    def table(self) -> list[tuple[int, int, int]]:
        return [(s, q, v) for s, mine in self.requests.items() for q, v in mine.items()]
