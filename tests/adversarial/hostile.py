"""A hostile client for the adversarial tests: fuzzed headers and a raw socket to send them on.

:func:`raw_headers` is a hypothesis strategy of header frames packed straight with
:data:`~hogwild.net.wire.HEADER` (so any value of every field, not only those
:func:`~hogwild.net.wire.pack_header` accepts: unknown types and dtypes, shapes that disagree
with ``ndim``, frame counts past the limit, NaN and infinite scalars, offsets and versions at
2^64 - 1), mostly with a magic and a wire version that let it reach the field checks, followed
by 0 to 10 frames of random bytes. :class:`RawClient` sends such a message on a DEALER socket
and waits for the one reply a server owes it (a CURVE client, given keys).
"""

from __future__ import annotations

import itertools
import math

import zmq
from hypothesis import strategies as st

from bench.support.hostile_frames import with_seq
from hogwild.net.auth import secure_client
from hogwild.net.wire import HEADER, MAGIC, WIRE_VERSION, MsgType, unpack_header

U16, U32, U64 = 2**16 - 1, 2**32 - 1, 2**64 - 1

# Boundary values first: hypothesis shrinks towards the front of a sampled list.
_U32S = st.one_of(st.sampled_from([0, 1, 2, 3, 7, 1024, U32 - 1, U32]), st.integers(0, U32))
_U64S = st.one_of(st.sampled_from([0, 1, 2**31, 2**32, 2**63, U64]), st.integers(0, U64))
_SCALARS = st.one_of(
    st.sampled_from([0.0, 1.0, -1.0, 1e308, -1e308, 5e-324, math.nan, math.inf, -math.inf]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_SMALL_DIMS = st.integers(0, 64)


@st.composite
def raw_headers(draw, job: int, types=tuple(MsgType)) -> list[bytes]:
    """One message: a header frame (fields anywhere in their slots), then 0..10 frames."""
    magic = draw(st.sampled_from([MAGIC] * 8 + [b"HGWX", b"\0\0\0\0"]))
    wire = draw(st.sampled_from([WIRE_VERSION] * 8 + [0, 2, 255]))
    mtype = draw(st.one_of(st.sampled_from([int(t) for t in types]), st.integers(0, 255)))
    flags = draw(st.one_of(st.sampled_from([0, 1, 2, 3]), st.integers(0, U16)))
    dtype = draw(st.integers(0, 8))
    ndim = draw(st.sampled_from([0, 1, 1, 2, 3, 4, 5, 255]))
    dims = [draw(st.one_of(_SMALL_DIMS, _U32S)) for _ in range(4)]
    code = draw(st.one_of(st.integers(0, 20), st.integers(0, U16)))
    job_field = draw(st.sampled_from([job, job, job, 0, job ^ 1]))
    sender = draw(st.one_of(st.sampled_from([0, 1, 2]), st.integers(0, U32)))
    target = draw(st.one_of(st.integers(0, 8), _U32S))
    version, offset, lease = draw(_U64S), draw(st.one_of(_SMALL_DIMS, _U64S)), draw(_U64S)
    frames = draw(st.one_of(st.integers(0, 3), st.integers(0, U32)))
    aux = draw(st.one_of(st.integers(0, 80), _U32S))
    a, b = draw(_SCALARS), draw(_SCALARS)
    head = HEADER.pack(magic, wire, mtype, flags, dtype, ndim, code, job_field, sender, target,
                       0, version, offset, *dims, frames, aux, lease, a, b)  # fmt: skip
    head = head[: draw(st.sampled_from([len(head)] * 12 + [0, 4, len(head) - 1]))]
    body = draw(st.lists(st.binary(max_size=64), max_size=10))
    return [head, *body]


SEND_WAIT_S = 5.0  # a send with no connected peer waits this long, then gives up


class RawClient:
    """A DEALER socket that sends raw messages (each given a fresh sequence number, so a
    server's duplicate check never silences one) and receives their replies."""

    _seq = itertools.count(1)

    def __init__(self, endpoint: str, keys: str | None = None) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDTIMEO, int(SEND_WAIT_S * 1000))
        if keys:  # a CURVE client of the key directory's server
            secure_client(self.socket, keys)
        self.socket.connect(endpoint)

    def send(self, message: list[bytes], may_drop: bool = False) -> bool:
        """Whether ``message`` went out within ``SEND_WAIT_S``. A DEALER with no connected peer
        (a refused CURVE handshake tears its pipe down until the next reconnect) blocks in
        send: bounded here, as every wait of the suite is. A refused client may drop
        (``may_drop``: False, and it sends nothing more); anyone else fails, naming it."""
        try:
            self.socket.send_multipart(with_seq(message, next(self._seq)))
        except zmq.Again:
            if may_drop:
                return False
            raise AssertionError(f"no peer took a message within {SEND_WAIT_S:g} s") from None
        return True

    def reply(self, timeout_s: float = 5.0) -> list[bytes]:
        """The next reply; AssertionError if none comes in time. Its header must decode."""
        assert self.socket.poll(int(timeout_s * 1000)), "no reply: the role stopped answering"
        parts = self.socket.recv_multipart()
        unpack_header(parts[0])
        return parts

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
