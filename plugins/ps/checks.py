"""Checks of a request against the server's model and shards, before anything acts on it.

The wire decoder (:mod:`hogwild.net.wire`) has checked every header field for range already;
these functions check what only a parameter server knows: that the shard is held here, that a
range lies within it, that a layer is a fully connected layer of the model with the geometry the
client claims, that vector names are allowed (the same rule for a vector operation's operands
and a push's target vector). Each raises :class:`~hogwild.net.wire.WireError`
with the code and a message the client gets back. Pure functions: no state, no I/O.
"""

from __future__ import annotations

import re

from hogwild_plugins.ps.layout import FcLayer, ModelGeometry, ShardLayout
from hogwild_plugins.ps.vector_ops import (
    OP_AMAX,
    OP_ASUM,
    OP_AXPY,
    OP_COPY,
    OP_DOT,
    OP_FILL,
    OP_MUL,
    OP_OPERANDS,
    OP_SCALE,
    VECTOR_OPS,
)

from hogwild.net.wire import NO_BASIS, DType, ErrorCode, Header, MsgType, WireError

__all__ = [
    "check_array",
    "check_named_push",
    "check_range",
    "check_shard",
    "is_named_push",
    "layer_rows",
    "parse_name",
    "parse_names",
    "writes",
]

NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_NAME_BYTES = 64
MAX_NAMES_BYTES = 3 * 65
PARAMS = "params"


def check_shard(header: Header, layout: ShardLayout, held) -> int:
    """The header's target as a shard held here.

    Raises:
        WireError: ``BAD_TARGET``: no such shard, or another server's.
    """
    shard = header.target
    if shard >= layout.n_shards:
        raise WireError(
            f"shard {shard} does not exist (the model has {layout.n_shards} shards)",
            ErrorCode.BAD_TARGET,
        )
    if not held(shard):
        raise WireError(
            f"shard {shard} (bucket {layout.bucket_of(shard)}) is held by server "
            f"{layout.server_of(shard)}, not this one (bucket map version {layout.map.version})",
            ErrorCode.BAD_TARGET,
        )
    return shard


def check_array(header: Header, ndim: int, frames: int) -> None:
    """The header announces float32 arrays of ``ndim`` dimensions in ``frames`` frames."""
    if header.dtype != DType.FLOAT32 or len(header.shape) != ndim or header.frames != frames:
        raise WireError(
            f"{header.type.name} takes {frames} float32 frame(s) described by a {ndim}-d shape; "
            f"got {header.frames} frame(s) of {header.dtype.name} {tuple(header.shape)}",
            ErrorCode.BAD_FRAMES,
        )


def check_range(offset: int, length: int, shard: int, size: int) -> None:
    """``[offset, offset + length)`` lies within a shard of ``size`` floats."""
    if length < 1 or offset + length > size:
        raise WireError(
            f"range [{offset}, {offset + length}) is not within shard {shard} of {size} floats",
            ErrorCode.BAD_RANGE,
        )


def layer_rows(
    header: Header, geometry: ModelGeometry, lo: int, hi: int
) -> tuple[FcLayer, int, int]:
    """API (b): the layer, its first row in the shard ``[lo, hi)`` and the rows that overlap it.

    The header's shape is ``(k, M, rows)``: ``k`` vectors, the layer's input size, and the rows
    of ``W`` that overlap the shard (the client sends their errors only).

    Raises:
        WireError: ``BAD_LAYER``: not a fully connected layer, the wrong input size, or a layer
            with no weights in this shard; ``BAD_FRAMES``: the wrong number of rows.
    """
    fc = geometry.fc(header.aux)
    if fc is None:
        known = ", ".join(str(f.layer) for f in geometry.fc_layers) or "none"
        raise WireError(
            f"layer {header.aux} is not a fully connected layer of this model "
            f"(fully connected layers: {known})",
            ErrorCode.BAD_LAYER,
        )
    k, m, rows = header.shape
    if m != fc.n_in:
        raise WireError(
            f"layer {fc.layer} takes {fc.n_in} inputs (W is {fc.n_out} x {fc.n_in}); the request "
            f"has activation vectors of {m}",
            ErrorCode.BAD_LAYER,
        )
    start, stop = max(lo, fc.offset), min(hi, fc.offset + fc.size)
    if start >= stop:
        raise WireError(
            f"layer {fc.layer}'s weights [{fc.offset}, {fc.offset + fc.size}) do not overlap "
            f"this shard [{lo}, {hi})",
            ErrorCode.BAD_LAYER,
        )
    r0, r1 = (start - fc.offset) // m, (stop - 1 - fc.offset) // m + 1
    if rows != r1 - r0:
        raise WireError(
            f"layer {fc.layer} has rows {r0}..{r1 - 1} in this shard: expected {r1 - r0} error "
            f"rows, got {rows}",
            ErrorCode.BAD_FRAMES,
        )
    return fc, r0, stop - start


def parse_names(header: Header, frame) -> tuple[int, tuple[str, ...]]:
    """A vector operation's code and its operand names (one UTF-8 frame, comma-separated).

    Raises:
        WireError: An unknown operation (``UNEXPECTED``) or names that are not allowed
            (``BAD_NAME``).
    """
    op = header.code
    if op not in OP_OPERANDS:
        raise WireError(
            f"unknown vector operation {op}; known: {sorted(VECTOR_OPS.items())}",
            ErrorCode.UNEXPECTED,
        )
    raw = bytes(memoryview(frame))
    if len(raw) > MAX_NAMES_BYTES:
        raise WireError(
            f"vector names: {len(raw)} bytes, at most {MAX_NAMES_BYTES}", ErrorCode.BAD_NAME
        )
    try:
        names = tuple(raw.decode("ascii").split(","))
    except UnicodeDecodeError:
        raise WireError("vector names must be ASCII", ErrorCode.BAD_NAME) from None
    if len(names) != OP_OPERANDS[op] or not all(NAME.fullmatch(n) for n in names):
        raise WireError(
            f"operation {op} takes {OP_OPERANDS[op]} names of 1-64 characters [A-Za-z0-9_.-], "
            f"got {raw[:80]!r}",
            ErrorCode.BAD_NAME,
        )
    return op, names


WRITTEN = {
    OP_DOT: None,
    OP_AXPY: 1,
    OP_SCALE: 0,
    OP_COPY: 1,
    OP_MUL: 2,
    OP_FILL: 0,
    OP_ASUM: None,
    OP_AMAX: None,
}
"""Which operand each operation writes (``axpy`` and ``copy`` write y, ``mul`` z; the
reductions none)."""


def writes(op: int, names: tuple[str, ...]) -> str | None:
    """The name an operation writes (None for a reduction)."""
    index = WRITTEN[op]
    return None if index is None else names[index]


def is_named_push(header: Header) -> bool:
    """A ``PUSH_DELTAS`` of two frames: a delta into a named vector (see :func:`parse_name`)."""
    return header.type == MsgType.PUSH_DELTAS and header.frames == 2


def check_named_push(header: Header) -> None:
    """A push into a named vector: one float32 range, the name's bytes in ``aux``, no basis.

    It is not a parameter update, so it carries no basis (``version`` 0 and ``NO_BASIS``) and
    none of the other fields' meanings (``code``, ``a``, ``b`` zero).

    Raises:
        WireError: ``BAD_FRAMES`` (not one 1-d float32 array and a name), ``BAD_NAME`` (a name
            length outside 1..64), ``BAD_HEADER`` (a basis, a code or a scalar).
    """
    check_array(header, 1, 2)
    if not 1 <= header.aux <= MAX_NAME_BYTES:
        raise WireError(
            f"a push into a named vector announces a name of {header.aux} bytes (aux); "
            f"names have 1 to {MAX_NAME_BYTES}",
            ErrorCode.BAD_NAME,
        )
    if header.version or not header.flags & NO_BASIS or header.code or header.a or header.b:
        raise WireError(
            "a push into a named vector carries no basis (version 0, flag NO_BASIS), no code and "
            f"no scalars; got version {header.version}, flags {header.flags:#x}, code "
            f"{header.code}, a = {header.a}, b = {header.b}",
            ErrorCode.BAD_HEADER,
        )


def parse_name(frame) -> str:
    """The target vector of a named push (its second frame, checked as vector-operation names
    are); ``"params"`` is refused: the parameters change only through the rule, with a version.

    Raises:
        WireError: ``BAD_NAME``, naming the name.
    """
    raw = bytes(memoryview(frame))
    try:
        name = raw.decode("ascii")
    except UnicodeDecodeError:
        raise WireError(f"vector name {raw[:80]!r} is not ASCII", ErrorCode.BAD_NAME) from None
    if not NAME.fullmatch(name):
        raise WireError(
            f"vector name {name[:80]!r}: names have 1-64 characters [A-Za-z0-9_.-]",
            ErrorCode.BAD_NAME,
        )
    if name == PARAMS:
        raise WireError(
            f"vector name {name!r} is the parameters: push into them without a name (through "
            "the update rule, with a version)",
            ErrorCode.BAD_NAME,
        )
    return name
