"""The messages partitions on different hosts exchange: one fixed header frame, then payload
frames that are blocks of an arena row (no I/O here; :mod:`hogwild.partition.link` sends them).

Every message is a ZeroMQ multipart message whose first frame is a 40-byte little-endian header
(``magic, version, kind, source partition, slot, boundary, generation, a, f``) and whose other
frames are raw float32 (or uint8) blocks, never pickled. The payload's sizes are not in the
header: the receiver knows them from the plan, so a message whose frames do not have exactly
the planned sizes is refused. This is not :mod:`hogwild.net.wire`'s header (the parameter
servers' and data servers' requests): these messages are one replica's own dataflow, addressed
by slot, example and boundary rather than by shard and version, and never answered. Kinds:

=========  ===============  ==========================================================
kind       from -> to       meaning (payload)
=========  ===============  ==========================================================
FORWARD    partition -> g   its slice of boundary ``b``'s input block (1 frame)
BACKWARD   partition -> g   its partial error over each owner's slice in ``g`` (1 frame each)
LOAD       feeder -> g      slot ``slot`` holds example ``generation`` (the image, 1 frame;
                            ``a`` its label, ``f`` the learning rate)
DONE       partition -> 0   it completed the slot's example (forward, backward, update)
SETUP      leader -> g      the job (a JSON frame), the model (params, velocity frames)
READY      g -> leader      group ``a``'s partitions are running
ROWS_ASK   leader -> g      send your rows (request ``a``)
ROWS       g -> leader      the group's parameter and velocity rows (request ``a``; 2 frames)
BEAT       both ways        alive (group ``a``)
STOP       leader -> g      stop the partitions and leave
FAILED     g -> leader      a partition there died (a UTF-8 frame saying how)
FLUSH      leader -> g      a cluster replica's portion is complete: push your rows' progress
                            to the parameter servers (request ``a``)
FLUSHED    g -> leader      every partition of group ``source`` pushed (request ``a``)
FETCH      leader -> g      take the servers' model into your arena (request ``a``; a new epoch)
FETCHED    g -> leader      group ``source`` took it (request ``a``)
=========  ===============  ==========================================================

The last four are a cluster job's (:mod:`hogwild.cluster.partitioned`): there each host's
partitions exchange their own rows with the parameter servers, and the leader's portions end
only once every host has pushed.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from hogwild.errors import HogwildError

MAGIC = b"HWPF"
VERSION = 1
HEADER = struct.Struct("<4sBBHIHHqqd")
FORWARD, BACKWARD, LOAD, DONE, SETUP, READY, ROWS_ASK, ROWS, BEAT, STOP, FAILED = range(1, 12)
FLUSH, FLUSHED, FETCH, FETCHED = range(12, 16)
KIND_NAMES = {
    FORWARD: "FORWARD",
    BACKWARD: "BACKWARD",
    LOAD: "LOAD",
    DONE: "DONE",
    SETUP: "SETUP",
    READY: "READY",
    ROWS_ASK: "ROWS_ASK",
    ROWS: "ROWS",
    BEAT: "BEAT",
    STOP: "STOP",
    FAILED: "FAILED",
    FLUSH: "FLUSH",
    FLUSHED: "FLUSHED",
    FETCH: "FETCH",
    FETCHED: "FETCHED",
}
MAX_TEXT_BYTES = 1 << 16  # a FAILED message's text
MAX_SETUP_BYTES = 1 << 20  # SETUP's JSON
WAIT_S = 600.0  # how long a follower host waits for its leader's SETUP, by default


class FrameError(HogwildError):
    """A message from another host that is not one of the link's, or not for this job's plan."""


@dataclass(frozen=True)
class Header:
    kind: int
    source: int  # the sending partition, or group for the parents' kinds
    slot: int
    boundary: int  # 1-based: the boundary before segment ``boundary``
    generation: int
    a: int
    f: float


def encode(
    kind: int,
    source: int = 0,
    slot: int = 0,
    boundary: int = 0,
    generation: int = 0,
    a: int = 0,
    f: float = 0.0,
) -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, source, slot, boundary, 0, generation, a, f)


def decode(frame: bytes) -> Header:
    """The header of a received message.

    Raises:
        FrameError: Not 40 bytes, another magic or version, or an unknown kind.
    """
    if len(frame) != HEADER.size:
        raise FrameError(f"a header of {len(frame)} bytes, expected {HEADER.size}")
    magic, version, kind, source, slot, boundary, _, generation, a, f = HEADER.unpack(frame)
    if magic != MAGIC or version != VERSION:
        raise FrameError(f"not a partition link message (magic {magic!r}, version {version})")
    if kind not in KIND_NAMES:
        raise FrameError(f"unknown message kind {kind}")
    return Header(kind, source, slot, boundary, generation, a, f)


@dataclass(frozen=True)
class Expect:
    """What one receiver accepts: the plan's figures and the host groups, seen from ``group``."""

    k: int
    n_slots: int
    n_boundaries: int
    group: int
    group_of: tuple[int, ...]
    n_classes: int

    def check(self, h: Header) -> None:
        """Refuse a header this receiver cannot take (naming the field).

        Raises:
            FrameError: A field out of range, or a kind this group never receives.
        """
        leader = self.group == 0
        partition_kinds = (FORWARD, BACKWARD, LOAD, DONE)
        if h.kind in partition_kinds:
            if not 0 <= h.source < self.k:
                raise FrameError(f"{KIND_NAMES[h.kind]} from partition {h.source} of {self.k}")
            if self.group_of[h.source] == self.group:
                raise FrameError(
                    f"{KIND_NAMES[h.kind]} from partition {h.source}, which runs on this host"
                )
            if not 0 <= h.slot < self.n_slots:
                raise FrameError(f"{KIND_NAMES[h.kind]} for slot {h.slot} of {self.n_slots}")
            if h.generation < 1:
                raise FrameError(f"{KIND_NAMES[h.kind]} for generation {h.generation}")
        if h.kind in (FORWARD, BACKWARD) and not 1 <= h.boundary <= self.n_boundaries:
            raise FrameError(f"{KIND_NAMES[h.kind]} at boundary {h.boundary}")
        if h.kind == LOAD and (h.source != 0 or leader or not 0 <= h.a < self.n_classes):
            raise FrameError(f"LOAD from partition {h.source} (label {h.a}) to group {self.group}")
        if h.kind == LOAD and not (math.isfinite(h.f) and h.f >= 0.0):
            raise FrameError(f"LOAD with a learning rate of {h.f}")
        if h.kind == DONE and not leader:
            raise FrameError("DONE sent to a follower")
        if h.kind in (SETUP, ROWS_ASK, STOP, FLUSH, FETCH) and leader:
            raise FrameError(f"{KIND_NAMES[h.kind]} sent to the leader")
        if h.kind in (READY, ROWS, FAILED, FLUSHED, FETCHED) and not leader:
            raise FrameError(f"{KIND_NAMES[h.kind]} sent to a follower")
        n_groups = max(self.group_of) + 1
        groups_kinds = (READY, ROWS, FAILED, BEAT, FLUSHED, FETCHED)
        if h.kind in groups_kinds and not 0 <= h.source < n_groups:
            raise FrameError(f"{KIND_NAMES[h.kind]} from group {h.source} of {n_groups}")
        if h.kind in (SETUP, ROWS_ASK, STOP, FLUSH, FETCH) and h.source != 0:
            raise FrameError(f"{KIND_NAMES[h.kind]} from group {h.source}: only the leader's (0)")
        if h.kind in (FLUSH, FLUSHED, FETCH, FETCHED) and not 1 <= h.a < 1 << 62:
            raise FrameError(f"{KIND_NAMES[h.kind]} of round {h.a}: rounds count from 1")
