"""The wire format: header round trips, and properties of the decoder (hypothesis)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hogwild.net.wire import (
    HEADER,
    HEADER_SIZE,
    MAX_ARRAY_BYTES,
    MAX_FRAMES,
    DType,
    ErrorCode,
    Flag,
    Header,
    MsgType,
    WireError,
    array_nbytes,
    frame_array,
    job_id,
    pack_header,
    peek_request,
    unpack_header,
)

U32, U64 = st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
FINITE = st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def headers(draw) -> Header:
    dtype = draw(st.sampled_from(list(DType)))
    ndim = 0 if dtype == DType.NONE else draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 8), min_size=ndim, max_size=ndim)))
    header = Header(
        type=draw(st.sampled_from(list(MsgType))),
        job=draw(U64),
        sender=draw(U32),
        target=draw(U32),
        seq=draw(U64),
        version=draw(U64),
        offset=draw(U64),
        shape=shape,
        dtype=dtype,
        frames=draw(st.integers(0, MAX_FRAMES)),
        flags=draw(st.sampled_from([0, int(Flag.NO_BASIS), int(Flag.RESEND), 3])),
        code=draw(st.integers(0, 2**16 - 1)),
        aux=draw(U32),
        lease=draw(U64),
        a=draw(FINITE),
        b=draw(FINITE),
    )
    # A push into a named vector carries the name's length in aux, which then sizes a frame:
    # a header whose frames would be over the limit is not valid (and is refused).
    assume(array_nbytes(header) <= MAX_ARRAY_BYTES)
    return header


def test_header_round_trip_and_size():
    h = Header(
        MsgType.PUSH_DELTAS,
        job=job_id("mnist"),
        sender=3,
        target=7,
        seq=2**40 + 5,
        version=11,
        offset=100,
        shape=(2048,),
        dtype=DType.FLOAT32,
        frames=1,
        flags=Flag.NO_BASIS,
        a=0.25,
    )
    frame = pack_header(h)
    assert len(frame) == HEADER_SIZE == HEADER.size
    assert unpack_header(frame) == h
    assert unpack_header(memoryview(frame)) == h  # zero-copy views decode the same


@settings(deadline=None)  # a loaded machine may pause one example past hypothesis's 200 ms
@given(headers())
def test_every_valid_header_round_trips(h):
    frame = pack_header(h)
    assert unpack_header(frame) == h
    assert pack_header(unpack_header(frame)) == frame


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2 * HEADER_SIZE))
def test_decoder_accepts_or_names_the_problem_for_any_bytes(raw):
    try:
        h = unpack_header(raw)
    except WireError as exc:
        assert str(exc).startswith("header:")
        assert isinstance(exc.code, ErrorCode)
    else:
        assert pack_header(h) == raw


@settings(max_examples=300, deadline=None)
@given(headers(), st.integers(0, HEADER_SIZE - 1), st.integers(1, 255))
def test_mutated_headers_are_refused_or_decode_consistently(h, position, xor):
    raw = bytearray(pack_header(h))
    raw[position] ^= xor
    try:
        decoded = unpack_header(bytes(raw))
    except WireError:
        return
    assert pack_header(decoded) == bytes(raw)  # accepted: a valid header, nothing lost


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("magic", b"XXXX", "magic"),
        ("wire", 9, "wire version"),
        ("type", 99, "unknown message type"),
        ("flags", 0x80, "flag"),
        ("dtype", 42, "dtype"),
        ("ndim", 5, "ndim"),
        ("frames", MAX_FRAMES + 1, "frames"),
    ],
)
def test_each_bad_field_is_named(field, value, needle):
    fields = list(HEADER.unpack(pack_header(Header(MsgType.PING))))
    index = {"magic": 0, "wire": 1, "type": 2, "flags": 3, "dtype": 4, "ndim": 5, "frames": 17}
    fields[index[field]] = value
    with pytest.raises(WireError, match=needle):
        unpack_header(HEADER.pack(*fields))


def test_shape_must_match_ndim_and_size_is_bounded():
    fields = list(HEADER.unpack(pack_header(Header(MsgType.PING))))
    fields[4], fields[5], fields[13] = int(DType.FLOAT32), 1, 0  # ndim 1 with shape[0] = 0
    with pytest.raises(WireError, match="does not match ndim"):
        unpack_header(HEADER.pack(*fields))
    fields[13], fields[14], fields[5] = 2**20, 2**20, 2  # 2^40 floats: over the limit
    with pytest.raises(WireError, match="over"):
        unpack_header(HEADER.pack(*fields))


def test_nan_scalars_are_refused_with_bad_value():
    raw = bytearray(pack_header(Header(MsgType.PING)))
    struct.pack_into("<d", raw, HEADER_SIZE - 16, float("nan"))
    with pytest.raises(WireError) as info:
        unpack_header(bytes(raw))
    assert info.value.code == ErrorCode.BAD_VALUE


def test_wrong_length_is_refused():
    with pytest.raises(WireError, match=f"expected {HEADER_SIZE}"):
        unpack_header(pack_header(Header(MsgType.PING)) + b"\0")


def test_frame_array_is_a_view_and_checks_the_size():
    data = np.arange(6, dtype=np.float32)
    view = frame_array(memoryview(data), DType.FLOAT32, (2, 3))
    assert view.shape == (2, 3) and np.shares_memory(view, data)
    with pytest.raises(WireError) as info:
        frame_array(data.tobytes()[:-1], DType.FLOAT32, (2, 3))
    assert info.value.code == ErrorCode.BAD_FRAMES


def test_job_ids_are_stable_and_never_zero():
    assert job_id("adam_mnist") == job_id("adam_mnist") != job_id("adam_mnist2")
    assert all(job_id(str(i)) != 0 for i in range(1000))


def test_reply_keeps_the_request_identity():
    request = Header(MsgType.PULL, job=5, sender=9, target=3, seq=77)
    reply = request.reply(MsgType.DATA, version=4)
    assert (reply.job, reply.sender, reply.target, reply.seq, reply.version) == (5, 9, 3, 77, 4)


def test_a_vector_push_is_sized_by_its_two_frames_not_the_product_of_its_shape():
    # k = 256 vectors of a 1024 x 1024 layer, all 1024 rows of a shard: 1 MiB per frame, while
    # k * m * rows floats would be 1 GiB, over the limit
    request = Header(MsgType.PUSH_VECTORS, shape=(256, 1024, 1024), dtype=DType.FLOAT32, frames=2)
    assert unpack_header(pack_header(request)).shape == (256, 1024, 1024)
    too_big = request._replace(shape=(2**15, 2**10, 1))  # a 128 MiB activation frame
    with pytest.raises(WireError, match="over"):
        unpack_header(pack_header(too_big))


def test_a_refused_header_still_names_the_request_it_came_from():
    request = Header(MsgType.PULL, job=5, sender=9, target=3, seq=77)
    fields = list(HEADER.unpack(pack_header(request)))
    fields[5] = 7  # ndim 7: refused
    raw = HEADER.pack(*fields)
    with pytest.raises(WireError):
        unpack_header(raw)
    found = peek_request(raw)
    assert (found.job, found.sender, found.target, found.seq) == (5, 9, 3, 77)
    assert peek_request(b"HGWX" + raw[4:]) is None and peek_request(raw[:-1]) is None
