"""One commit round on a simulated primary: the effects the executor's round asks of the server.

As the real server's :mod:`~hogwild_plugins.ps.replication.primary_round`: the replication
thread takes the client updates queued since its last round and runs
:func:`~hogwild_plugins.ps.replication.executor.run_round` for them with a
:class:`SimPrimaryRound` as its host. The round's decisions
(:mod:`~hogwild_plugins.ps.replication.commit_round`) are carried out here on the
:class:`~hogwild_plugins.ps.simulation.server.SimServer`'s book (each update's version), its
values (the local application, which the world may draw to fail: the update is then answered
``STOPPED``, never ``ACK``), its exchanges with the copies (``PREPARE`` and ``COMMIT``, which
yield until the world has delivered or given up on every answer) and the clients' answers. A
copy the round drops goes to its bucket's role through the server's own effects, which this
host hands on.
"""

from __future__ import annotations

from collections.abc import Iterator

from hogwild_plugins.ps.replication.commit_round_events import Update
from hogwild_plugins.ps.simulation.messages import Exchange, Peer, SimWork

__all__ = ["SimPrimaryRound"]


class SimPrimaryRound:
    """The effects of one commit round of ``updates`` on ``server`` (see the module
    docstring)."""

    def __init__(self, server, updates: tuple[Update, ...]) -> None:
        self.server, self.updates = server, updates
        self.works: dict[int, SimWork] = {}  # their versions, once admitted
        self.failed_here: set[int] = set()  # the updates whose application failed here

    # -- the bucket roles' effects (a dropped copy): the server's own

    def stimulus(self, what: str) -> str:
        return self.server.stimulus(what)

    def replace_record(self, action) -> Iterator[str]:
        return self.server.replace_record(action)

    def lease_time(self) -> int:
        return self.server.lease_time()

    def record_written(self, action, done: bool) -> None:
        self.server.record_written(action, done)

    def etcd_failed(self, exc: Exception) -> None:
        self.server.etcd_failed(exc)

    def send_snapshot(self, action) -> Iterator[str]:
        return self.server.send_snapshot(action)

    def commit_prepared(self, bucket: int) -> None:
        self.server.commit_prepared(bucket)

    def stopped_here(self, bucket: int) -> bool:
        return self.server.stopped_here(bucket)

    # -- the round's effects

    def valid(self) -> bool:
        return self.server.valid()

    def round(self, stimulus) -> list:
        return self.server.commit_round.handle(stimulus)

    def refuse(self, index: int) -> None:
        u = self.updates[index]
        self.server.send(("client", u.sender), ("NOT_PRIMARY", u.seq, u.shard, 0))

    def answer_duplicate(self, index: int, version: int) -> None:
        u = self.updates[index]
        self.server.send(("client", u.sender), ("ACK", u.seq, u.shard, version))

    def admit(self, indices: tuple[int, ...]) -> dict[int, int]:
        book, versions = self.server.book, {}
        for i in indices:
            u = self.updates[i]
            book[u.shard] += 1
            self.works[i] = SimWork(u.sender, u.seq, u.shard, book[u.shard])
            versions[i] = book[u.shard]
        return versions

    def apply_locally(self, indices: tuple[int, ...]) -> None:
        server = self.server
        for i in (i for i in indices if server.commit_round.ours(i)):
            work = self.works[i]
            if server.applies(work.shard, work.sender, work.seq, "applied by its primary"):
                server.values[work.shard].append((work.sender, work.seq))
            else:
                self.failed_here.add(i)

    def send_prepares(self, prepares) -> Iterator[str]:
        server, requests = self.server, []
        for i, copy in prepares:
            u = self.updates[i]
            item = (u.sender, u.seq, u.shard)
            message = Peer(
                "PREPARE", u.bucket, u.shard, server.roles[u.bucket].epoch, server.lease,
                server.me, self.works[i].version, item,
            )  # fmt: skip
            requests.append((copy, message))
        exchange = yield from server.exchange(requests)
        return self._failed(exchange)

    def send_commits(self, commits) -> Iterator[str]:
        server, requests = self.server, []
        for shard, copy, version in commits:
            bucket = server.bucket_of[shard]
            epoch = server.roles[bucket].epoch
            message = Peer("COMMIT", bucket, shard, epoch, server.lease, server.me, version)
            requests.append((copy, message))
        exchange = yield from server.exchange(requests)
        return self._failed(exchange)

    def await_applied(self) -> Iterator[str]:
        yield "await the local application"

    def acknowledge(self, index: int, version: int) -> None:
        u, server = self.updates[index], self.server
        if index in self.failed_here:  # committed on the copies, failed here: never ACKed
            server.send(("client", u.sender), ("STOPPED", u.seq, u.shard, 0))
            return
        epoch = server.roles[u.bucket].epoch
        server.acknowledged.append((u.sender, u.seq, u.shard, version, epoch))
        server.send(("client", u.sender), ("ACK", u.seq, u.shard, version))

    @staticmethod
    def _failed(exchange: Exchange) -> frozenset:
        return frozenset(
            (m.bucket, dst)
            for (dst, m), ok in zip(exchange.requests, exchange.ok, strict=True)
            if not ok
        )
