"""What a primary's commit round hears and what it asks for: the records, no decision.

A :class:`~hogwild_plugins.ps.replication.commit_round.CommitRound` takes one stimulus at a time
(a :class:`RoundStimulus`, named by its ``stimulus_id`` in the round's story): a batch of client
:class:`Update` s (:class:`BatchArrived`), the admission's versions (:class:`Admitted`), the
copies' answers to the prepares and the commits (:class:`PreparesAnswered`,
:class:`CommitsAnswered`), the local application done (:class:`LocalApplied`). It answers with
actions for the replication thread (:mod:`~hogwild_plugins.ps.replication.primary_round`,
through :mod:`~hogwild_plugins.ps.replication.executor`) to carry out: refuse or answer a
duplicate (:class:`RefuseNotPrimary`, :class:`AnswerDuplicate`), admit (:class:`Admit`), send
the prepares and the commits (:class:`SendPrepares`, :class:`SendCommits`), apply here and wait
for it (:class:`ApplyLocally`, :class:`AwaitApplied`), drop a copy (:class:`DropCopy`),
acknowledge (:class:`Acknowledge`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "Acknowledge",
    "Admit",
    "Admitted",
    "AnswerDuplicate",
    "ApplyLocally",
    "AwaitApplied",
    "BatchArrived",
    "CommitsAnswered",
    "DropCopy",
    "LocalApplied",
    "PreparesAnswered",
    "RefuseNotPrimary",
    "RoundStimulus",
    "SendCommits",
    "SendPrepares",
    "Update",
]


@dataclass(frozen=True)
class Update:
    """A client's update as the round sees it: who sent it (``sender``, ``seq``), which shard
    of which bucket it writes."""

    sender: int
    seq: int
    shard: int
    bucket: int


# --------------------------------------------------------------------------- stimuli


@dataclass(frozen=True, kw_only=True)
class RoundStimulus:
    """Something that happened to the round; ``stimulus_id`` names it in the story."""

    stimulus_id: str


@dataclass(frozen=True)
class BatchArrived(RoundStimulus):
    """Client updates taken together from the queue; ``lease_valid``: this server's lease is
    valid by its own clock (and its replication did not fail)."""

    updates: tuple[Update, ...]
    lease_valid: bool


@dataclass(frozen=True)
class Admitted(RoundStimulus):
    """The admission's answer: ``versions`` maps each admitted update (its index in the batch)
    to its version; the others were refused (and answered) by the admission."""

    versions: Mapping[int, int]


@dataclass(frozen=True)
class PreparesAnswered(RoundStimulus):
    """The prepares came back: ``failed`` holds each ``(bucket, copy)`` that failed one."""

    failed: frozenset


@dataclass(frozen=True)
class CommitsAnswered(RoundStimulus):
    """The commits came back: ``failed`` holds each ``(bucket, copy)`` that failed one."""

    failed: frozenset


@dataclass(frozen=True)
class LocalApplied(RoundStimulus):
    """Every admitted update is applied here; ``lease_valid`` by this server's clock now."""

    lease_valid: bool


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class RefuseNotPrimary:
    """Refuse update ``index`` of the batch as ``NOT_PRIMARY``."""

    index: int


@dataclass(frozen=True)
class AnswerDuplicate:
    """Answer update ``index`` ``ACK`` with the ``version`` it already got."""

    index: int
    version: int


@dataclass(frozen=True)
class Admit:
    """Admit the updates ``indices`` in order (versions from the shard book); report
    :class:`Admitted`."""

    indices: tuple[int, ...]


@dataclass(frozen=True)
class ApplyLocally:
    """Queue the updates ``indices`` on this server's update engine (those still
    :meth:`CommitRound.ours` as they are queued, under the lock)."""

    indices: tuple[int, ...]


@dataclass(frozen=True)
class SendPrepares:
    """``PREPARE`` each ``(index, copy)``: update ``index`` to ``copy``, under the bucket's epoch
    and this server's lease; report :class:`PreparesAnswered`."""

    prepares: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class SendCommits:
    """``COMMIT`` each ``(shard, copy, version)``: ``shard`` up to ``version`` on ``copy``;
    report :class:`CommitsAnswered`."""

    commits: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class DropCopy:
    """``copy`` failed ``bucket``'s round: tell the bucket's role it is unreachable (and carry out
    what the role asks)."""

    bucket: int
    copy: int


@dataclass(frozen=True)
class AwaitApplied:
    """Wait until the updates of :class:`ApplyLocally` are applied; report
    :class:`LocalApplied`."""


@dataclass(frozen=True)
class Acknowledge:
    """Answer update ``index`` ``ACK`` with its ``version``."""

    index: int
    version: int
