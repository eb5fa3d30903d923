"""The version-1 image record: round trips, header fields, and every malformed record refused."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from hogwild.data import record
from hogwild.errors import DataError


def _rgb(h=5, w=7, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("shape", [(28, 28), (28, 28, 1), (5, 7, 3), (1, 1, 3)])
def test_round_trip(shape):
    pixels = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    raw = record.encode(pixels, 7)
    h, w = shape[:2]
    c = shape[2] if len(shape) == 3 else 1
    assert len(raw) == record.HEADER_SIZE + h * w * c == record.record_size((h, w, c))
    decoded, label = record.decode(raw, shape=(h, w, c), verify=True)
    assert label == 7
    assert decoded.shape == (h, w, c)
    np.testing.assert_array_equal(decoded.reshape(shape), pixels)


def test_header_layout_is_documented_one():
    pixels = _rgb()
    raw = record.encode(pixels, 1234)
    magic, version, channels, height, width, label, crc = struct.unpack_from("<4sHHIIiI", raw)
    assert (magic, version, channels, height, width, label) == (b"HWIM", 1, 3, 5, 7, 1234)
    assert crc == zlib.crc32(pixels.tobytes())
    assert raw[24:] == pixels.tobytes()  # HWC, row-major
    header = record.decode_header(raw)
    assert header.shape == (5, 7, 3) and header.pixel_bytes == 105


def test_header_prefix_matches_every_record_of_a_shape():
    prefix = record.header_prefix((5, 7, 3)).tobytes()
    for label in (0, 3, 999):
        assert record.encode(_rgb(seed=label), label)[:16] == prefix
    assert record.encode(_rgb(5, 8), 0)[:16] != prefix


def test_wrong_version_is_refused_with_the_location():
    raw = bytearray(record.encode(_rgb(), 1))
    struct.pack_into("<H", raw, 4, 2)
    with pytest.raises(DataError, match=r"record 9 of x\.mdb: record format version 2.*version 1"):
        record.decode(bytes(raw), where="record 9 of x.mdb")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda raw: raw[:10], "truncated record"),
        (lambda raw: b"JUNK" + raw[4:], "not a hogwild image record"),
        (lambda raw: raw[:-1], "expected 129"),
        (lambda raw: raw + b"\0", "expected 129"),
        (lambda raw: raw[:6] + struct.pack("<H", 2) + raw[8:], "impossible image shape"),
        (lambda raw: raw[:8] + struct.pack("<I", 0) + raw[12:], "impossible image shape"),
    ],
)
def test_malformed_records_are_refused(mutate, message):
    raw = record.encode(_rgb(), 1)
    with pytest.raises(DataError, match=message):
        record.decode(mutate(raw))


def test_shape_mismatch_and_checksum():
    raw = record.encode(_rgb(), 1)
    with pytest.raises(DataError, match=r"shape \[5, 7, 3\], expected \[7, 5, 3\]"):
        record.decode(raw, shape=(7, 5, 3))
    corrupt = bytearray(raw)
    corrupt[30] ^= 0xFF
    record.decode(bytes(corrupt))  # the CRC is checked only when asked
    with pytest.raises(DataError, match="checksum mismatch"):
        record.decode(bytes(corrupt), verify=True)


def test_encode_rejects_what_it_cannot_store():
    with pytest.raises(ValueError, match="uint8"):
        record.encode(np.zeros((4, 4), np.float32), 0)
    with pytest.raises(ValueError, match=r"\[H, W, 1\|3\]"):
        record.encode(np.zeros((4, 4, 2), np.uint8), 0)
    with pytest.raises(ValueError, match="labels"):
        record.encode(np.zeros((4, 4), np.uint8), -1)


def test_encode_batch():
    images = np.random.default_rng(2).integers(0, 256, (3, 4, 4), dtype=np.uint8)
    raws = record.encode_batch(images, np.array([2, 0, 1]))
    assert [record.decode(r)[1] for r in raws] == [2, 0, 1]
