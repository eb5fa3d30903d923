"""The job's nonce in etcd: which history of the job's keys a record write was decided in.

A replicated job's bucket records (``sync/<b>``) are replaced by compare-and-swap on their mod
revision (:mod:`~hogwild_plugins.ps.failover`), decided from a read of the map. Revisions alone
do not name a history: an etcd restarted from an empty data directory counts its revisions
again from 1, so a transaction decided from a read of the old etcd can find a key of the new one
at the very mod revision it expects, and land. The nonce closes that window: a random value at
``nonce``, written by the first server to read the map and find none (at a job's start: the
driver's controller deletes every key of an earlier run first; after etcd lost its keys). A
server takes the nonce of each read of the map as its own (:func:`adopt`), and every
transaction it decides from that read compares it, byte for byte: a new etcd lacks it, or holds
another, so such a transaction fails, and the record read back beside it reads as absent. The
role answers as after a wipe of the job's keys (:mod:`~hogwild_plugins.ps.replication.bucket_role`:
a bucket it had seen a record of is lost, never started afresh); the next read of the map adopts
the new history's nonce, where only buckets nobody had seen may start. An etcd restored from a
backup of the same run holds the same nonce: older records there are the roles' to refuse
(their epochs went back), not the nonce's. A nonce written by hand in other bytes than a put
writes (a space, another order) would fail every guarded write: :func:`adopt` rewrites it in
the canonical form, checked once per mod revision of the key.
"""

from __future__ import annotations

import secrets

from hogwild.errors import HogwildError

__all__ = ["NONCE_KEY", "JobNonce", "adopt"]

NONCE_KEY = "nonce"  # below the job's prefix, beside members/ and sync/
NONCE_BYTES = 16


class JobNonce:
    """One history's nonce (``token``: hex digits)."""

    def __init__(self, token: str, revision: int = 0) -> None:
        if not (
            isinstance(token, str)
            and len(token) == 2 * NONCE_BYTES
            and all(c in "0123456789abcdef" for c in token)
        ):
            raise HogwildError(
                f"etcd key {NONCE_KEY}: nonce {token!r:.80} is not {2 * NONCE_BYTES} lowercase "
                "hex digits"
            )
        self.token = token
        self.revision = revision  # the key's mod revision its bytes were checked at (0: none)

    @classmethod
    def fresh(cls) -> JobNonce:
        return cls(secrets.token_hex(NONCE_BYTES))

    def value(self) -> dict:
        """The key's value, as written and as every transaction compares it."""
        return {"nonce": self.token}

    @property
    def guard(self) -> tuple[str, dict]:
        """``(key, value)`` for :meth:`~hogwild_plugins.ps.etcd.Etcd.replace`'s ``guard``."""
        return NONCE_KEY, self.value()

    def ours(self, value: dict | None) -> bool:
        """Whether ``value`` (the key as read; None: absent) is this nonce."""
        return value == self.value()

    def __repr__(self) -> str:
        return f"JobNonce({self.token})"


def adopt(
    etcd, seen: dict | None = None, revision: int = 0, known: JobNonce | None = None
) -> JobNonce:
    """The job's nonce as a read of the map found it (``seen``: the ``nonce`` key's value in
    that read, ``revision`` its mod revision; None: absent): that one, checked (its bytes those
    every guarded write compares, rewritten so if they are not), or, if the read found none, one
    written now (or, written by another server meanwhile, that one). ``known``: the nonce the
    last read adopted (its check is not asked again while the key stays at its revision).

    Raises:
        HogwildError: The key holds something that is not a nonce; etcd unreachable.
    """
    for _ in range(3):  # created and deleted again between the two requests: read once more
        if seen is not None:
            if set(seen) != {"nonce"}:
                raise HogwildError(
                    f"etcd key {NONCE_KEY}: {seen!r:.120} is not a job nonce "
                    '(expected {"nonce": HEX})'
                )
            nonce = JobNonce(seen["nonce"], revision)
            checked = known is not None and (known.token, known.revision) == (nonce.token, revision)
            if checked and revision:
                return known
            if etcd.holds(NONCE_KEY, nonce.value()):
                return nonce
            # the same nonce in other bytes (written by hand): rewritten as a put writes it
            value, revision = etcd.get(NONCE_KEY)
            if value == nonce.value():
                etcd.replace(NONCE_KEY, nonce.value(), revision)
                value, revision = etcd.get(NONCE_KEY)
            seen = value
            continue
        mine = JobNonce.fresh()
        if etcd.create(NONCE_KEY, mine.value()):
            return mine
        seen, revision = etcd.get(NONCE_KEY)
    raise HogwildError(f"etcd key {NONCE_KEY}: neither created nor read (deleted meanwhile)")
