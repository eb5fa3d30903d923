"""The frames of the replication messages between servers: what a ``SNAPSHOT`` carries.

A snapshot of one shard is five frames: the values, the update rule's state, the request table
(``(sender, seq, version)`` triples, unsigned 64-bit), the named vectors' names (ASCII, joined by
commas) and their values (one row of the shard's size per name). :func:`snapshot_frames` makes
them, :func:`parse_snapshot` checks and reads them back: a copy refuses anything malformed
before its restore replaces a byte of its own state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hogwild_plugins.ps import checks

from hogwild.net.wire import DType, ErrorCode, Header, WireError, frame_array

__all__ = ["Snapshot", "parse_snapshot", "parse_vectors", "snapshot_frames"]

SNAPSHOT_FRAMES = 5


@dataclass
class Snapshot:
    """One shard's snapshot as a copy received it (arrays viewing the frames)."""

    values: np.ndarray
    state: np.ndarray
    table: list[tuple[int, int, int]]
    vectors: dict[str, np.ndarray]


def snapshot_frames(
    values: np.ndarray,
    state: np.ndarray,
    table: list[tuple[int, int, int]],
    vectors: dict[str, np.ndarray],
) -> list:
    """The five frames of a shard's snapshot (the named vectors in the order of their names)."""
    named = sorted(vectors.items(), key=lambda item: item[0])
    names = ",".join(n for n, _ in named).encode("ascii")
    stacked = np.empty((len(named), values.size), np.float32)
    for row, (_, vec) in zip(stacked, named, strict=True):
        row[:] = vec
    requests = np.array(table, np.uint64).reshape(-1)
    return [values, state, requests, np.frombuffer(names, np.uint8), stacked.reshape(-1)]


def parse_snapshot(header: Header, frames: list, size: int, state_size: int) -> Snapshot:
    """A snapshot's header and five frames for a shard of ``size`` floats and ``state_size`` of
    the rule's state, checked.

    Raises:
        WireError: Frames of the wrong number or size, a request table that is not triples, bad
            vector names (see :func:`parse_vectors`).
    """
    shard = header.target
    if header.dtype != DType.FLOAT32 or header.shape != (size,) or len(frames) != SNAPSHOT_FRAMES:
        raise WireError(
            f"SNAPSHOT of shard {shard}: expected values, state, a request table, the "
            f"named vectors' names and their values ({size} floats each)",
            ErrorCode.BAD_FRAMES,
        )
    vectors = parse_vectors(frames[3], frames[4], size)
    values = frame_array(frames[0], DType.FLOAT32, (size,), "values")
    state = frame_array(frames[1], DType.FLOAT32, (state_size,), "state")
    raw = memoryview(frames[2])
    if raw.nbytes % 24:
        raise WireError("SNAPSHOT: the request table is not (sender, seq, version) triples")
    table = frame_array(frames[2], DType.UINT64, (raw.nbytes // 8,), "requests")
    triples = [tuple(int(x) for x in t) for t in table.reshape(-1, 3)]
    return Snapshot(values, state, triples, vectors)


def parse_vectors(names_frame, values_frame, size: int) -> dict[str, np.ndarray]:
    """A snapshot's named vectors: their names (ASCII, joined by commas; none: empty) and their
    values, one row of ``size`` floats per name, checked.

    Raises:
        WireError: ``BAD_NAME`` (a name outside checks' rules, ``params``, a repeated name),
            ``BAD_FRAMES`` (values that are not one row per name).
    """
    raw = bytes(memoryview(names_frame))
    names = [] if not raw else [checks.parse_name(n.encode("ascii")) for n in _split(raw)]
    if len(set(names)) != len(names):
        raise WireError(f"SNAPSHOT: a vector name is repeated in {raw[:80]!r}", ErrorCode.BAD_NAME)
    nbytes = memoryview(values_frame).nbytes
    if nbytes != 4 * size * len(names):
        raise WireError(
            f"SNAPSHOT: {nbytes} bytes of named vectors for {len(names)} name(s) of {size} floats",
            ErrorCode.BAD_FRAMES,
        )
    stacked = frame_array(values_frame, DType.FLOAT32, (len(names) * size,), "vectors")
    return {name: stacked[i * size : (i + 1) * size] for i, name in enumerate(names)}


def _split(raw: bytes) -> list[str]:
    try:
        return raw.decode("ascii").split(",")
    except UnicodeDecodeError:
        raise WireError("SNAPSHOT: vector names must be ASCII", ErrorCode.BAD_NAME) from None
