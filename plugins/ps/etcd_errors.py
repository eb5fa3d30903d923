"""What an etcd member's answer means: the errors a request to etcd raises and the one reading of
its JSON gateway's error replies.

Shared by the etcd client (:mod:`hogwild_plugins.ps.etcd`) and the watch's polls
(:mod:`hogwild_plugins.ps.etcd_poll`), which build their requests apart (the polls on kept
connections of their own) but must read a failure the same way: whether the member is down, so
that a read asks the next one, or the request itself was refused.
"""

from __future__ import annotations

import json

from hogwild.errors import HogwildError

__all__ = [
    "DOWN_STATUSES",
    "LEADER_CHANGED",
    "LEADERLESS",
    "PROPOSAL_DROPPED",
    "MemberDown",
    "EtcdClusterLost",
    "EtcdReplyError",
    "EtcdUnavailable",
    "LeaseExpired",
    "gateway_error",
    "is_etcd_error",
    "reply_object",
    "request_error",
    "reply_int",
    "unreached",
]

LEADER_CHANGED = "leader changed"
"""etcd's error for a request that outlived its leader. etcd says it only once a new leader is
known (its leader-changed notice fires for a leader, never for none): the member that says it
follows a leader again, and a read asked of it again at once is answered (:mod:`.etcd`)."""
PROPOSAL_DROPPED = "raft proposal dropped"
"""etcd's error for a write its member's own raft refused before appending or forwarding it (a
follower that knows no leader, a candidate, a leader handing over: raft's ``ErrProposalDropped``,
returned by ``Step`` so that etcd fails fast, etcd-io/etcd#9067): never applied anywhere, so
safe to send to another member. etcd 3.4's gateway answers it with HTTP 500, not 503."""
LEADERLESS = (
    "no leader",
    "leader changed",
    "timed out",
    "too many requests",
    "stopped",
    PROPOSAL_DROPPED,
)
DOWN_STATUSES = frozenset({408, 503, 504})  # the gateway's "unavailable" and "timed out"


class MemberDown(Exception):
    """One member did not answer a request of the client's (not raised to its callers): why,
    whether the request surely never took effect, and whether it was the client's own timeout
    that ended the wait."""

    def __init__(self, why: str, unsent: bool, timed_out: bool = False) -> None:
        super().__init__(why)
        self.why, self.unsent, self.timed_out = why, unsent, timed_out
        # etcd answers "leader changed" only once a new leader is known: the member can serve
        self.elected = LEADER_CHANGED in why.lower()


class EtcdUnavailable(HogwildError):
    """etcd cannot be reached (refused, timed out, no leader); the message names the address."""


class EtcdClusterLost(EtcdUnavailable):
    """No member of the etcd cluster answered one request (each member's failure named)."""


class LeaseExpired(HogwildError):
    """A write named a lease that etcd does not know: it expired or was revoked."""


class EtcdReplyError(HogwildError):
    """A member's reply that is no answer of etcd's (not JSON, not a JSON object, no API path
    found, an error status whose body is not etcd's error object: a proxy's HTML 502, Go's plain
    "404 page not found"): a fault of that member (broken, or not etcd at all), not of the
    request, which another member may answer. An error etcd answers about the request itself (a
    lease not found, a compacted revision, an invalid argument) is a plain
    :class:`HogwildError`: every member would answer it the same."""


def gateway_error(status: int, text: str) -> tuple[bool, str] | None:
    """What etcd's JSON gateway meant by a reply of ``status`` with body ``text``: None for a
    success, else ``(down, detail)``. ``down``: the member cannot answer now (408, 503, 504, as
    etcd3gw read them, or a :data:`LEADERLESS` error), so a read asks the next member;
    ``detail``: the status and the error's ``message`` (or the plain text). The one classifier
    of :meth:`Etcd._post_to` and of the watch's polls (:mod:`~hogwild_plugins.ps.etcd_poll`),
    so that the two cannot drift apart."""
    if status == 200:
        return None
    try:
        reply = json.loads(text)
    except ValueError:
        reply = None
    said = (reply.get("message") or reply.get("error")) if isinstance(reply, dict) else None
    detail = f"HTTP {status}: {said or text.strip()}"[:400]
    down = status in DOWN_STATUSES or any(word in detail.lower() for word in LEADERLESS)
    return down, detail


def is_etcd_error(text: str) -> bool:
    """Whether ``text``, the body of an error reply, is etcd's gateway's error object (a JSON
    object naming the error in ``error`` or ``message``, as ``{"error": "etcdserver: ...",
    "code": 5, "message": "etcdserver: ..."}``): only such a reply is etcd's answer about the
    request; any other (a proxy's page, a server that is not etcd) is the member's fault."""
    try:
        reply = json.loads(text)
    except ValueError:
        return False
    if not isinstance(reply, dict):
        return False
    return any(isinstance(reply.get(field), str) and reply[field] for field in ("error", "message"))


def request_error(member: str, path: str, detail: str, text: str) -> HogwildError:
    """The error to raise for ``member``'s error reply to ``path`` (``detail`` from
    :func:`gateway_error`, not ``down``; ``text`` its body): etcd's answer about the request
    (:class:`HogwildError`, every member would answer the same) when ``text`` is etcd's error
    object, else the member's fault (:class:`EtcdReplyError`: a proxy's page, Go's plain 404).
    Shared by the client and the watch's polls, as :func:`gateway_error` is."""
    if is_etcd_error(text):
        return HogwildError(f"etcd at {member}: {path} failed: {detail}")
    return EtcdReplyError(f"etcd at {member}: {path} failed: {detail} (no error reply of etcd's)")


def reply_object(member: str, path: str, body: str | bytes) -> dict:
    """``member``'s successful reply to ``path`` (its ``body``) as the JSON object etcd's gateway
    sends; :class:`EtcdReplyError` (the member's fault) when it is not JSON or not an object.
    Shared by the client and the watch's polls."""
    try:
        reply = json.loads(body)
    except ValueError as err:  # not JSON (or not text): not etcd
        raise EtcdReplyError(f"etcd at {member}: {path}: reply is not JSON ({err})") from err
    if not isinstance(reply, dict):
        raise EtcdReplyError(f"etcd at {member}: {path}: reply {reply!r:.200} is no dict")
    return reply


def unreached(address: str, path: str, failures: list[tuple[str, str]]) -> EtcdUnavailable:
    """The error of a request no member of ``address`` answered, ``failures`` holding each
    member's ``(member, why)``: :class:`EtcdUnavailable` for a lone member, else
    :class:`EtcdClusterLost` naming each one's failure."""
    if len(failures) == 1:
        return EtcdUnavailable(f"etcd at {address} cannot be reached: {failures[0][1]}")
    said = "; ".join(f"{member}: {why}" for member, why in failures)
    return EtcdClusterLost(f"no member of the etcd cluster {address} answered {path}: {said}")


def reply_int(reply, field: str, address: str, default: int | None = None) -> int:
    """``reply[field]`` as an int (the gateway writes 64-bit numbers as strings, and leaves out
    zeros: ``default`` then)."""
    try:
        if field not in reply and default is not None:
            return default
        return int(reply[field])
    except (KeyError, TypeError, ValueError):
        raise HogwildError(
            f"etcd at {address}: malformed reply, no {field!r} in {reply!r:.200}"
        ) from None
