"""What the simulated replicated parameter server must never do: the job's invariants.

An :class:`Invariants` is fed what the :class:`~hogwild_plugins.ps.simulation.world.World` sees
happen (a client's acknowledgement or read, a server killed, etcd wiped) and asked, after every
step, whether the servers still keep them (:meth:`Invariants.check`), besides every machine's own
``validate_state``:

* every acknowledged update is on every in-sync copy that holds the bucket's state (a copy where
  the bucket is stopped holds it no longer: its state lives on in the others);
* no server applied a ``(sender, seq)`` twice;
* a shard's version (its log's committed version) is the number of updates its values hold and
  those that failed to apply there;
* a bucket whose update failed to apply on a server is stopped there, and its role told, until a
  snapshot replaced every shard that failed: its requests are refused ``STOPPED`` meanwhile;
* a bucket's epoch in etcd, and each shard log's epoch on a server, only grow;
* a copy never takes (acknowledges) a message of a primary older than one whose message it
  already took, nor one older than its own epoch as the bucket's primary: a deposed primary's
  late ``PREPARE`` or ``COMMIT`` (past the gate before the news) never lands;
* no two servers acknowledged writes of one bucket in one epoch, and no update was acknowledged
  with two versions;
* an update is acknowledged only once ``min_copies`` servers hold it (or took it and failed to
  apply it, their bucket stopped);
* a client reads its acknowledged writes, and its reads of a shard never go back;
* an in-sync copy with a store that holds a bucket's acknowledged updates has the bucket marked
  there (a process started on that store after etcd lost its keys knows the bucket had a
  record), and a process started on a store never serves a bucket at an epoch below the one its
  store remembered (it never starts it afresh).

An update acknowledged and then lost with every server holding it is forgiven (the parameter
server keeps its state in memory): counted by the world, no longer expected anywhere. A broken
invariant raises :class:`Broken` naming it; the world adds its schedule and the servers' stories.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hogwild_plugins.ps.replication.bucket_role import Role
from hogwild_plugins.ps.simulation.etcd import SimEtcd
from hogwild_plugins.ps.simulation.messages import Peer
from hogwild_plugins.ps.simulation.server import SimServer

__all__ = ["Broken", "Invariants"]


class Broken(Exception):
    """An invariant broken; the message names it."""


class Invariants:
    """The job's invariants over one world's servers (see the module docstring).

    Args:
        servers: The world's servers by index (None: killed), read as they change.
        etcd: The world's etcd.
        bucket_shards: Every bucket's shards.
        min_copies: The servers that must hold an update before it is acknowledged.
    """

    def __init__(
        self,
        servers: Mapping[int, SimServer | None],
        etcd: SimEtcd,
        bucket_shards: Mapping[int, Sequence[int]],
        min_copies: int,
    ) -> None:
        self.servers, self.etcd, self.min_copies = servers, etcd, min_copies
        self.bucket_shards = bucket_shards
        self.bucket_of = {s: b for b, shards in bucket_shards.items() for s in shards}
        self.acked: dict[int, set[tuple[int, int]]] = {s: set() for s in self.bucket_of}
        self.acknowledgements = 0  # every client's acknowledgements taken, re-sends' included
        self.forgiven: frozenset = frozenset()  # acknowledged updates that died with every copy
        self.graveyard: list[tuple[int, dict]] = []  # killed servers: (index, shard -> updates)
        self.wiped_incarnations: list[int] | None = None  # each server's process at the wipe
        self.top_epoch: dict[int, int] = {}
        self.log_epochs: dict[tuple[int, int, int], int] = {}  # (server, incarnation, shard)
        self.ack_epochs: dict[tuple[int, int], int] = {}  # (bucket, epoch) -> server
        # (server, incarnation, shard) -> the newest epoch of a primary's message it took
        self.taken_epochs: dict[tuple[int, int, int], int] = {}
        self.checked: tuple = ()  # etcd's revision and the acknowledgements at the last check
        self.last_transitions: dict[int, tuple] = {}  # server -> its machines' last transitions

    def live(self) -> list[SimServer]:
        return [s for s in self.servers.values() if s is not None]

    # ------------------------------------------------------------------ what the world feeds

    def acknowledged(
        self, sender: int, seq: int, shard: int, version: int, ledger: dict[tuple, tuple]
    ) -> None:
        """Client ``sender``'s ``(sender, seq)`` of ``shard`` acknowledged as ``version``;
        ``ledger``: that client's acknowledgements so far (``(sender, seq) -> (shard, version)``),
        to which it is added."""
        key = (sender, seq)
        if key in ledger and ledger[key] != (shard, version):
            raise Broken(
                f"({sender}, {seq}) acknowledged as version {version}, before as {ledger[key][1]}"
            )
        ledger[key] = (shard, version)
        self.acked[shard].add(key)
        self.acknowledgements += 1

    def read(
        self, sender: int, shard: int, served: int, values: frozenset, expected: frozenset,
        reads: dict[int, list],
    ) -> None:  # fmt: skip
        """A pull's answer to client ``sender``: ``values``, served at step ``served``, holds
        what the client had acknowledged when it asked (``expected``: read your writes), and it
        neither misses what a read served before it held nor holds what a read served after it
        misses (monotonic reads), updates that died with every copy aside. ``reads``: that
        client's last reads by shard (``[(served at, updates read)]``), to which it is added."""
        values = values - self.forgiven
        if expected - self.forgiven - values:
            raise Broken(
                f"client {sender} read shard {shard} without its acknowledged "
                f"{sorted(expected - values)}"
            )
        for when, seen in reads.setdefault(shard, []):
            seen = seen - self.forgiven
            older, newer = (seen, values) if when < served else (values, seen)
            if older - newer:
                raise Broken(
                    f"client {sender} read shard {shard} going back: "
                    f"{sorted(older - newer)} seen, then not"
                )
        reads[shard].append((served, values))
        del reads[shard][:-4]

    def answered(self, server: SimServer, m: Peer, answer: tuple[str, int]) -> None:
        """Copy ``server`` answered primary's message ``m`` with ``answer``: a message taken
        (``ACK``) is of no primary older than one it took a message from, nor than its own
        epoch as the bucket's primary."""
        if answer[0] != "ACK":
            return
        key = (server.me, server.incarnation, m.shard)
        newest = self.taken_epochs.get(key, 0)
        role = server.roles[m.bucket]
        if role.role is Role.PRIMARY:
            newest = max(newest, role.epoch)
        if m.epoch < newest:
            raise Broken(
                f"server {server.me} took a {m.kind} of shard {m.shard} from the primary of "
                f"epoch {m.epoch} (server {m.sender}) after the primary of epoch {newest}'s: "
                "a deposed primary's message landed"
            )
        self.taken_epochs[key] = m.epoch

    def killed(self, index: int, server: SimServer) -> list:
        """Server ``index`` was killed (it is no longer among the world's servers): what it held
        still counts for the rounds it committed; the acknowledged updates it took with it, no
        live server holding them any more, are forgiven and returned."""
        # what it took: applied, or committed and failed to apply (its bucket stopped there)
        took = {shard: set(v) | server.failed_writes[shard] for shard, v in server.values.items()}
        self.graveyard.append((index, took))
        gone = []
        for shard, acked in self.acked.items():
            held = set().union(*(s.values[shard] for s in self.live()))
            gone += sorted(acked - held)
            self.forgiven |= acked - held  # (a read of them may go back: they are gone)
            acked &= held
        return gone

    def wiped(self, incarnations: Sequence[int]) -> None:
        """etcd lost every key while each server ran its process ``incarnations[i]``."""
        self.wiped_incarnations = list(incarnations)

    # ------------------------------------------------------------------ what the world asks

    def _all_new(self) -> bool:
        """Every live server started after etcd was wiped: the job starts afresh (its epochs
        too), as a new job would."""
        wiped = self.wiped_incarnations
        return wiped is not None and all(s.incarnation > wiped[s.me] for s in self.live())

    def check(self, touched: set[int], full: bool = False) -> None:
        """Every touched server's machines' own invariants, then the job's.

        After a step, only what it can have changed is checked: of the servers it ``touched``,
        those whose machines moved (a server's logs, values and roles change only in a step where
        one of its machines takes a stimulus: they are written by the effects of its actions),
        and of the in-sync copies, every one when etcd or the acknowledgements changed, else
        those that moved. ``full`` checks every live server, every machine and every in-sync
        copy, as if everything had changed.

        Raises:
            Broken: An invariant broken.
        """
        servers = self.servers
        if full:
            touched = set(servers)
        touched_servers = [servers[i] for i in sorted(touched) if servers[i] is not None]
        moved = []  # the touched servers whose machines took a stimulus
        try:
            for s in touched_servers:
                machines = (*s.roles.values(), s.commit_round, s.copy_side)
                # the last transition of each: a server none of whose machines moved is as valid
                # as it was
                last = tuple(m.transitions[-1] if m.transitions else None for m in machines)
                if not full and self.last_transitions.get(s.me) == (s.incarnation, last):
                    continue
                self.last_transitions[s.me] = (s.incarnation, last)
                moved.append(s)
                for machine in machines:
                    machine.validate_state()
        except AssertionError as exc:
            raise Broken(f"a machine's invariant: {exc}") from None
        for s in moved:
            self._check_shards(s)
            self._check_remembered(s)
        if moved or full:  # who answers reads changes only with a role's move or the clock
            self._check_one_reader()
        for s in touched_servers:
            self._check_acknowledged(s)
        seen = (self.etcd.revision, self.etcd.wipes, self.acknowledgements)
        if seen == self.checked and not moved and not full:
            return
        everyone = full or seen != self.checked
        self.checked = seen
        self._check_buckets(everyone, {s.me for s in moved})

    def _check_one_reader(self) -> None:
        """At most one server answers each bucket's pulls, the promise linearizable reads
        rest on, checked where a wrong decision is made rather than where a client happens to
        see it: a paused server counts by its own clock (resumed, it would answer). Leases
        granted before etcd was wiped belong to a job that no longer exists: not compared."""
        # the live servers of this job's leases, read once for every bucket
        leased = [s for s in self.live() if s.lease > self.etcd.leases_before_wipe]
        for bucket, shards in self.bucket_shards.items():
            readers = [s.me for s in leased if shards and s.answers_bucket_reads(bucket)]
            if len(readers) > 1:
                raise Broken(f"bucket {bucket}'s pulls answered by servers {readers} at once")

    def _check_remembered(self, s: SimServer) -> None:
        """Server ``s`` serves no bucket at an epoch below the one its store remembered when the
        process started."""
        for bucket, (epoch, _, _) in s.marks.remembered.items():
            role = s.roles[bucket]
            if role.serving and role.epoch < epoch:
                raise Broken(
                    f"server {s.me} serves bucket {bucket} at epoch {role.epoch}, below epoch "
                    f"{epoch} its store remembered at its start"
                )

    def _check_shards(self, s: SimServer) -> None:
        """Server ``s``'s shards: each update applied once, as many as the version says (those
        that failed to apply counted), the log's epoch never back; a shard that failed a write
        stopped its bucket, which refuses requests, until a snapshot replaced it."""
        open_shards = s.open_shards()
        for shard, values in s.values.items():
            if len(set(values)) != len(values):
                twice = sorted({v for v in values if values.count(v) > 1})
                raise Broken(f"server {s.me} applied {twice} twice to shard {shard}")
            log = s.logs[shard]
            failed = s.failed_writes[shard]
            if shard not in open_shards and len(values) + len(failed) != log.committed:
                raise Broken(
                    f"server {s.me}, shard {shard}: version {log.committed} but "
                    f"{len(values)} updates applied and {len(failed)} failed"
                )
            bucket = self.bucket_of[shard]
            if failed and not s.stops.stopped(bucket):
                raise Broken(
                    f"server {s.me}, shard {shard}: {sorted(failed)} failed to apply, "
                    f"yet bucket {bucket} is not stopped"
                )
            if s.stops.stopped(bucket) and s.refusal(shard, "PULL") != "STOPPED":
                raise Broken(f"server {s.me}: bucket {bucket} is stopped, yet shard {shard} served")
            if s.roles[bucket].stopped and not s.stops.stopped(bucket):
                raise Broken(f"server {s.me}: bucket {bucket}'s role stopped, its stop lifted")
            key = (s.me, s.incarnation, shard)
            if log.epoch < self.log_epochs.get(key, 0):
                raise Broken(f"server {s.me}, shard {shard}: log epoch went back to {log.epoch}")
            self.log_epochs[key] = log.epoch

    def _check_acknowledged(self, s: SimServer) -> None:
        """What server ``s`` acknowledged since the last check: held by ``min_copies`` servers,
        and no other server acknowledged writes of that bucket in that epoch."""
        for sender, seq, shard, _, epoch in s.acknowledged:
            bucket = self.bucket_of[shard]
            # its holders: the live servers and those killed since (their copies counted when
            # the round committed them)
            holders = {
                h.me
                for h in self.live()
                if (sender, seq) in h.values[shard] or (sender, seq) in h.failed_writes[shard]
            }
            holders |= {me for me, held in self.graveyard if (sender, seq) in held[shard]}
            if len(holders) < self.min_copies:
                raise Broken(
                    f"server {s.me} acknowledged ({sender}, {seq}) held by "
                    f"{sorted(holders)} only, fewer than min_copies = {self.min_copies}"
                )
            other = self.ack_epochs.setdefault((bucket, epoch), s.me)
            if other != s.me:
                raise Broken(
                    f"bucket {bucket}: servers {other} and {s.me} both acknowledged writes "
                    f"in epoch {epoch}"
                )
        s.acknowledged.clear()

    def _check_buckets(self, everyone: bool, changed: set[int]) -> None:
        """Every bucket's epoch in etcd never back, and every acknowledged update on each of its
        in-sync copies holding its state (``everyone``, or only those ``changed``)."""
        servers = self.servers
        members = None  # read only when a copy is to be checked
        for bucket, shards in self.bucket_shards.items():
            record = self.etcd.record(bucket)
            if record is None:
                continue
            if record.epoch < self.top_epoch.get(bucket, 0) and not self._all_new():
                raise Broken(
                    f"bucket {bucket}: epoch {record.epoch} in etcd after {self.top_epoch[bucket]}"
                )
            self.top_epoch[bucket] = record.epoch
            for copy in record.in_sync:
                if not everyone and copy not in changed:
                    continue  # neither it nor the record nor the acknowledgements changed
                s = servers.get(copy)
                if s is None or not s.roles[bucket].current or s.stops.stopped(bucket):
                    continue
                if members is None:
                    members = self.etcd.members()
                # a copy that holds the bucket's state, under the lease it registered (a
                # restarted process is caught up before it counts)
                if members.get(copy, s.lease) != s.lease:
                    continue
                for shard in shards:
                    missing = self.acked[shard].difference(s.values[shard])
                    if missing:
                        raise Broken(
                            f"acknowledged {sorted(missing)} of shard {shard} not on in-sync "
                            f"copy {copy}"
                        )
                    store = s.marks.store
                    if self.acked[shard] and store is not None and bucket not in store.epochs:
                        raise Broken(
                            f"in-sync copy {copy} holds acknowledged updates of bucket {bucket} "
                            "and its store has no mark of it"
                        )
