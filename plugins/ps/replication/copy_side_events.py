"""What a copy's side hears from its primary and what it asks for: the records, no decision.

A :class:`~hogwild_plugins.ps.replication.copy_side.CopySide` takes one stimulus at a time (a
:class:`CopyStimulus`, named by its ``stimulus_id`` in the copy side's story): a primary's
message at the gate (:class:`PeerArrived`), then what it carries (:class:`PrepareArrived`,
:class:`CommitArrived`, :class:`SnapshotArrived`, :class:`CatchUpArrived`), and a snapshot's
values once they are in (:class:`SnapshotApplied`). It answers with actions for the network
thread (:mod:`~hogwild_plugins.ps.replication.copy_adapter`, through
:mod:`~hogwild_plugins.ps.replication.executor`) to carry out: let the message through
(:class:`Pass`), read the record again (:class:`RefreshRecord`), answer (:class:`Acknowledge`,
:class:`Refuse`), apply what was committed or a snapshot (:class:`ApplyCommitted`,
:class:`ApplySnapshot`), tell the bucket's role it was restored (:class:`MarkRestored`). Plain
frozen records: no decision is taken here.
"""

from __future__ import annotations

from dataclasses import dataclass

from hogwild.net.wire import ErrorCode

__all__ = [
    "Acknowledge",
    "ApplyCommitted",
    "ApplySnapshot",
    "CatchUpArrived",
    "CommitArrived",
    "CopyStimulus",
    "MarkRestored",
    "Pass",
    "PeerArrived",
    "PrepareArrived",
    "RefreshRecord",
    "Refuse",
    "SnapshotApplied",
    "SnapshotArrived",
]


# --------------------------------------------------------------------------- stimuli


@dataclass(frozen=True, kw_only=True)
class CopyStimulus:
    """A primary's message (or what came of one); ``stimulus_id`` names it in the story."""

    stimulus_id: str


@dataclass(frozen=True)
class PeerArrived(CopyStimulus):
    """A message for ``bucket`` from server ``sender``, carrying ``epoch`` and ``lease``;
    ``refreshed``: the record was read again since it first asked to."""

    bucket: int
    epoch: int
    lease: int
    sender: int
    refreshed: bool = False


@dataclass(frozen=True)
class PrepareArrived(CopyStimulus):
    """A ``PREPARE`` through the gate: ``item`` (the client's ``(sender, seq, work)``) is to be
    ``shard``'s version ``version``."""

    shard: int
    version: int
    item: tuple
    epoch: int  # the epoch of the primary that sent it
    stopped: bool = False  # the shard's bucket is stopped on this server (a write failed)


@dataclass(frozen=True)
class CommitArrived(CopyStimulus):
    """A ``COMMIT`` through the gate: ``shard``'s prepared updates up to ``upto``, committed by
    the primary of ``epoch``; ``room``: updates the engine has slots held for (None: no limit);
    ``stopped``: the shard's bucket is stopped on this server (a write failed to apply)."""

    shard: int
    upto: int
    epoch: int
    room: int | None = None
    stopped: bool = False


@dataclass(frozen=True)
class SnapshotArrived(CopyStimulus):
    """A ``SNAPSHOT`` through the gate, its frames checked: ``shard`` at ``version`` from the
    primary of ``epoch``, with its request table (``(sender, seq, version)`` triples);
    ``room``: whether the engine has a slot held for the restore."""

    shard: int
    version: int
    epoch: int
    table: tuple
    room: bool = True


@dataclass(frozen=True)
class CatchUpArrived(CopyStimulus):
    """A catch-up through the gate: the primary of ``epoch`` asks whether ``shard``'s log holds
    its committed state, ``version`` of ``log_epoch`` (then no snapshot is needed)."""

    shard: int
    bucket: int
    version: int
    log_epoch: int
    epoch: int
    stopped: bool = False  # the shard's bucket is stopped on this server: a snapshot must come
    restoring: bool = False  # a snapshot of the shard is queued, its values not in yet
    applying: bool = False  # this server's own commit round applies updates of the shard that
    # its log does not count yet (it was the primary, and was deposed while the round was out)


@dataclass(frozen=True)
class SnapshotApplied(CopyStimulus):
    """The snapshot's values, state and named vectors are in this server's memory."""

    shard: int
    bucket: int
    version: int
    epoch: int


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Pass:
    """The gate lets the message through: hand its content in."""


@dataclass(frozen=True)
class RefreshRecord:
    """Read ``sync/<bucket>`` again (feed it to the role), then gate the message again."""

    bucket: int


@dataclass(frozen=True)
class Refuse:
    """Answer the primary with an error."""

    code: ErrorCode
    message: str


@dataclass(frozen=True)
class ApplyCommitted:
    """Queue ``works`` (committed, in order) on ``shard``'s update thread; the shard's version
    in the book is at least ``committed`` from now on."""

    shard: int
    works: tuple
    committed: int


@dataclass(frozen=True)
class ApplySnapshot:
    """Replace ``shard``'s values, state and named vectors by the snapshot's, wait until they are
    in, then report :class:`SnapshotApplied`."""

    shard: int
    version: int


@dataclass(frozen=True)
class MarkRestored:
    """Tell ``bucket``'s role that its primary of ``epoch`` restored this copy."""

    bucket: int
    epoch: int


@dataclass(frozen=True)
class Acknowledge:
    """Answer the primary ``ACK`` with ``version``."""

    version: int
