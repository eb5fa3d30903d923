"""The wire format of every hogwild message: one fixed binary header frame, then raw array frames.

A message is a ZeroMQ multipart message. Its first frame is a :class:`Header`, packed little-endian
into exactly :data:`HEADER_SIZE` bytes by :data:`HEADER` (no padding, no pickling, no JSON):

======== ====== =====================================================================
field    type   meaning
======== ====== =====================================================================
magic    4s     ``b"HGWN"``
wire     u8     format version (:data:`WIRE_VERSION`)
type     u8     :class:`MsgType`
flags    u16    :class:`Flag` bits
dtype    u8     :class:`DType` of the array frames (``NONE`` when there are none)
ndim     u8     dimensions of ``shape`` in use (0..4)
code     u16    error code (``ERROR``) or operation code (``VECTOR_OP``)
job      u64    the job's id (:func:`job_id`, a hash of its name)
sender   u32    the client's id
target   u32    shard (or bucket) the message is about
seq      u64    the sender's sequence number; a reply carries its request's
version  u64    a parameter version: a push's basis, a reply's new version
offset   u64    an element offset (a range within a shard)
shape    4 u32  array shape (unused dimensions 0)
frames   u32    number of frames after the header
aux      u32    a small argument: the layer of a vector push, a pull's length, the bytes of
                a named push's vector name
lease    u64    bucket-map version / lease (replication); on a client's request, its fencing
                token (:mod:`hogwild.net.fencing`; 0: none)
a, b     2 f64  scalars: learning rate, alpha, a dot product's result
======== ====== =====================================================================

Invariant: :func:`unpack_header` returns a header only when every field is in range (a known
type, known flag bits, a known dtype, ``ndim`` dimensions of at least 1 and the rest 0, at most
:data:`MAX_FRAMES` frames, an array of at most :data:`MAX_ARRAY_BYTES`, finite scalars), and
``pack_header(unpack_header(b)) == b`` for every frame it accepts. Anything else raises
:class:`WireError` naming the field and the value. What a field must hold for a given message
type (which shard exists, how long a range may be) is the receiver's to check.
"""

from __future__ import annotations

import hashlib
import math
import struct
from enum import IntEnum, IntFlag
from typing import NamedTuple

import numpy as np

from hogwild.errors import HogwildError

__all__ = [
    "DTYPES",
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_ARRAY_BYTES",
    "MAX_FRAMES",
    "WIRE_VERSION",
    "DType",
    "ErrorCode",
    "Flag",
    "Header",
    "NO_BASIS",
    "RESEND",
    "MsgType",
    "WireError",
    "array_nbytes",
    "frame_array",
    "frame_nbytes",
    "job_id",
    "pack_header",
    "peek_request",
    "unpack_header",
]

MAGIC = b"HGWN"
WIRE_VERSION = 1
HEADER = struct.Struct("<4sBBHBBHQIIQQQ4IIIQdd")
HEADER_SIZE = HEADER.size
MAX_FRAMES = 8
"""Most array frames a message may carry after its header."""
MAX_ARRAY_BYTES = 64 * 2**20
"""Largest array a header may describe (64 MiB)."""
U64_MAX = 2**64 - 1


class MsgType(IntEnum):
    """What a message is. Requests go to a server; replies (``>= ACK``) come back."""

    PING = 1
    HELLO = 2  # the layout and bucket map (a JSON reply)
    STATUS = 3  # counters (a JSON reply)
    PUSH_DELTAS = 4  # API (a): a range of one shard, one float32 frame (a name: frame_nbytes)
    PUSH_VECTORS = 5  # API (b): k activation and k error vectors of one layer, for one shard
    PULL = 6  # one shard's values
    VECTOR_OP = 7  # dot / axpy / scale / copy / mul / fill on named vectors of one shard
    ASSIGN = 8  # overwrite a range of one shard
    CONTROL = 9  # a role's command or question: one UTF-8 JSON frame (a JSON reply)
    BATCH = 10  # a data server's examples: int64 record indices (a DATA reply: images, labels)
    PREPARE = 11  # replication, primary to copy: a client's update (its header, then its frames)
    COMMIT = 12  # replication: apply the prepared updates of one shard up to ``version``
    SNAPSHOT = 13  # replication: one shard's values, rule state and request table (a catch-up)
    ACK = 16  # a push, assign or operation applied (or queued): the new version
    DATA = 17  # a pull's reply: one float32 frame
    JSON = 18  # a control reply: one UTF-8 JSON frame
    ERROR = 19  # ``code`` says what was wrong; one UTF-8 frame says it in words


REQUESTS = frozenset(t for t in MsgType if t < MsgType.ACK)


class Flag(IntFlag):
    """Header flag bits."""

    NO_BASIS = 1  # a push computed against no known version (staleness counts as 0)
    RESEND = 2  # a retry of a request already sent (informational)


NO_BASIS, RESEND = int(Flag.NO_BASIS), int(Flag.RESEND)  # plain ints for the hot paths
KNOWN_FLAGS = NO_BASIS | RESEND


class DType(IntEnum):
    """Element types of array frames."""

    NONE = 0
    FLOAT32 = 1
    FLOAT64 = 2
    UINT64 = 3
    UINT8 = 4  # bytes: UTF-8 text, JSON, names
    INT64 = 5  # record indices
    INT32 = 6  # labels


DTYPES = {
    DType.FLOAT32: np.dtype("<f4"),
    DType.FLOAT64: np.dtype("<f8"),
    DType.UINT64: np.dtype("<u8"),
    DType.UINT8: np.dtype("u1"),
    DType.INT64: np.dtype("<i8"),
    DType.INT32: np.dtype("<i4"),
}


class ErrorCode(IntEnum):
    """Why a request was refused (the ``code`` of an ``ERROR`` reply)."""

    BAD_HEADER = 1  # the header frame is malformed
    BAD_FRAMES = 2  # frames missing, extra, or of the wrong size
    UNEXPECTED = 3  # a message a server does not take (a reply type, an unknown operation)
    WRONG_JOB = 4  # the header's job is not this server's
    BAD_TARGET = 5  # no such shard here
    BAD_RANGE = 6  # a range outside the shard
    BAD_LAYER = 7  # not a fully connected layer of the model, or the wrong geometry
    STALE = 8  # refused: staler than ps.max_staleness
    BUSY = 9  # the server's queues are full: retry later
    BAD_NAME = 10  # a vector name that is not allowed
    BAD_VALUE = 11  # a scalar out of range (not finite)
    INTERNAL = 12  # the server failed on a valid request
    NOT_PRIMARY = 13  # not (or not yet) the serving primary of the shard's bucket: re-read the map
    FENCED = 14  # replication: an older epoch or lease than the bucket's: the sender steps down
    NEED_SYNC = 15  # replication: a copy missed an update: it needs a snapshot
    REPLACED = 16  # the sender's replica incarnation was replaced by the driver: it must stop;
    # (a copy's answer to a primary) this server is stopping: it takes no replication message
    STOPPED = 17  # the shard's bucket stopped here: a write it acknowledged failed to apply
    READS_WAITING = 18  # the bucket's primary, its reads waiting out its predecessor's lease:
    # send the pull again to the same server after a pause (no map read: the map is current)


class WireError(HogwildError, ValueError):
    """A frame that is not a valid message part; ``code`` is the :class:`ErrorCode` to reply."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.BAD_HEADER) -> None:
        super().__init__(message)
        self.code = code


class Header(NamedTuple):
    """One message header (see the module docstring for the fields). A tuple: cheap to make."""

    type: MsgType
    job: int = 0
    sender: int = 0
    target: int = 0
    seq: int = 0
    version: int = 0
    offset: int = 0
    shape: tuple[int, ...] = ()
    dtype: DType = DType.NONE
    frames: int = 0
    flags: int = 0
    code: int = 0
    aux: int = 0
    lease: int = 0
    a: float = 0.0
    b: float = 0.0
    wire: int = WIRE_VERSION

    def reply(self, type: MsgType, version: int = 0, **changes) -> Header:
        """A reply to this request: same job, sender, target and sequence number."""
        if changes:
            return Header(type, self.job, self.sender, self.target, self.seq, version, **changes)
        return _tuple_new(
            Header, (type, self.job, self.sender, self.target, self.seq, version, *_REPLY_REST)
        )


_TYPES = {int(t): t for t in MsgType}
_DTYPE_CODES = {int(d): d for d in DType}
_ITEMSIZE = {int(d): (DTYPES[d].itemsize if d in DTYPES else 0) for d in DType}
_unpack = HEADER.unpack
_pack = HEADER.pack
_PAD = [(0,) * (4 - n) for n in range(5)]  # the unused dimensions of a shape of n
_tuple_new = tuple.__new__  # a Header without the field-count check of its __new__
_REPLY_REST = Header(MsgType.ACK)[6:]  # the defaults of the fields after version


def frame_nbytes(header: Header) -> list[int]:
    """Bytes of each array frame the header describes ([] when it has none).

    A ``PUSH_VECTORS`` shape ``(k, m, rows)`` describes two frames, ``k x m`` activations and
    ``rows x k`` errors; a ``PUSH_DELTAS`` of two frames is a push into a named vector: the
    delta, then the vector's name in ``aux`` bytes; any other shape describes one array of that
    shape.
    """
    if header.dtype == DType.NONE:
        return []
    itemsize = DTYPES[header.dtype].itemsize
    if header.type == MsgType.PUSH_VECTORS and len(header.shape) == 3:
        k, m, rows = header.shape
        return [k * m * itemsize, rows * k * itemsize]
    if header.type == MsgType.PUSH_DELTAS and header.frames == 2:
        return [math.prod(header.shape) * itemsize, header.aux]
    return [math.prod(header.shape) * itemsize]


def array_nbytes(header: Header) -> int:
    """Bytes of the largest array frame the header describes (0 when it has none)."""
    return max(frame_nbytes(header), default=0)


def peek_request(frame) -> Header | None:
    """The job, sender, target and sequence number of a header that :func:`unpack_header`
    refused, so the error reply reaches the request that caused it; None when the frame is not
    even a header of this wire version (the reply then goes out unnumbered)."""
    buf = memoryview(frame)
    if buf.nbytes != HEADER_SIZE:
        return None
    fields = HEADER.unpack(buf.cast("B"))
    magic, wire, job, sender, target, seq = fields[0], fields[1], *fields[7:11]
    if magic != MAGIC or wire != WIRE_VERSION:
        return None
    return Header(MsgType.ERROR, job, sender, target, seq)


def pack_header(h: Header) -> bytes:
    """The header frame of ``h``.

    Raises:
        WireError: A field does not fit its slot (a bad value built by the caller).
    """
    shape = h.shape
    ndim = len(shape)
    if ndim > 4:
        raise WireError(f"header: shape {shape} has more than 4 dimensions")
    try:
        # IntEnum members and ints pack as they are; a float slot takes an int too.
        return _pack(
            MAGIC,
            h.wire,
            h.type,
            h.flags,
            h.dtype,
            ndim,
            h.code,
            h.job,
            h.sender,
            h.target,
            h.seq,
            h.version,
            h.offset,
            *shape,
            *_PAD[ndim],
            h.frames,
            h.aux,
            h.lease,
            h.a,
            h.b,
        )
    except struct.error as exc:
        raise WireError(f"header: a field is out of range ({exc}): {h}") from exc


def unpack_header(frame) -> Header:
    """Decode and check a header frame (bytes, a memoryview or a zmq frame's buffer).

    Raises:
        WireError: Wrong length, magic or version, unknown type, flags or dtype, a shape that
            does not match ``ndim``, too many frames, an array over :data:`MAX_ARRAY_BYTES`, or a
            scalar that is not finite. The message names the field.
    """
    # Every request and reply passes here, straight after a wait that left the caches cold:
    # the common case takes few steps (each check first in its cheapest form).
    try:
        fields = _unpack(frame)
    except (struct.error, TypeError, BufferError, ValueError):
        buf = memoryview(frame)
        if buf.nbytes != HEADER_SIZE:
            raise WireError(f"header: {buf.nbytes} bytes, expected {HEADER_SIZE}") from None
        fields = _unpack(buf.cast("B"))
    (
        magic,
        wire,
        mtype,
        flags,
        dtype,
        ndim,
        code,
        job,
        sender,
        target,
        seq,
        version,
        offset,
        s0,
        s1,
        s2,
        s3,
        frames,
        aux,
        lease,
        a,
        b,
    ) = fields
    if magic != MAGIC:
        raise WireError(f"header: magic {magic!r}, expected {MAGIC!r}")
    if wire != WIRE_VERSION:
        raise WireError(f"header: wire version {wire}, expected {WIRE_VERSION}")
    known = _TYPES.get(mtype)
    if known is None:
        raise WireError(f"header: unknown message type {mtype}", ErrorCode.UNEXPECTED)
    if flags & ~KNOWN_FLAGS:
        raise WireError(f"header: unknown flag bits {flags & ~KNOWN_FLAGS:#x}")
    dtype_code = _DTYPE_CODES.get(dtype)
    if dtype_code is None:
        raise WireError(f"header: unknown dtype code {dtype}")
    if ndim == 0:
        shape = ()
        if s0 or s1 or s2 or s3:
            raise WireError(f"header: shape {(s0, s1, s2, s3)} does not match ndim 0")
    elif ndim == 1 and s0 and not (s1 or s2 or s3):
        shape = (s0,)
    else:
        full = (s0, s1, s2, s3)
        if ndim > 4:
            raise WireError(f"header: ndim {ndim}, expected 0 to 4")
        if 0 in full[:ndim] or any(full[ndim:]):
            raise WireError(f"header: shape {full} does not match ndim {ndim}")
        shape = full[:ndim]
    if (dtype == 0) != (ndim == 0):
        raise WireError(f"header: dtype {dtype_code.name} with ndim {ndim}")
    if frames > MAX_FRAMES:
        raise WireError(f"header: {frames} frames, at most {MAX_FRAMES}")
    if (a or b) and not (math.isfinite(a) and math.isfinite(b)):
        raise WireError(f"header: scalars must be finite, got a={a}, b={b}", ErrorCode.BAD_VALUE)
    header = _tuple_new(
        Header,
        (
            known,
            job,
            sender,
            target,
            seq,
            version,
            offset,
            shape,
            dtype_code,
            frames,
            flags,
            code,
            aux,
            lease,
            a,
            b,
            wire,
        ),
    )
    # No frame is larger than the product of the dimensions or (a name) aux: that first.
    if ndim and (math.prod(shape) * _ITEMSIZE[dtype] > MAX_ARRAY_BYTES or aux > MAX_ARRAY_BYTES):
        if array_nbytes(header) > MAX_ARRAY_BYTES:
            raise WireError(f"header: an array of {shape} is over {MAX_ARRAY_BYTES} bytes")
    return header


def frame_array(frame, dtype: DType, shape: tuple[int, ...], what: str = "frame") -> np.ndarray:
    """A read-only array over ``frame`` (no copy) of ``dtype`` and ``shape``.

    Raises:
        WireError: The frame's size does not match (``BAD_FRAMES``).
    """
    buf = memoryview(frame)
    np_dtype = DTYPES[dtype]
    expected = (shape[0] if len(shape) == 1 else math.prod(shape)) * np_dtype.itemsize
    if buf.nbytes != expected:
        raise WireError(
            f"{what}: {buf.nbytes} bytes, expected {expected} ({dtype.name} {tuple(shape)})",
            ErrorCode.BAD_FRAMES,
        )
    array = np.frombuffer(buf, dtype=np_dtype)
    return array if len(shape) == 1 else array.reshape(shape)


def job_id(name: str) -> int:
    """The 64-bit id of a job name (BLAKE2b); never 0, which status requests use as 'any job'."""
    digest = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return digest or 1
