"""One applier per kind of work: how a piece of work changes (or reads) its shard.

:data:`APPLIERS` maps each :class:`~hogwild_plugins.ps.work.Kind` to its applier, called by the
shard's update thread as ``applier(rule, shard, work, tally, scratch)``: it applies the work to
the shard with the server's :class:`Rule`, advances the shard's applied version when the work
makes one, and counts in the thread's :class:`Tally`. Appliers send nothing: the engine answers
(:func:`ack_reply`, :func:`pull_reply`) once the work is counted done.

Pushes of deltas are applied in runs rather than one by one (:func:`apply_delta_run`: the deltas
queued for one shard together, Adam 3.3.1's opportunistic batching); a run of one takes the
kernel without gathering addresses. A push into a named vector goes through the same kernel with
rule SGD, ``lr`` 1 and coefficient 1 on that vector (``y += d``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from hogwild_plugins.ps import checks, kernels
from hogwild_plugins.ps.work import (
    AddToVector,
    Assign,
    Barrier,
    Kind,
    Pull,
    PushDeltas,
    PushVectors,
    Restore,
    Shard,
    VectorOp,
    Work,
)

from hogwild.net.wire import DType, ErrorCode, Header, MsgType, WireError

__all__ = ["APPLIERS", "Rule", "Tally", "ack_reply", "apply_delta_run", "pull_reply"]

_NO_STATE = np.zeros(0, np.float32)  # rule SGD keeps no state
_OP_NAMES = {code: name for name, code in kernels.VECTOR_OPS.items()}
_ONE = np.ones(1, np.float32)  # the coefficient of a push into a named vector


@dataclass(frozen=True, slots=True)
class Rule:
    """The server's update rule (a :data:`~hogwild_plugins.ps.kernels.RULES` code) and its
    factors: step ``lr``, momentum ``mu``, Adagrad's ``eps``."""

    rule: int
    lr: float
    mu: float
    eps: float


class Tally:
    """One update thread's counts: changes applied, and parameter updates (floats, or
    multiply-adds for API (b))."""

    __slots__ = ("applied", "updated")

    def __init__(self) -> None:
        self.applied = 0
        self.updated = 0


def apply_delta_run(rule: Rule, shard: Shard, run: list[PushDeltas], tally: Tally) -> None:
    """Apply the pushes of deltas ``run`` (queued for ``shard``, in order) together."""
    k = len(run)
    if k == 1:  # nothing to batch: the delta as it is, without gathering addresses
        work = run[0]
        kernels.apply_delta(
            rule.rule,
            shard.values,
            shard.state,
            work.delta,
            work.offset,
            work.coef,
            rule.lr,
            rule.mu,
            rule.eps,
        )
        tally.updated += work.length
    else:
        kernels.apply_deltas(
            rule.rule,
            shard.values,
            shard.state,
            np.fromiter((w.delta.ctypes.data for w in run), np.int64, k),
            np.fromiter((w.offset for w in run), np.int64, k),
            np.fromiter((w.length for w in run), np.int64, k),
            np.fromiter((w.coef for w in run), np.float32, k),
            rule.lr,
            rule.mu,
            rule.eps,
            kernels.BLOCK_FLOATS,
        )
        tally.updated += sum(w.length for w in run)
    shard.applied += k
    tally.applied += k


def _push_deltas(rule: Rule, shard: Shard, work: PushDeltas, tally: Tally, scratch) -> None:
    apply_delta_run(rule, shard, [work], tally)


def _push_vectors(rule: Rule, shard: Shard, work: PushVectors, tally: Tally, scratch) -> None:
    layer = work.layer
    kernels.apply_vectors(
        rule.rule,
        shard.values,
        shard.state,
        shard.lo,
        layer.offset,
        layer.n_in,
        work.first_row,
        work.errors_by_row,
        work.activations,
        work.coef,
        rule.lr,
        rule.mu,
        rule.eps,
        scratch,
        work.decay,
    )
    shard.applied += 1
    tally.applied += 1
    tally.updated += work.activations.shape[0] * work.length


def _assign(rule: Rule, shard: Shard, work: Assign, tally: Tally, scratch) -> None:
    kernels.assign(shard.values, work.offset, work.values)
    shard.applied += 1
    tally.applied += 1


def _add_to_vector(rule: Rule, shard: Shard, work: AddToVector, tally: Tally, scratch) -> None:
    kernels.apply_deltas(  # y += d: rule SGD, lr 1, coefficient 1
        kernels.RULE_SGD,
        shard.vector(work.name),
        _NO_STATE,
        np.array([work.delta.ctypes.data], np.int64),
        np.array([work.offset], np.int64),
        np.array([work.length], np.int64),
        _ONE,
        1.0,
        0.0,
        0.0,
        kernels.BLOCK_FLOATS,
    )
    if work.version:  # replicated: a write with its version
        shard.applied += 1
        tally.applied += 1


def _vector_op(rule: Rule, shard: Shard, work: VectorOp, tally: Tally, scratch) -> None:
    written = checks.writes(work.op, work.names)
    if written is not None:
        shard.vector(written)  # created first (if new): the operands that name it share it
    vectors = [shard.vector(n, write=n == written) for n in work.names]
    while len(vectors) < 3:  # the kernel takes three operands; the unused ones are the first
        vectors.append(vectors[0])
    guard = written == "params" and shard.refuse_nonfinite  # the parameters stay finite
    before = shard.values.copy() if guard else None
    work.result = float(kernels.vector_op(work.op, *vectors, work.alpha))
    if guard and not np.isfinite(shard.values).all():
        shard.values[:] = before  # as if it never ran; every copy refuses it the same way
        shard.nonfinite_refused += 1
        raise WireError(
            f"vector operation {_OP_NAMES.get(work.op, work.op)} on {', '.join(work.names)} "
            f"of shard {shard.index}: the parameters it makes are not finite; refused "
            '(ps.nonfinite = "refuse")',
            ErrorCode.BAD_VALUE,
        )
    if not math.isfinite(work.result):  # a NaN or inf in a vector, or an overflow
        result, work.result = work.result, 0.0
        raise WireError(
            f"vector operation {_OP_NAMES.get(work.op, work.op)} on {', '.join(work.names)} "
            f"of shard {shard.index}: the result is not finite ({result}): a vector holds NaN "
            "or inf, or overflowed",
            ErrorCode.BAD_VALUE,
        )
    if work.version:
        shard.applied += 1
        tally.applied += 1


def _restore(rule: Rule, shard: Shard, work: Restore, tally: Tally, scratch) -> None:
    shard.values[:] = work.values
    if shard.state.size:
        shard.state[:] = work.state
    if work.vectors is not None:  # copied here: first touch by the owning thread
        shard.vectors = {n: np.array(v, np.float32) for n, v in work.vectors.items()}
    shard.applied = work.version


def _pull(rule: Rule, shard: Shard, work: Pull, tally: Tally, scratch) -> None:
    """Nothing to change: the engine answers with :func:`pull_reply`."""


def _barrier(rule: Rule, shard: Shard, work: Barrier, tally: Tally, scratch) -> None:
    """Nothing: everything queued before it for the shard is applied by now."""


Applier = Callable[[Rule, Shard, Work, Tally, np.ndarray], None]

APPLIERS: dict[int, Applier] = {
    Kind.DELTAS: _push_deltas,
    Kind.VECTORS: _push_vectors,
    Kind.PULL: _pull,
    Kind.ASSIGN: _assign,
    Kind.VECOP: _vector_op,
    Kind.RESTORE: _restore,
    Kind.BARRIER: _barrier,
    Kind.INTO: _add_to_vector,
}
"""Kind -> applier; a :class:`~hogwild_plugins.ps.work.Snapshot` is the engine's own (it spans
every shard of its thread)."""


def ack_reply(shard: Shard, work: Work) -> Header:
    """The acknowledgement of applied work: the version it made (a vector operation: the
    shard's version and its result)."""
    if work.kind == Kind.VECOP:
        return work.header.reply(MsgType.ACK, version=shard.applied, a=work.result)
    return work.header.reply(MsgType.ACK, version=work.version)


def pull_reply(shard: Shard, work: Pull) -> tuple[Header, list[np.ndarray]]:
    """A pull's ``DATA`` reply: a copy of the asked range and the shard's applied version."""
    values = shard.values[work.offset : work.offset + work.length].copy()
    header = work.header.reply(
        MsgType.DATA,
        version=shard.applied,
        offset=work.offset,
        dtype=DType.FLOAT32,
        shape=(work.length,),
        frames=1,
    )
    return header, [values]
