"""A primary's snapshots for its roles' ``Sync``: the parcel taken, handed to the snapshot thread,
and what came of it told to the role.

A bucket role that wants a copy caught up returns a
:class:`~hogwild_plugins.ps.replication.bucket_role_events.Sync`. The replication thread takes
its parcel at once (:meth:`SyncParcels.send`): the engine's barrier on the bucket's shards, a
catch-up probe of each shard no commit round has open (does the copy's log hold this side's
committed state? then it needs no snapshot: the copy side decides,
:mod:`~hogwild_plugins.ps.replication.copy_side`) and the snapshot of every shard, read together.
The bucket takes no writes while its role syncs, so none of this changes before it is sent. The
snapshot thread (:mod:`~hogwild_plugins.ps.replication.snapshot_sender`, on a peer link of its
own) sends it and waits for the copy's answers; at its next turn the replication thread tells the
role what came of each parcel (:meth:`SyncParcels.tell_roles`), under the Sync's ticket.

A parcel that cannot be taken (the engine's barrier timed out, its queues stayed full) answers
the copy unreachable under the Sync's ticket; the role asks again at a later turn.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping

from hogwild_plugins.ps.replication.bucket_role import BucketRole
from hogwild_plugins.ps.replication.bucket_role_events import Sync
from hogwild_plugins.ps.replication.commit_round import CommitRound
from hogwild_plugins.ps.replication.executor import RoleEffects, snapshot_answered
from hogwild_plugins.ps.replication.frames import snapshot_frames
from hogwild_plugins.ps.replication.local import LocalApplier
from hogwild_plugins.ps.replication.peer_link import PeerLink
from hogwild_plugins.ps.replication.snapshot_sender import Parcel, SnapshotSender
from hogwild_plugins.ps.shard_log import ShardLog

from hogwild.errors import HogwildError
from hogwild.net.channel import Request
from hogwild.net.wire import DType, MsgType

__all__ = ["SyncParcels"]


class SyncParcels:
    """The snapshots of one server's roles' Syncs (see the module docstring).

    Args:
        server: The :class:`~hogwild_plugins.ps.serving.server.ParameterServer` (its job, layout
            and shards).
        roles: Every bucket's role.
        logs: Every shard's log (read under ``lock``).
        bucket_shards: Every bucket's shards.
        lock: The replication's lock (the logs, and a role's answer, against the network thread).
        local: Work queued on this server's update engine (the barrier).
        commit_round: The primary's commit round (a shard's snapshot point).
        lease: ``lease()``: this server's lease when a message goes out.
        stimulus: ``stimulus(what)``: a new stimulus id.
        counters: The replication's counters (``snapshots_sent``, ``copies_caught_up``).
        on_failure: ``on_failure(reason)``: the snapshot thread ended on an error (called from
            it).
        on_caught_up: Called when a copy caught up: the map is read again at the next turn.
    """

    def __init__(
        self,
        server,
        roles: Mapping[int, BucketRole],
        logs: Mapping[int, ShardLog],
        bucket_shards: Mapping[int, list[int]],
        lock: threading.Lock,
        local: LocalApplier,
        commit_round: CommitRound,
        lease: Callable[[], int],
        stimulus: Callable[[str], str],
        counters: dict,
        on_failure: Callable[[str], None],
        on_caught_up: Callable[[], None],
    ) -> None:
        self.server, self.roles, self.logs = server, roles, logs
        self.bucket_shards, self.lock, self.local = bucket_shards, lock, local
        self.commit_round, self.on_caught_up = commit_round, on_caught_up
        # snapshots are sent and waited for on a thread of their own, on a link of their own:
        # a copy slow to answer one holds up no commit round (only the parcels queued after it)
        self.link = PeerLink(server.job, server.layout, roles, lease, stimulus)
        self.sender = SnapshotSender(self.link, counters, self.awaited, on_failure)
        self.not_built = 0  # Syncs answered unreachable: their snapshot was not taken
        self.last_error: str | None = None

    def start(self, servers: list[str], me: int, keys: str | None) -> None:
        """Open the link and start the snapshot thread."""
        self.link.open(servers, me, keys)
        self.sender.start()

    def stop(self) -> None:
        """Stop the snapshot thread (a parcel under way ends with its exchange's timeout)."""
        self.sender.stop()

    def close(self) -> None:
        """Close the link (after :meth:`stop`)."""
        self.link.close()

    def send(self, action: Sync) -> Iterator[str]:
        """The executor's ``send_snapshot`` effect: ``action``'s parcel taken now and queued for
        the snapshot thread (None: under way, told by :meth:`tell_roles`), or False (not sent:
        the role no longer waits for it, or it could not be taken)."""
        yield from ()
        if not self.awaited(action):
            return False  # deposed since it asked (in the same turn): nothing goes out
        try:
            parcel = self.take(action)
        except HogwildError as exc:  # the engine's barrier timed out, or its queues stayed full:
            self.not_built += 1  # the copy is answered unreachable under the Sync's
            self.last_error = str(exc)  # ticket, and tried again at a later turn
            return False
        self.sender.send(parcel)
        return None  # under way: its outcome is told to the role by tell_roles

    def take(self, action: Sync) -> Parcel:
        """What ``action`` sends, taken now, together (see the module docstring)."""
        server = self.server
        shards = self.bucket_shards[action.bucket]
        role, epoch = self.roles[action.bucket], action.epoch
        self.local.barrier(shards)
        probes, snapshots = [], {}
        for shard in shards:
            held = server.shards[server.local[shard]]
            with self.lock:
                version, table = self.commit_round.snapshot_point(shard)
                log = self.logs[shard]
                if version == log.committed:  # (no round open on it)
                    # a SNAPSHOT without frames; offset: the epoch of this committed state
                    header = self.link.header(
                        MsgType.SNAPSHOT, shard, version, role, offset=log.epoch, epoch=epoch
                    )
                    probes.append(Request(action.server, header))
            values, state = held.values.copy(), held.state.copy()
            header = self.link.header(
                MsgType.SNAPSHOT,
                shard,
                version,
                role,
                dtype=DType.FLOAT32,
                shape=(values.size,),
                frames=5,
                epoch=epoch,
            )
            frames = snapshot_frames(values, state, table, held.vectors)
            snapshots[shard] = Request(action.server, header, frames)
        return Parcel(action, probes, snapshots)

    def awaited(self, action: Sync) -> bool:
        """Whether ``action``'s role still waits for its answer (also the sender thread's look,
        without the lock: it only spares a snapshot nobody waits for)."""
        return self.roles[action.bucket].awaits(action)

    def tell_roles(self, host: RoleEffects, carry_out: Callable[[list], None]) -> None:
        """Tell the roles what the parcels sent since the last turn came to, and carry out what
        they ask next (the replication thread's turn; ``host`` is the executor's)."""
        for outcome in self.sender.outcomes():
            with self.lock:
                actions = snapshot_answered(
                    outcome.action, outcome.delivered, outcome.fenced, self.roles, host
                )
            carry_out(actions)
            if outcome.delivered:
                # a copy caught up: what the role may do next (serve, hand the bucket back) is
                # decided on the map, read again at the next turn rather than the next poll (a
                # copy that failed is tried again at the next poll, not at once)
                self.on_caught_up()

    def status(self) -> dict:
        """The snapshot thread's part of the server's replication status."""
        return {
            "snapshot_under_way": self.sender.under_way,  # bucket, copy, parcel number
            "snapshot_thread_failure": self.sender.failure,  # what ended it (None: running)
            "parcels_not_built": self.not_built,
            "last_parcel_error": self.last_error,
        }
