"""Where each bucket's primary is, read from etcd (replicated parameter servers, copies > 1).

The map lives in etcd under ``/hogwild/<job>/`` (see :mod:`~hogwild_plugins.ps.failover`):
``members/<i>`` for every live server, ``sync/<b>`` for every bucket's record. A job of several
server groups keeps each group's map in a namespace of its own, ``/hogwild/<job>/groups/<g>/``
(:func:`etcd_prefix`): every group numbers its servers and buckets from 0, so two groups under
one prefix would read each other's members and records. Servers and
clients read it the same way, through :func:`read_map`; :class:`Routes` is a client's copy, read
again when a request fails (the primary died, or stepped down) until every bucket it needs has a
live primary. Its reads are hedged (:data:`~hogwild_plugins.ps.etcd.READ_HEDGE_S`): the
member it reads from may be on the host a fault just cut, which holds a read until it times out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from hogwild_plugins.ps.etcd import READ_HEDGE_S, Etcd, EtcdUnavailable
from hogwild_plugins.ps.failover import BucketRecord, MemberRecord
from hogwild_plugins.ps.job_nonce import NONCE_KEY, JobNonce

from hogwild.errors import HogwildError
from hogwild.net.channel import Cancelled

__all__ = ["Routes", "etcd_prefix", "parse_map", "read_map", "read_record", "write_record"]

RETRY_S = 0.02


def etcd_prefix(job: str, group: int | None = None) -> str:
    """Every key of a job lives under ``/hogwild/<job>/``; with ``group`` (a job of several
    server groups), that group's keys live under ``/hogwild/<job>/groups/<group>/``, which no
    other group's prefix contains (the job's own keys, such as the driver's claim, stay above).

    Raises:
        HogwildError: ``group`` is not a non-negative integer.
    """
    if group is None:
        return f"/hogwild/{job}/"
    if isinstance(group, bool) or not isinstance(group, int) or group < 0:
        raise HogwildError(f"server group {group!r}: expected an integer >= 0, or None")
    return f"/hogwild/{job}/groups/{group}/"


def read_map(etcd: Etcd, n_servers: int, n_buckets: int):
    """The live members ``{index: MemberRecord}`` and every bucket's record (None: none yet),
    each checked.

    Raises:
        HogwildError: A record or a member that is not one (naming its key); EtcdUnavailable.
    """
    return parse_map(etcd.get_prefix("")[0], n_servers, n_buckets)


def parse_map(entries: dict, n_servers: int, n_buckets: int):
    """:func:`read_map` of the job's keys as :meth:`~hogwild_plugins.ps.etcd.Etcd.get_prefix`
    returned them (``{key: (value, mod_revision)}``), for a reader that needs another key of
    the same read (a server's nonce: :mod:`~hogwild_plugins.ps.job_nonce`).

    Raises:
        HogwildError: A record or a member that is not one (naming its key).
    """
    members: dict[int, MemberRecord] = {}
    records: list[BucketRecord | None] = [None] * n_buckets
    for key, (value, revision) in entries.items():
        kind, _, index = key.partition("/")
        if not (index.isascii() and index.isdigit()):  # "²" is a digit to isdigit, not to int
            continue
        i = int(index)
        if kind == "members" and 0 <= i < n_servers:
            try:
                members[i] = MemberRecord.parse(value, n_buckets, f"etcd key members/{i}")
            except ValueError as exc:
                raise HogwildError(str(exc)) from exc
        elif kind == "sync" and 0 <= i < n_buckets:
            try:
                records[i] = BucketRecord.parse(value, revision, n_servers, f"etcd key sync/{i}")
            except ValueError as exc:
                raise HogwildError(str(exc)) from exc
    return members, records


def read_record(
    etcd: Etcd, bucket: int, n_servers: int, nonce: JobNonce | None = None
) -> BucketRecord | None:
    """``sync/<bucket>``, checked (None: absent, or, with ``nonce``, etcd's keys are no longer
    that nonce's history: :mod:`~hogwild_plugins.ps.job_nonce`).

    Raises:
        HogwildError: A value that is not a record (naming the key); EtcdUnavailable.
    """
    key = f"sync/{bucket}"
    value, revision = etcd.get(key)
    # the nonce read after the record: an etcd restarted between the two reads is caught
    if value is None or (nonce is not None and not nonce.ours(etcd.get(NONCE_KEY)[0])):
        return None
    try:
        return BucketRecord.parse(value, revision, n_servers, f"etcd key {key}")
    except ValueError as exc:
        raise HogwildError(str(exc)) from exc


def write_record(
    etcd: Etcd, bucket: int, record: BucketRecord, expected: int, nonce: JobNonce
) -> bool:
    """Replace ``sync/<bucket>`` with ``record`` if its mod revision is still ``expected``
    (0: absent) and the job's nonce is still ``nonce``, the history the write was decided in
    (:mod:`~hogwild_plugins.ps.job_nonce`): whether it was written."""
    return etcd.replace(f"sync/{bucket}", record.value(), expected, guard=nonce.guard)


class Routes:
    """A client's view of the bucket map: the primary of every bucket.

    Args:
        etcd: ``HOST:PORT`` of the job's etcd.
        job: The job's name.
        n_servers, n_buckets: From the layout.
        tls: A directory of etcd certificates.
        group: The server group whose map it is (several server groups); None: the job's.
    """

    def __init__(
        self, etcd: str, job: str, n_servers: int, n_buckets: int, tls: str | None = None,
        group: int | None = None,
    ) -> None:  # fmt: skip
        # hedged: a read held by a member on a cut host is asked of the next one after
        # READ_HEDGE_S, not waited out for the whole request timeout during the failover
        self.etcd = Etcd(etcd, prefix=etcd_prefix(job, group), tls=tls, read_hedge_s=READ_HEDGE_S)
        self.n_servers, self.n_buckets = n_servers, n_buckets
        self.primaries: list[int | None] = [None] * n_buckets
        self.epochs = [0] * n_buckets
        self.members: set[int] = set()
        self.lease_s = 0.0  # the longest lease of a live server (0: not known yet)
        self.reads = 0  # map reads asked of etcd (each a range read of the job's prefix)

    def read(self) -> None:
        self.reads += 1
        members, records = read_map(self.etcd, self.n_servers, self.n_buckets)
        self.members = set(members)
        if members:  # each TTL at most MAX_LEASE_S: MemberRecord.parse refuses a longer one
            self.lease_s = float(max(m.lease_s for m in members.values()))
        for b, record in enumerate(records):
            live = (  # a primary restarted since has a new lease: it is not this record's
                record is not None
                and record.primary in members
                and members[record.primary].lease == record.lease
            )
            self.primaries[b] = record.primary if live else None
            self.epochs[b] = record.epoch if record is not None else 0

    def wait(
        self,
        buckets: Iterable[int],
        deadline: float,
        away_from: dict | None = None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> None:
        """Read the map until every one of ``buckets`` has a live primary (and, for those in
        ``away_from``, a newer epoch than the one given, or ``away_from``'s deadline passed).

        Raises:
            HogwildError: Past ``deadline`` (naming the buckets without a primary).
            Cancelled: ``cancelled()`` turned true (the client is stopping).
        """
        wanted = set(buckets)
        while True:
            if cancelled():
                raise Cancelled("waiting for the parameter servers' primaries: cancelled")
            try:
                self.read()
            except EtcdUnavailable:  # a blip during a failover: read again until the deadline
                if time.monotonic() > deadline:
                    raise
                time.sleep(RETRY_S)
                continue
            now = time.monotonic()
            missing = sorted(b for b in wanted if self.primaries[b] is None)
            moving = [
                b
                for b, (epoch, until) in (away_from or {}).items()
                if self.epochs[b] <= epoch and now < until
            ]
            if not missing and not moving:
                return
            if now > deadline:
                raise HogwildError(
                    f"no live primary for buckets {missing or moving} of the parameter servers "
                    "(every copy of them is down, or etcd is)"
                )
            time.sleep(RETRY_S)

    def server_of(self, bucket: int) -> int:
        primary = self.primaries[bucket]
        return 0 if primary is None else primary

    def close(self) -> None:
        self.etcd.close()
