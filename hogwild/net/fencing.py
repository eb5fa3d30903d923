"""Fencing tokens: which incarnation of a cluster job's replica a request comes from, and refusing
the incarnations the driver replaced.

A replica the driver takes for dead (it exited, or it stopped answering: paused, or on a host cut
off from the driver) is restarted and its portions go to others; the old process may still live
and push (a zombie). Every request a replica's parameter-store clients send carries its
**fencing token** in the header's ``lease`` field (unused by client requests otherwise):
``(replica + 1) << 32 | incarnation``, where the driver numbers a replica's starts 0, 1, 2, ...
Token 0 is no replica (the driver, tools, coordinators): never refused.

Before the driver hands a lost replica's portions to another, it tells every server of the job
the replica's next incarnation (a ``fence`` control request); a server then refuses every request
carrying an older incarnation of that replica with ``REPLACED``, counts it, and says why, and the
zombie's client stops. :class:`FenceTable` is that server-side state: no I/O, monotonic (a fence
never goes back), bounded by the number of replicas a token can name. This is the fencing token of
Kleppmann's "How to do distributed locking" and of Chubby's sequencers, held per replica.
"""

from __future__ import annotations

__all__ = [
    "MAX_INCARNATION",
    "MAX_REPLICA",
    "FenceTable",
    "ReplacedError",
    "fencing_token",
    "token_parts",
]

MAX_REPLICA = 2**31 - 2
"""The largest replica index a token names."""
MAX_INCARNATION = 2**32 - 1
"""The largest incarnation (starts of one replica) a token names."""


class ReplacedError(Exception):
    """A request from an incarnation of a replica that the driver replaced."""


def fencing_token(replica: int, incarnation: int) -> int:
    """The token of ``replica``'s ``incarnation`` (its starts numbered from 0)."""
    if not 0 <= replica <= MAX_REPLICA:
        raise ValueError(f"replica {replica!r}: expected 0..{MAX_REPLICA}")
    if not 0 <= incarnation <= MAX_INCARNATION:
        raise ValueError(f"incarnation {incarnation!r}: expected 0..{MAX_INCARNATION}")
    return (replica + 1) << 32 | incarnation


def token_parts(token: int) -> tuple[int, int] | None:
    """``(replica, incarnation)`` of a token; None for token 0 (no replica)."""
    if token == 0:
        return None
    return (token >> 32) - 1, token & MAX_INCARNATION


class FenceTable:
    """The incarnations a server still takes, per replica (see the module docstring).

    Attributes:
        fences: replica -> the oldest incarnation still taken.
        refused: replica -> requests refused from its replaced incarnations.
    """

    def __init__(self) -> None:
        self.fences: dict[int, int] = {}
        self.refused: dict[int, int] = {}

    def fence(self, replica: int, incarnation: int) -> int:
        """Refuse ``replica``'s incarnations older than ``incarnation`` from now on; the fence
        in force after (a lower one than the table holds changes nothing)."""
        fencing_token(replica, incarnation)  # range checks, with the field named
        now = max(self.fences.get(replica, 0), incarnation)
        self.fences[replica] = now
        return now

    def check(self, token: int) -> None:
        """Nothing for a token still taken; :class:`ReplacedError` naming the replica, its
        incarnation and the fence for a replaced one (counted)."""
        if not self.fences or token == 0:
            return
        replica, incarnation = (token >> 32) - 1, token & MAX_INCARNATION
        fence = self.fences.get(replica)
        if fence is None or incarnation >= fence:
            return
        self.refused[replica] = self.refused.get(replica, 0) + 1
        raise ReplacedError(
            f"replica {replica} incarnation {incarnation} was replaced: the driver restarted it "
            f"as incarnation {fence} and handed its portions to others; this process must stop"
        )

    def status(self) -> dict:
        """The fences and refusals, for a server's status (JSON keys are strings)."""
        return {
            "fences": {str(r): i for r, i in sorted(self.fences.items())},
            "replaced_refused": sum(self.refused.values()),
        }

    def validate_state(self) -> None:
        for replica, incarnation in self.fences.items():
            assert 0 <= replica <= MAX_REPLICA and 0 <= incarnation <= MAX_INCARNATION
        assert set(self.refused) <= set(self.fences)
