"""A compare-and-swap whose proposal may have been lost: its outcome read back, asked again only
if it did not happen.

A follower forwards a write's proposal to the leader it knows; a leader that is gone (its host cut
off, the follower not yet aware) drops it without an answer, and etcd says ``proposal dropped`` or
``leader changed`` only when the follower already knows there is no leader, so the write waits out
the client's whole timeout (2 s) though the member learns a new leader within about one election
timeout. :func:`swap` therefore asks a transaction that compares one key's ``mod_revision`` (the
map's compare-and-swaps: a copy dropped, a takeover won) with a short first timeout
(``write_retry_s``, sized from the election timeout: :func:`write_retry_s`), and when it did not
answer (or answered that it may have failed), reads back what the keys hold (a hedged read, from
this host's own member first, where there is one, else the member asked):

- the compared key still at the expected revision: the transaction has not applied (as of that
  linearizable read), so asking it again is safe: it compares the same revision, so of the two
  asks at most one can ever apply;
- the key changed, and every key the transaction writes holds exactly this transaction's value
  and lease at one ``mod_revision`` (a transaction's writes share one): ours won;
- otherwise another write came first: ours lost, and can never apply, its compared revision gone.

A refusal is judged so only after an ask of unknown fate (our own earlier ask may be what changed
the key); a first ask refused is False whatever the keys hold, as without read-backs: a role
that builds the record another wrote (a hand-over and its successor's campaign) or that it wrote
itself from an older revision must hear that its write did not apply. A read-back after an ask
of unknown fate cannot tell an identical value written by another from the same revision (two
servers dropping the same copy) from ours: it reads back as ours, the same map either way. A
create (expected revision 0) whose key is deleted again before a lost first ask arrives late
could apply twice; every other compare-and-swap applies at most once. All of it within the
client's timeout: what did not settle by then raises the first :class:`EtcdUnavailable`, as a
write of unknown fate did before. Deletes, blind puts and lease grants are not asked again (the
client's plain write path).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from hogwild_plugins.ps.etcd_errors import EtcdUnavailable
from hogwild_plugins.ps.etcd_errors import reply_int as _int

from hogwild.errors import HogwildError

if TYPE_CHECKING:
    from hogwild_plugins.ps.etcd import Etcd

__all__ = ["LOST", "UNAPPLIED", "WON", "judge", "swap", "write_retry_s"]

WON, LOST, UNAPPLIED = "won", "lost", "unapplied"
READ_BACK_TRIES = 2
"""How many times the read-back asks one member (``write_retry_s`` apart) before the next: a
member that knew no leader when first asked may know one by the second ask."""


def write_retry_s(election_ms: int, timeout_s: float) -> float:
    """The first timeout of a compare-and-swap (:func:`swap`) at members of election timeout
    ``election_ms``, by a client whose requests have ``timeout_s`` in all: two election
    timeouts and at least 0.25 s, but never more than the share of ``timeout_s`` that leaves
    the read-back its :data:`READ_BACK_TRIES` asks (which wins over the 0.25 s floor). A member
    whose leader is gone learns so within one to two election timeouts (raft's randomized
    timeout), and a new leader within another round trip; a write that commits answers in
    milliseconds, so one slower than this on a loaded host only costs a read-back that finds it
    applied. With long elections the cap reads back before a new leader is known: an ask then
    still unapplied is asked again (the same compared revision), where a first ask given the
    whole budget would end unknown."""
    if election_ms <= 0:
        raise HogwildError(f"etcd election timeout {election_ms!r} ms: expected more than 0")
    return min(max(0.25, 2 * election_ms / 1000), timeout_s / (1 + READ_BACK_TRIES))


def judge(kvs: list[list[dict]], expected: int, puts: list[dict]) -> str:
    """The outcome of a compare-and-swap of ``puts`` (etcd put requests: ``key``, ``value``,
    ``lease``, base64 as sent) comparing the first put's key with ``expected`` mod_revision, from
    ``kvs``: each put's key as a range read it (a list of zero or one kv), all at one revision.
    :data:`UNAPPLIED` when that key is still at ``expected`` (absent for 0), :data:`WON` when
    every put's key holds its value and lease at one mod_revision, else :data:`LOST`."""
    if len(kvs) != len(puts):
        raise HogwildError(f"etcd read-back: {len(kvs)} ranges for {len(puts)} keys")
    first = kvs[0][0] if kvs[0] else None
    revision = 0 if first is None else _int(first, "mod_revision", "the read-back")
    if revision == expected:
        return UNAPPLIED
    for found, put in zip(kvs, puts, strict=True):
        if len(found) != 1:
            return LOST  # a key this transaction writes is absent: another write deleted it
        kv = found[0]
        if (
            _int(kv, "mod_revision", "the read-back") != revision
            or kv.get("value", "") != put["value"]
            or _int(kv, "lease", "the read-back", default=0) != int(put.get("lease") or 0)
        ):
            return LOST
    return WON


def swap(etcd: Etcd, compares: list[dict], puts: list[dict], expected: int) -> bool:
    """Ask ``etcd`` the transaction of ``puts`` if ``compares`` hold (the first comparing the
    first put's key's mod_revision with ``expected``), as the module docstring says: True when it
    is known to be ours (applied, once), False when it is not known to be ours (refused; or read
    back after an ask of unknown fate and found changed by another write or a lapsed lease, which
    may hide a swap that applied: the roles treat that as a lost campaign).

    Raises:
        EtcdUnavailable: Its outcome was not known within the client's timeout (the first such
            error: it may have applied).
    """
    ranges = [{"request_range": {"key": put["key"]}} for put in puts]
    query = {
        "compare": compares,
        "success": [{"request_put": put} for put in puts],
        "failure": ranges,  # a refused swap says at once what the keys hold
    }
    read_back = {"compare": [], "success": ranges, "failure": []}
    deadline = time.monotonic() + etcd.timeout_s
    unknown: EtcdUnavailable | None = None  # the first ask whose outcome was not known
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise unknown or EtcdUnavailable(f"etcd at {etcd.address}: no time left to ask")
        try:
            reply = etcd._post("/kv/txn", query, timeout_s=min(etcd.write_retry_s, left))
        except EtcdUnavailable as err:
            unknown = unknown or err
            # read back first from this host's own member (never cut off from this process: the
            # member asked may be a cut host's), else the member asked (it learns a new leader)
            first = etcd._near if etcd._near is not None else etcd.unknown_at
            if first is not None:
                etcd._settle(first)
            try:
                reply, _ = etcd._hedged(
                    "/kv/txn", read_back, etcd.write_retry_s, READ_BACK_TRIES,
                    deadline=deadline,
                )  # fmt: skip
            except EtcdUnavailable:
                raise unknown from None
            verdict = judge(_ranges(etcd, reply), expected, puts)
            if verdict == UNAPPLIED:
                continue  # not applied: asked again, safely (the same compared revision)
            return verdict == WON
        if reply.get("succeeded") is True:
            return True
        if unknown is None:
            # refused, and no ask of this swap was ever of unknown fate: nothing of it applied,
            # whatever the keys hold (a byte-identical record another role wrote, or this one
            # wrote before from an older revision; a guard that failed), as without read-backs
            return False
        # refused after an ask of unknown fate: another write came first, or that ask applied
        return judge(_ranges(etcd, reply), expected, puts) == WON


def _ranges(etcd: Etcd, reply: dict) -> list[list[dict]]:
    """Each range's kvs from a transaction's ``reply`` (its ``responses``)."""
    responses = reply.get("responses") or []
    if not isinstance(responses, list):
        raise HogwildError(f"etcd at {etcd.address}: malformed reply {reply!r:.200}")
    found = []
    for response in responses:
        ranged = response.get("response_range") if isinstance(response, dict) else None
        if not isinstance(ranged, dict):
            raise HogwildError(f"etcd at {etcd.address}: malformed reply {reply!r:.200}")
        found.append(etcd._kvs(ranged))
    return found
