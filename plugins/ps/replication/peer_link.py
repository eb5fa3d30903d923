"""A primary's messages to its copies: headers that carry its epoch and lease, and exchanges.

Every message a primary sends a copy (``PREPARE``, ``COMMIT``, ``SNAPSHOT``) carries the bucket's
epoch (``aux``) and this server's lease, which the copy's gate checks. An exchange sends a list of
them, pipelined, and says which were acknowledged: a copy that does not answer within
``PEER_TIMEOUT_S`` (and one retry) fails every request of the exchange still unanswered, the
others go on; a copy that answers ``FENCED`` tells the bucket's role (a newer primary exists: it
steps down at once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from hogwild_plugins.ps.layout import ShardLayout
from hogwild_plugins.ps.replication.bucket_role import BucketRole
from hogwild_plugins.ps.replication.bucket_role_events import Fenced

from hogwild.net.channel import Peers, PeerUnreachableError, Request
from hogwild.net.wire import ErrorCode, Header, MsgType

__all__ = ["PEER_SENDER", "PEER_TIMEOUT_S", "PeerLink"]

PEER_SENDER = 0xFFFF0000  # a server's sender id towards its peers (+ its index; 32 bits)
PEER_TIMEOUT_S = 0.3  # a copy that does not answer a prepare within this (and a retry) is dropped


class PeerLink:
    """One server's connections to the others, as a primary (see the module docstring).

    Args:
        job: The job's id (every header carries it).
        layout: Which bucket each shard is in.
        roles: Every bucket's role (a ``FENCED`` answer is fed to it).
        lease: This server's lease now.
        stimulus: A new stimulus id for what happened (``"fenced"``).

    A ``FENCED`` answer goes to the bucket's role, or, when ``on_fenced`` is set (a link of
    another thread than the roles'), to ``on_fenced(bucket)`` instead.
    """

    def __init__(
        self,
        job: int,
        layout: ShardLayout,
        roles: Mapping[int, BucketRole],
        lease: Callable[[], int],
        stimulus: Callable[[str], str],
    ) -> None:
        self.job, self.layout, self.roles = job, layout, roles
        self.lease, self.stimulus = lease, stimulus
        self.peers: Peers | None = None
        self.on_fenced: Callable[[int], None] | None = None

    def open(self, servers: list[str], me: int, keys: str | None) -> None:
        self.peers = Peers(
            servers, sender=PEER_SENDER + me, timeout_s=PEER_TIMEOUT_S, retries=1, keys=keys
        )

    def close(self) -> None:
        if self.peers is not None:
            self.peers.close()
            self.peers = None

    def header(
        self,
        kind: MsgType,
        shard: int,
        version: int,
        role: BucketRole,
        epoch: int | None = None,
        **fields,
    ) -> Header:
        """A message of this primary to a copy: the bucket's epoch (``epoch``, default the
        role's now) and this server's lease, which the copy's gate checks."""
        return Header(
            kind,
            job=self.job,
            target=shard,
            version=version,
            lease=self.lease(),
            aux=role.epoch if epoch is None else epoch,
            **fields,
        )

    def exchange(self, requests: list[Request], codes: list | None = None) -> list[bool]:
        """Send ``requests`` to the copies; True for each acknowledged. A copy that does not
        answer fails all of its requests; one that answers ``FENCED`` deposes its bucket here.
        ``codes``, if given, gets each answer's :class:`ErrorCode` (None: acknowledged, or no
        answer)."""
        ok = [False] * len(requests)
        if codes is not None:
            codes[:] = [None] * len(requests)
        answered = [False] * len(requests)
        for i, req in enumerate(requests):

            def on_reply(h: Header, frames: list, i=i, req=req) -> None:
                answered[i] = True
                if h.type == MsgType.ACK:
                    ok[i] = True
                elif codes is not None and h.type == MsgType.ERROR:
                    codes[i] = h.code
                if h.type == MsgType.ERROR and h.code == ErrorCode.FENCED:
                    bucket = self.layout.bucket_of(req.header.target)
                    if self.on_fenced is not None:
                        self.on_fenced(bucket)
                    else:
                        self.roles[bucket].handle(Fenced(stimulus_id=self.stimulus("fenced")))

            req.on_reply = on_reply
        todo, dead = list(requests), set()
        while todo:
            try:
                self.peers.exchange(todo)
                break
            except PeerUnreachableError as exc:
                named = {i for i, a in enumerate(self.peers.addresses) if str(a) == exc.address}
                if not named:  # cannot tell whom: give up on everything still unanswered
                    break
                dead |= named
                todo = [
                    r for i, r in enumerate(requests) if not answered[i] and r.server not in dead
                ]
                for r in todo:
                    r.attempts = 0
        return ok

    def failures(self, requests: list[Request], ok: list[bool]) -> set[tuple[int, int]]:
        """``(bucket, copy)`` for each request not acknowledged."""
        out = set()
        for req, good in zip(requests, ok, strict=True):
            if not good:
                out.add((self.layout.bucket_of(req.header.target), req.server))
        return out
