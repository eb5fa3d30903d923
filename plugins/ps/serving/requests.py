"""A parameter server's admission of client requests: checked, made into work, given a version.

Both paths that take a client's write go through one :class:`Admission`: the server's network
thread (a request from a client) and a replicated server's copy side (the client's update a
primary forwards in its ``PREPARE``). For one request, in this order:

1. :meth:`Admission.check`: the header names this job, a shard this server holds, and frames that
   fit the shard (:mod:`~hogwild_plugins.ps.checks`); the shard is returned.
2. :meth:`Admission.work`: the request's frames as a :class:`~hogwild_plugins.ps.work.Work`
   for the shard's update thread.
3. :meth:`Admission.admit`: the shard book gives the work its version (a parameter update also
   its staleness coefficient; too stale: ``STALE``). A copy does not admit: it takes the version
   and the coefficient its primary decided (:meth:`Admission.decide`).

:meth:`Admission.writes` tells a write (replicated with copies, versioned) from a pull or a
reduction. The invariant kept: every write of a replicated shard takes the shard's next version
at admission, so every copy applies the shard's writes in the primary's order.
"""

from __future__ import annotations

import numpy as np
from hogwild_plugins.ps import checks
from hogwild_plugins.ps.layout import ModelGeometry, ShardLayout
from hogwild_plugins.ps.shard import ShardBook
from hogwild_plugins.ps.work import (
    AddToVector,
    Assign,
    Kind,
    Pull,
    PushDeltas,
    PushVectors,
    VectorOp,
    Work,
)

from hogwild.errors import HogwildError
from hogwild.net.wire import NO_BASIS, DType, ErrorCode, Header, MsgType, WireError, frame_array

__all__ = ["NONFINITE_MODES", "Admission"]

NONFINITE_MODES = ("refuse", "count")
"""``ps.nonfinite``: what a server does with a write holding NaN or an infinity."""


class Admission:
    """The checks and versioning of one server's client requests (see the module docstring).

    Args:
        job_name: The job's name (named in a ``WRONG_JOB`` refusal).
        job: The job's id (every header carries it).
        layout: The shards and buckets.
        geometry: The model's fully connected layers (a vector push's rows).
        book: The shards' versions and staleness (owned by the network thread).
        max_staleness: ``ps.max_staleness`` (named in a ``STALE`` refusal).
        replicated: Copies > 1: a write into a named vector takes a version too.
        nonfinite: ``ps.nonfinite``: ``"refuse"`` a write whose values hold NaN or an infinity
            (``BAD_VALUE``), or ``"count"`` it and let it apply. Either way it is counted
            (:attr:`nonfinite_refused`, :attr:`nonfinite_applied`).
        shards: The server's shards by local index: a push into a new named vector holds its
            room from admission on (:meth:`~hogwild_plugins.ps.work.Shard.promise`), so one that
            is acknowledged at once is never refused when it is applied (None: no such check;
            its update thread still refuses one vector too many).
    """

    def __init__(
        self,
        job_name: str,
        job: int,
        layout: ShardLayout,
        geometry: ModelGeometry,
        book: ShardBook,
        max_staleness: int,
        replicated: bool,
        nonfinite: str = "refuse",
        shards: list | None = None,
    ) -> None:
        if nonfinite not in NONFINITE_MODES:
            raise HogwildError(
                f"ps.nonfinite = {nonfinite!r}: expected one of {', '.join(NONFINITE_MODES)}"
            )
        self.job_name, self.job = job_name, job
        self.layout, self.geometry, self.book = layout, geometry, book
        self.max_staleness, self.replicated = max_staleness, replicated
        self.nonfinite = nonfinite
        self.shards = shards  # the server's shards by local index: a named push's room
        self.nonfinite_refused = 0
        self.nonfinite_applied = 0

    def _check_finite(self, header: Header, *arrays) -> None:
        """Refuse (or count) a write whose values are not all finite: one NaN pushed would be
        every replica's NaN at its next pull."""
        if all(np.isfinite(a).all() for a in arrays):
            return
        if self.nonfinite == "count":
            self.nonfinite_applied += 1
            return
        self.nonfinite_refused += 1
        raise WireError(
            f"{header.type.name} of shard {header.target}: a value is not finite (NaN or inf); "
            'refused (ps.nonfinite = "refuse")',
            ErrorCode.BAD_VALUE,
        )

    def check(self, header: Header) -> int:
        """The shard ``header`` addresses, checked with its frames' shape.

        Raises:
            WireError: ``WRONG_JOB``, or what :mod:`~hogwild_plugins.ps.checks` refuses.
        """
        if header.job != self.job:
            raise WireError(
                f"job id {header.job:#x} is not this server's job {self.job_name!r} "
                f"({self.job:#x})",
                ErrorCode.WRONG_JOB,
            )
        shard = checks.check_shard(header, self.layout, self.book.holds)
        size = self.layout.shard_size(shard)
        if checks.is_named_push(header):
            checks.check_named_push(header)
            checks.check_range(header.offset, header.shape[0], shard, size)
        elif header.type in (MsgType.PUSH_DELTAS, MsgType.ASSIGN):
            checks.check_array(header, 1, 1)
            if header.aux:
                raise WireError(
                    f"{header.type.name} of one frame: aux = {header.aux}, expected 0 (it is "
                    "the name's length of a push into a named vector)",
                    ErrorCode.BAD_HEADER,
                )
            checks.check_range(header.offset, header.shape[0], shard, size)
        elif header.type == MsgType.PUSH_VECTORS:
            checks.check_array(header, 3, 2)
            if not 0.0 <= header.b < 1.0 or (header.b and not header.a > 0.0):
                raise WireError(
                    f"vector push: weight decay b = {header.b} must be in [0, 1), with a "
                    f"learning rate a > 0 (got a = {header.a})",
                    ErrorCode.BAD_VALUE,
                )
        return shard

    def work(self, header: Header, shard: int, local: int, frames: list) -> Work:
        """The checked request as work for the update thread of ``local`` (the shard's index
        among the server's).

        Raises:
            WireError: Frames that do not match the header.
        """
        lo, hi = self.layout.shard_range(shard)
        kind = header.type
        if kind in (MsgType.PUSH_DELTAS, MsgType.ASSIGN):
            data = frame_array(frames[0], DType.FLOAT32, header.shape, "delta")
            length = header.shape[0]
            self._check_finite(header, data)
            if checks.is_named_push(header):  # into a named vector
                name = checks.parse_name(frame_array(frames[1], DType.UINT8, (header.aux,), "name"))
                if self.shards is not None:  # refused before it is acknowledged, or its
                    self.shards[local].promise(name)  # room held until its thread applies it
                return AddToVector(
                    local,
                    header,
                    name=name,
                    offset=header.offset,
                    length=length,
                    delta=data,
                )
            if kind == MsgType.ASSIGN:
                return Assign(local, header, offset=header.offset, length=length, values=data)
            return PushDeltas(local, header, offset=header.offset, length=length, delta=data)
        if kind == MsgType.PUSH_VECTORS:
            fc, first_row, length = checks.layer_rows(header, self.geometry, lo, hi)
            k, m, rows = header.shape
            activations = frame_array(frames[0], DType.FLOAT32, (k, m), "activations")
            errors_by_row = frame_array(frames[1], DType.FLOAT32, (rows, k), "errors")
            self._check_finite(header, activations, errors_by_row)
            return PushVectors(
                local,
                header,
                layer=fc,
                first_row=first_row,
                length=length,
                activations=activations,
                errors_by_row=errors_by_row,
            )
        if kind == MsgType.PULL:
            size = hi - lo
            length = header.aux or size - header.offset
            if header.frames:
                raise WireError("PULL takes no frames", ErrorCode.BAD_FRAMES)
            checks.check_range(header.offset, length, shard, size)
            return Pull(local, header, offset=header.offset, length=length)
        if header.frames != 1 or header.dtype != DType.UINT8:
            raise WireError("VECTOR_OP takes one frame of names", ErrorCode.BAD_FRAMES)
        op, names = checks.parse_names(header, frame_array(frames[0], DType.UINT8, header.shape))
        return VectorOp(local, header, op=op, names=names, alpha=header.a)

    @staticmethod
    def writes(work: Work) -> bool:
        """Whether ``work`` writes (with copies, it is replicated and gets a version)."""
        if work.kind == Kind.PULL:
            return False
        return work.kind != Kind.VECOP or checks.writes(work.op, work.names) is not None

    def admit(self, header: Header, shard: int, work: Work) -> None:
        """Give ``work`` its version in the shard book (and a parameter update its coefficient).

        Raises:
            WireError: ``STALE``: a parameter update computed too many versions ago.
        """
        if work.kind in (Kind.DELTAS, Kind.VECTORS):
            basis = None if header.flags & NO_BASIS else header.version
            decision = self.book.admit(shard, basis)
            if not decision.accepted:
                raise WireError(
                    f"update of shard {shard} computed at version {basis} is "
                    f"{decision.staleness} versions stale; ps.max_staleness = "
                    f"{self.max_staleness}",
                    ErrorCode.STALE,
                )
            work.version = decision.version
            self.decide(work, header, decision.coef)
        elif work.kind == Kind.ASSIGN or (
            work.kind == Kind.VECOP and checks.writes(work.op, work.names) == "params"
        ):
            work.version = self.book.bump(shard)
        elif self.replicated and self.writes(work):  # a named vector's write:
            work.version = self.book.bump(shard)  # in the shard log's order on every copy

    @staticmethod
    def decide(work: Work, header: Header, coef: float) -> None:
        """The update's coefficient from its staleness coefficient (a copy applies the same)."""
        work.coef = coef
        if work.kind == Kind.VECTORS:
            work.coef = -header.a * coef
            work.decay = header.b / header.a if header.b else 0.0  # W loses b of itself
