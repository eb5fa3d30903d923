"""One commit round on a real primary: the effects the executor's round asks of the server.

The replication thread takes the client updates queued since its last round (a batch of
:class:`Pending`) and runs :func:`~hogwild_plugins.ps.replication.executor.run_round` for them
with a :class:`PrimaryRound` as its host: the round's decisions
(:mod:`~hogwild_plugins.ps.replication.commit_round`) are carried out here on the server's
admission (each update's version), its update engine (applied here, then waited for), its peer
link (the ``PREPARE`` and ``COMMIT`` exchanges with the copies) and its replier (the answers to
the clients). A copy the round drops goes to its bucket's role through the replication's own
effects (:class:`~hogwild_plugins.ps.replication.adapter.Replication`), which this host hands on.
None of the effects yields: each does its I/O in place.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hogwild_plugins.ps.replication.local import LOCAL_APPLY_S, Countdown
from hogwild_plugins.ps.work import Kind, Work

from hogwild.errors import HogwildError
from hogwild.net.channel import Request
from hogwild.net.router import error_reply
from hogwild.net.wire import ErrorCode, Header, MsgType, WireError, pack_header

__all__ = ["Pending", "PrimaryRound"]


@dataclass
class Pending:
    """A client's update waiting for the replication thread."""

    header: Header
    shard: int
    work: Work
    frames: list


class PrimaryRound:
    """The effects of one commit round of ``batch`` on ``replication``'s server (see the
    module docstring)."""

    def __init__(self, replication, batch: list[Pending]) -> None:
        self.replication, self.batch = replication, batch
        self.done: Countdown | None = None  # the local application, once queued

    # -- the bucket roles' effects (a dropped copy): the replication's own

    def stimulus(self, what: str) -> str:
        return self.replication.stimulus(what)

    def replace_record(self, action) -> Iterator[str]:
        return self.replication.replace_record(action)

    def lease_time(self) -> float:
        return self.replication.lease_time()

    def record_written(self, action, done: bool) -> None:
        self.replication.record_written(action, done)

    def etcd_failed(self, exc: Exception) -> None:
        self.replication.etcd_failed(exc)

    def send_snapshot(self, action) -> Iterator[str]:
        return self.replication.send_snapshot(action)

    def commit_prepared(self, bucket: int) -> None:
        self.replication.commit_prepared(bucket)

    def stopped_here(self, bucket: int) -> bool:
        return self.replication.stopped_here(bucket)

    # -- the round's effects

    def round(self, stimulus) -> list:
        """The commit round's answer (under the lock: it reads and records in the shard logs
        the copy side changes)."""
        r = self.replication
        with r.lock:
            return r.commit_round.handle(stimulus)

    def valid(self) -> bool:
        return self.replication.valid()

    def refuse(self, index: int) -> None:
        p = self.batch[index]
        self._error(p.header, self.replication.not_primary(p.header, p.shard))

    def answer_duplicate(self, index: int, version: int) -> None:
        self.replication.replier.send(self.batch[index].header.reply(MsgType.ACK, version=version))

    def admit(self, indices: tuple[int, ...]) -> dict[int, int]:
        versions = {}
        for i in indices:
            p = self.batch[i]
            try:
                self.replication.server.admission.admit(p.header, p.shard, p.work)
            except WireError as exc:
                self._error(p.header, exc)
                continue
            versions[i] = p.work.version
        return versions

    def apply_locally(self, indices: tuple[int, ...]) -> None:
        # under the lock: a newer primary's snapshot restored on the network or refresher thread
        # (its restore queued under the same lock) lands either before the check or after these
        # updates in the engine's queue, never beneath them
        r = self.replication
        with r.lock:
            mine = [i for i in indices if r.commit_round.ours(i)]
            self.done = Countdown(len(mine))
            r.local.apply([self.batch[i].work for i in mine], self.done)

    def send_prepares(self, prepares) -> Iterator[str]:
        yield from ()
        link = self.replication.link
        requests = [self._prepare_request(self.batch[i], copy) for i, copy in prepares]
        return frozenset(link.failures(requests, link.exchange(requests)))

    def send_commits(self, commits) -> Iterator[str]:
        yield from ()
        r = self.replication
        requests = []
        for shard, copy, version in commits:
            role = r.roles[r.layout.bucket_of(shard)]
            requests.append(Request(copy, r.link.header(MsgType.COMMIT, shard, version, role)))
        return frozenset(r.link.failures(requests, r.link.exchange(requests)))

    def await_applied(self) -> Iterator[str]:
        yield from ()
        if not self.done.wait(LOCAL_APPLY_S):
            raise HogwildError(f"local updates were not applied within {LOCAL_APPLY_S:g} s")

    def acknowledge(self, index: int, version: int) -> None:
        p = self.batch[index]
        if p.work.refused is not None:  # refused by its applier, here as on every copy
            self._error(p.header, WireError(p.work.failed, ErrorCode(p.work.refused)))
            return
        if p.work.failed is not None:  # committed on the copies, failed here: never ACKed
            r = self.replication  # here; the bucket stops and is handed to a copy, where the
            text = (  # client's re-send is answered with the version its copies committed
                f"update of shard {p.shard} failed to apply on server {r.me}, its primary "
                f"({p.work.failed}); the bucket stops here and goes to an in-sync copy: re-read "
                "the map and send again"
            )
            self._error(p.header, WireError(text, ErrorCode.STOPPED))
            return
        self.replication.replier.send(p.header.reply(MsgType.ACK, version=version, a=p.work.result))
        self.replication.acknowledged(p.shard)

    def _prepare_request(self, p: Pending, copy: int) -> Request:
        r = self.replication
        role = r.roles[r.layout.bucket_of(p.shard)]
        header = r.link.header(
            MsgType.PREPARE, p.shard, p.work.version, role, a=coefficient(p),
            frames=1 + len(p.frames),
        )  # fmt: skip
        return Request(copy, header, [pack_header(p.header), *p.frames])

    def _error(self, header: Header, exc: WireError) -> None:
        reply = error_reply(header, exc.code, str(exc))
        self.replication.replier.send(reply.header, reply.frames)


def coefficient(p: Pending) -> float:
    """The staleness coefficient the primary gave the update (copies apply the same)."""
    if p.work.kind == Kind.VECTORS:
        return -p.work.coef / p.header.a if p.header.a else 0.0
    return float(p.work.coef)
