"""Valid wire messages broken one way at a time: the mutations every hostile client here sends.

One source for the fuzzing in ``tests/cluster/test_net_fuzz.py``, ``tests/adversarial/`` and
``bench/figures/adversary.py``: :func:`mutate` takes a valid message (a header frame, then its
frames) and breaks one thing in it, chosen by a seeded generator, so a failing run is replayed
by its seed. :data:`FIELD_OFFSETS` are where the header's fields start, read from
:data:`hogwild.net.wire.HEADER` itself, so a change of the header moves them along.
"""

from __future__ import annotations

import re
import struct

import numpy as np

from hogwild.net.wire import HEADER, HEADER_SIZE

__all__ = ["FIELD_OFFSETS", "MUTATIONS", "SEQ_OFFSET", "field_offsets", "mutate", "with_seq"]


def field_offsets(layout: struct.Struct) -> list[int]:
    """The byte offset of every field of ``layout`` (a little-endian, unpadded struct)."""
    offsets, at = [], 0
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", layout.format.lstrip("<>=!@")):
        size = struct.calcsize("<" + code)
        if code == "s":  # one field of ``count`` bytes
            offsets.append(at)
            at += int(count or 1)
            continue
        for _ in range(int(count or 1)):
            offsets.append(at)
            at += size
    return offsets


FIELD_OFFSETS = field_offsets(HEADER)
SEQ_OFFSET = FIELD_OFFSETS[10]  # the sender's sequence number (u64): magic .. target before it

MUTATIONS = (
    "random header",  # random bytes instead of the header, of any length up to twice its size
    "flipped byte",  # one header byte xor-ed
    "replaced field",  # four random bytes where a field starts
    "dropped frame",
    "added frame",
    "cut frame",  # an array frame truncated
    "replaced frames",  # the frames replaced by 0..11 random ones
)


def with_seq(message: list[bytes], seq: int) -> list[bytes]:
    """``message`` with sequence number ``seq`` in its header (a fresh one: a server's duplicate
    check never silences it)."""
    head = bytearray(message[0])
    if len(head) == HEADER_SIZE:
        struct.pack_into("<Q", head, SEQ_OFFSET, seq)
    return [bytes(head), *message[1:]]


def mutate(message: list[bytes], rng: np.random.Generator) -> list[bytes]:
    """``message`` with one of :data:`MUTATIONS` applied (drawn from ``rng``). A mutation that
    does not apply (a frame to drop or cut from a message of a header alone) adds a frame."""
    head, frames = bytearray(message[0]), list(message)
    kind = int(rng.integers(0, len(MUTATIONS)))
    if kind == 0:
        frames[0] = rng.bytes(int(rng.integers(0, 2 * HEADER_SIZE)))
    elif kind == 1 and head:
        head[int(rng.integers(0, len(head)))] ^= int(rng.integers(1, 256))
        frames[0] = bytes(head)
    elif kind == 2 and len(head) == HEADER_SIZE:
        at = FIELD_OFFSETS[int(rng.integers(0, len(FIELD_OFFSETS)))]
        head[at : at + 4] = rng.bytes(4)
        frames[0] = bytes(head)
    elif kind == 3 and len(frames) > 1:
        frames.pop(int(rng.integers(1, len(frames))))
    elif kind == 5 and len(frames) > 1 and len(frames[-1]):
        i = len(frames) - 1
        frames[i] = frames[i][: int(rng.integers(0, len(frames[i])))]
    elif kind == 6:
        count = int(rng.integers(0, 12))
        frames = [frames[0]] + [rng.bytes(int(rng.integers(0, 32))) for _ in range(count)]
    else:  # kind 4, and the mutations that do not apply to this message
        frames.append(rng.bytes(int(rng.integers(0, 64))))
    return frames
