"""What the simulated parameter server must do once the faults end: the liveness check.

The safety invariants (:mod:`.invariants`) hold after every step; they pass a world that simply
stops, a bucket with no primary ever again or a client's update never acknowledged. This module
ends a schedule by healing its world (:func:`heal`: every paused server resumed, every killed one
restarted as the driver restarts a parameter server of a job whose servers keep copies, and so
is one that stops at a read of the map in the heal, its lease revoked by the driver before
(what only it held counts as died with it), no more
faults: the network delivers everything in order, no lease expires early, etcd keeps its keys,
every application succeeds), then runs it quietly for :func:`heal_ticks` ticks (and up to a
TTL more while a takeover's wait for reads goes on: ``BucketRole.reads_open``): at each tick
the threads run and the messages are delivered until nothing is under way, a copy that will not
answer (its message lost in the faults) is given up on (the peer timeout), and each client sends
its outstanding update again (its re-send after a timeout or a ``NOT_PRIMARY``). A client of
the heal's own then writes a fresh update to every bucket that must serve, re-sent until
acknowledged (:data:`PROBE_TRIES` times, a tick apart): a copy whose memory a failed
application left behind after it acknowledged a commit is found only by the next write's
prepare, which it refuses, and caught up then. Then :func:`check_liveness` asks, of every
bucket:

* exactly one server is its primary, etcd's record names it under its present lease, and it
  answers reads and takes writes of every shard (``answers_reads``: serving and past its wait
  for reads; ``writable``) in the record's epoch;
* every copy the bucket should have (:func:`~hogwild_plugins.ps.failover.desired_copies` over
  the live servers) is in ``in_sync``, confirmed by the primary in its epoch, not stopped, and
  holds exactly the primary's updates of each shard at the primary's version;
* every client's outstanding update of it is acknowledged.

Three outcomes are allowed instead, each one the documented promise (docs/guarantees.md), and
checked as such:

* **etcd lost the bucket's record** (wiped after the bucket had one): a server saw the loss
  (``record_lost``), or the record is gone and a server knows the job had started (it saw a
  record, or met a member that had); the bucket need not serve again (an operator restarts
  the job);
* **every server holding the bucket's state died** (no live server was ``current`` in its
  ``in_sync`` when the world healed, but for those where a write had failed to apply): a
  memory-only store lost it; no server serves the bucket (the restarted ones hold nothing and
  never campaign);
* **the bucket stopped on its primary with no caught-up copy to hand it to**: etcd still names
  that server under its live lease, or under a lease it lost (cut off, it registered again)
  with every live copy in ``in_sync`` stopped and every live current copy out of it (seed
  22354, 300 steps, with cuts); it refuses the bucket ``STOPPED`` and serves nothing of it,
  until the job is restarted (the driver stops it at the client's ``STOPPED``).

A world that does none of these raises :class:`~hogwild_plugins.ps.simulation.world.Violation`
with its schedule (the heal's steps included) and every server's stories.
"""

from __future__ import annotations

from hogwild_plugins.ps.failover import desired_copies
from hogwild_plugins.ps.replication.bucket_role import Role
from hogwild_plugins.ps.simulation.world import Client, Config, World

__all__ = ["check_liveness", "heal", "heal_and_check", "heal_ticks"]

PROBE_TRIES = 3  # sends of a probe update (a tick apart) before its bucket counts as stuck
LOST_RECORD = "etcd lost its record"
NO_HOLDER = "every server holding its state died (or stopped: a write failed to apply)"


def heal_ticks(config: Config) -> int:
    """How long a healed world may take to serve every bucket again, in ticks.

    A server killed in the faults left its lease in etcd for up to one TTL (its own, at most
    ``config.longest_ttl``): until
    it lapses no copy may take a bucket it led. A server paused past its lease finds it lost at
    its next heartbeat (every fifth of the TTL) and registers again. A world started cold picks
    its first primaries once every server has registered or ``config.settle`` ticks passed.
    Everything after those (a campaign, the catch-up of the copies by their logs or by
    snapshots, a hand-over to the preferred primary, the clients' re-sends, the peer timeouts)
    takes no tick: the threads and the network settle between ticks. Two ticks of margin: one
    for the map read that follows a lease's expiry, one for the clients' re-send after it."""
    ttl = config.longest_ttl
    return ttl + max(1, ttl // 5) + config.settle + 2


def heal_and_check(world: World) -> None:
    """:func:`heal`, a probe write of every bucket that must serve (a fresh update, re-sent
    until acknowledged, :data:`PROBE_TRIES` times a tick apart), then :func:`check_liveness`
    (raises :class:`~hogwild_plugins.ps.simulation.world.Violation`)."""
    held = heal(world)
    serving = [
        b for b in world.bucket_shards
        if _allowed_outcome(world, b, world.etcd.record(b), held[b]) is None
    ]  # fmt: skip
    _probe(world, serving)
    check_liveness(world, held)


def heal(world: World) -> dict[int, bool]:
    """End the faults (see the module docstring) and run the world quietly for
    :func:`heal_ticks` ticks, and past them up to a TTL while a serving primary still waits
    out its predecessor's lease before it answers reads; every step is still checked against
    the safety invariants. Returns, by bucket, whether a live server held its state when the
    faults ended."""
    world.schedule.append(f"{world.time}: (the faults end: the world heals)")
    world.faults = frozenset()
    held = {b: _held(world, b) for b in world.bucket_shards}
    for i in sorted(world.cut):
        world.apply(("heal", i))
    for i, s in sorted(world.servers.items()):
        if s is None or s.paused:
            world.apply(("restart", i) if s is None else ("resume", i))
    for n in range(heal_ticks(world.config) + world.config.longest_ttl):
        if n >= heal_ticks(world.config) and not _reads_waiting(world):
            break  # past the heal's ticks, only a takeover's wait for reads goes on ticking
        _quiet(world)
        _restart_stopped(world, held)
        for c, client in enumerate(world.clients):
            if client.outstanding is not None:
                world.apply(("send", c))
        _quiet(world)
        _restart_stopped(world, held)
        world.apply(("tick",))
    _quiet(world)
    _restart_stopped(world, held)
    return held


def _restart_stopped(world: World, held: dict[int, bool]) -> None:
    """Restart each server that stopped in the heal (its map read found the driver's marker
    naming its lease: a fault's leftover), as the driver starts another process as that
    server; what only the stopped process held counts as died with it (``held`` updated)."""
    stopped = [i for i, s in sorted(world.servers.items()) if s is None]
    if not stopped:
        return
    for bucket, was in held.items():
        held[bucket] = was and _held(world, bucket)
    for i in stopped:
        world.apply(("restart", i))


def _reads_waiting(world: World) -> bool:
    """Whether a serving primary still waits out its predecessor's lease before it answers
    reads (``BucketRole.reads_open``: up to a TTL after a takeover late in the heal)."""
    return any(
        r.serving and not r.reads_open(world.time) for s in world.live() for r in s.roles.values()
    )


def _held(world: World, bucket: int) -> bool:
    """Whether a live server holds ``bucket``'s state as its roles count it (``current``, not
    stopped there, its role told or not yet, and in etcd's ``in_sync``: a copy restored by a
    primary that died before it wrote the copy into ``in_sync`` may not campaign), or no record
    names one yet (a first primary is still to be chosen)."""
    record = world.etcd.record(bucket)
    if record is None:
        return True
    return any(
        s.roles[bucket].current and not s.stops.stopped(bucket) and s.me in record.in_sync
        for s in world.live()
    )


def _probe(world: World, buckets: list[int]) -> None:
    """A fresh update of each of ``buckets`` from a client of the heal's own, re-sent until
    acknowledged (a few ticks at most): the bucket takes writes, and a copy whose memory a
    failed application left behind (committed, acknowledged, then stopped) is found by the
    prepare it refuses and caught up."""
    prober = Client(sender=100 + len(world.clients))
    world.clients.append(prober)
    c = len(world.clients) - 1
    for bucket in buckets:
        prober.seq += 1
        prober.outstanding = (prober.seq, world.bucket_shards[bucket][0])
        for _ in range(PROBE_TRIES):
            world.apply(("send", c))
            _quiet(world)
            if prober.outstanding is None:
                break
            world.apply(("tick",))
            _quiet(world)


def _quiet(world: World) -> None:
    """Run the threads and deliver every message until nothing is under way; an exchange still
    waiting then waits on a message lost in the faults: the peer timeout gives up on it."""
    for _ in range(50):
        world.settle(turns=True)
        waiting = [(s.me, p) for s in world.live() for e in s.exchanges() for p in e.waiting_on()]
        if not waiting:
            return
        for me, peer in waiting:
            if world.servers[me].exchanges():
                world.apply(("timeout", me, peer))
    raise world.violation("the healed world never quietened (50 settles)")


def check_liveness(world: World, held: dict[int, bool]) -> None:
    """Every bucket serves again, or ended in an allowed outcome (the module docstring);
    ``held``: :func:`heal`'s answer.

    Raises:
        Violation: A bucket stuck, a copy not caught up, or an update never acknowledged.
    """
    for bucket, shards in world.bucket_shards.items():
        stuck = _stuck(world, bucket, shards, held[bucket])
        if stuck:
            raise world.violation(f"liveness: bucket {bucket} {stuck}")


def _stuck(world: World, bucket: int, shards: list[int], held: bool) -> str | None:
    """Why ``bucket`` is not as the promise says (None: it is)."""
    live = world.live()
    serving = [s for s in live if s.roles[bucket].serving]
    record = world.etcd.record(bucket)
    outcome = _allowed_outcome(world, bucket, record, held)
    if outcome is not None:
        # (after a wipe a record may come back: a transaction computed before it can land on
        # the new keys; whoever serves then is the safety invariants' to judge)
        # (and a snapshot the dead primary sent before the faults ended, still in flight then,
        # may make a copy current after the end: that copy takes the bucket, rightly; the
        # safety invariants judge what it serves)
        if serving and outcome not in (LOST_RECORD, NO_HOLDER):
            return f"is served by {[s.me for s in serving]}, yet {outcome}"
        return None
    waiting = [
        c.sender for c in world.clients
        if c.outstanding is not None and world.bucket_of[c.outstanding[1]] == bucket
    ]  # fmt: skip
    primaries = [s.me for s in live if s.roles[bucket].role is Role.PRIMARY]
    if record is None or len(primaries) != 1 or primaries[0] != record.primary:
        return (
            f"has primaries {primaries} after {heal_ticks(world.config)} healed ticks, etcd's "
            f"record {record} (clients {waiting} waiting)"
        )
    primary = world.servers[record.primary]
    role = primary.roles[bucket]
    if role.epoch != record.epoch or not all(primary.answers_reads(s) for s in shards):
        return f"is not served by its primary {primary.me} in epoch {record.epoch}"
    if not role.writable:
        return f"takes no writes on its primary {primary.me} ({role.holders} live copies)"
    members = world.etcd.members()
    for copy in desired_copies(bucket, members, world.config.copies):
        s = world.servers[copy]
        if copy not in record.in_sync or copy not in role.confirmed or s.stops.stopped(bucket):
            return f"has copy {copy} not caught up (in_sync {record.in_sync})"
        for shard in shards:
            theirs, mine = s.values[shard], primary.values[shard]
            if set(theirs) != set(mine) or s.logs[shard].committed != primary.logs[shard].committed:
                return (
                    f"has copy {copy} holding {theirs} of shard {shard} at version "
                    f"{s.logs[shard].committed}, its primary {mine} at "
                    f"{primary.logs[shard].committed}"
                )
    if waiting:
        return f"never acknowledged the outstanding updates of clients {waiting}"
    return None


def _allowed_outcome(world: World, bucket: int, record, held: bool) -> str | None:
    """The allowed outcome ``bucket`` ended in, described (None: it must serve)."""
    live = world.live()
    if world.etcd.wipes:
        roles = [s.roles[bucket] for s in live]
        # a server saw the loss, or the bucket's record (it had one: its epoch was checked) is
        # gone and a server knows the job had started (it saw a record, or met a member that
        # had: a process started since learns it so)
        had = bucket in world.invariants.top_epoch
        if any(r.record_lost for r in roles) or (
            record is None and had and any(r.history.started or r.known_epoch for r in roles)
        ):
            return LOST_RECORD
    if not held:
        return NO_HOLDER
    if record is not None:
        named = world.servers.get(record.primary)
        if (
            named is not None
            and named.roles[bucket].stopped
            and (
                world.etcd.members().get(named.me) == record.lease
                or _no_copy_left(live, bucket, record)
            )
        ):
            # etcd names it under its live lease (no copy may campaign), or under a lease it
            # lost (cut off, say, and registered again) with every copy it kept in sync stopped
            if any(named.refusal(s, "PUSH") != "STOPPED" for s in world.bucket_shards[bucket]):
                return None
            return f"stopped on its primary {named.me} with no caught-up copy"
    return None


def _no_copy_left(live, bucket: int, record) -> bool:
    """Whether no live copy could take ``bucket`` from its stopped primary ``record`` names
    under a lease it lost, as seed 22354 (300 steps, with cuts) ends: every live server the
    record keeps in ``in_sync`` is stopped (a write failed to apply there), and every live
    current copy is out of ``in_sync`` (dropped by the primary's last in-sync write). A live
    member of ``in_sync`` that is not stopped, current or not, is a copy that should have been
    caught up or taken the bucket: a stall, not this outcome."""
    for server in live:
        kept = server.me in record.in_sync
        if kept and not server.stops.stopped(bucket):
            return False
        if kept and server.roles[bucket].current:
            return False
    return True
