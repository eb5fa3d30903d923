"""A simulated copy's side of its primary's messages: the effects the executor's ``receive`` asks.

As the real server's :mod:`~hogwild_plugins.ps.replication.copy_adapter`: the network thread
hands a primary's ``PREPARE``, ``COMMIT``, ``SNAPSHOT`` or ``CATCHUP`` to
:func:`~hogwild_plugins.ps.replication.executor.receive` with a :class:`SimCopyHost` as its host,
which carries out what the copy side (:mod:`~hogwild_plugins.ps.replication.copy_side`) decides
on the :class:`~hogwild_plugins.ps.simulation.server.SimServer`'s logs, values and stops. A step
of the world is atomic, so no lock is taken; etcd is read in place (not once the host is cut
off: the gate then decides on what the role knows); a snapshot is applied in place, and a stop
it replaced is lifted as the real copy's is. Where the real thread reads a message's frames
outside the lock the world may draw that the read lasts some of the replication thread's steps
(:attr:`SimCopyHost.read_steps`: the server then holds the message half taken).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hogwild_plugins.ps.replication.bucket_role_events import RecordRefreshed, Restored, StopLifted
from hogwild_plugins.ps.replication.copy_side_events import ApplyCommitted
from hogwild_plugins.ps.replication.marks import followed
from hogwild_plugins.ps.simulation.messages import Peer, SimWork

__all__ = ["SimCopyHost"]

_UNLOCKED = contextlib.nullcontext()  # a step of the world is atomic: the copy side needs no lock


class SimCopyHost:
    """The copy side's effects on ``server`` (see the module docstring)."""

    def __init__(self, server) -> None:
        self.server = server
        self.read_steps = 0  # the replication thread's steps the last message's read lasts

    def stimulus(self, what: str) -> str:
        return self.server.stimulus(what)

    def outside_lock(self, m: Peer) -> Iterator[str]:
        """Where the real network thread reads the message's frames: the world may draw that
        this lasts some of the replication thread's steps (:attr:`read_steps`)."""
        splits = self.server.splits
        self.read_steps = splits(f"{m.kind} of shard {m.shard}") if splits else 0
        if self.read_steps:
            yield f"the network thread reads the {m.kind}'s frames"

    def locked(self) -> contextlib.nullcontext:
        return _UNLOCKED

    def copy(self, stimulus) -> list:
        return self.server.copy_side.handle(stimulus)

    def committing(self, shard: int, upto: int) -> int:
        return self.server.logs[shard].committing(upto)

    def refresh_record(self, bucket: int) -> Iterator[str]:
        yield from ()
        server = self.server
        if server.cut_off:
            return  # etcd unreachable: the gate decides on what the role knows
        record = server.etcd.record(bucket, server.nonce)
        if record is not None:
            server.marks.saw(followed({bucket: record}, server.roles))  # before the role hears
            sid = server.stimulus("refresh")
            server.roles[bucket].handle(RecordRefreshed(record, stimulus_id=sid))

    @staticmethod
    def prepared_item(m: Peer) -> tuple:
        sender, seq, shard = m.item
        return sender, seq, SimWork(sender, seq, shard, m.version)

    @staticmethod
    def hold(n: int) -> None:
        return None  # the simulated engine has no queues to fill

    @staticmethod
    def release(held: None) -> None:
        pass

    def apply_committed(self, action: ApplyCommitted, held: None) -> None:
        server, shard = self.server, action.shard
        server.values[shard] += [
            (w.sender, w.seq)
            for w in action.works
            if server.applies(shard, w.sender, w.seq, "committed on a copy")
        ]
        server.book[shard] = max(action.committed, server.book[shard])

    @staticmethod
    def snapshot_of(m: Peer) -> tuple:
        values, table = m.item
        return table, values

    def apply_snapshot(self, m: Peer, values: tuple, held: None) -> bool:
        server = self.server
        server.values[m.shard] = list(values)
        server.failed_writes[m.shard].clear()
        server.book[m.shard] = m.version
        # applied after the shard failed a write, it replaces that memory (as the real copy's)
        return server.stops.failed(m.bucket, m.shard)

    def stopped(self, shard: int) -> bool:
        return self.server.stops.stopped(self.server.bucket_of[shard])

    @staticmethod
    def restoring_shard(shard: int) -> bool:
        return False  # a snapshot is applied in place

    def applying_shard(self, shard: int) -> bool:
        return self.server.commit_round.applying(shard)

    def await_snapshot(self, m: Peer, replaces: bool) -> Iterator[str]:
        yield from ()  # applied in place; a stop it replaced is lifted as the real copy's is
        server = self.server
        if replaces and server.stops.replaced(m.bucket, m.shard):
            sid = server.stimulus("stop lifted")
            server.roles[m.bucket].handle(StopLifted(stimulus_id=sid))

    def restored(self, bucket: int, epoch: int, stimulus_id: str) -> None:
        self.server.roles[bucket].handle(Restored(epoch, stimulus_id=stimulus_id))
