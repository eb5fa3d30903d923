"""The image record format of hogwild's LMDB image cache, version 1: encode, decode, validate.

One record is one image and its label: a fixed 24-byte little-endian header, then the pixels.

======  =====  ============================================================================
offset  type   field
======  =====  ============================================================================
0       4s     magic ``b"HWIM"`` (hogwild image)
4       u16    record format version (:data:`RECORD_VERSION`, 1)
6       u16    channels C (1 = grey, 3 = RGB)
8       u32    height H
12      u32    width W
16      i32    label (class index, 0-based)
20      u32    CRC-32 (zlib) of the pixel bytes
24      u8[]   pixels, H * W * C bytes in row-major HWC order (channels interleaved)
======  =====  ============================================================================

A record is exactly ``24 + H * W * C`` bytes. The first 16 bytes (magic, version, shape) are the
same for every record of a cache, so a batched reader validates a record by comparing them with
:func:`header_prefix` as two 64-bit words; the CRC is checked by full verification
(:func:`decode` with ``verify=True``, ``ImageCache.verify``), not on every training read.

Invariant: :func:`decode` returns pixels only from a record whose magic, version, shape and size
all match; anything else is a :class:`hogwild.errors.DataError` saying which record of which file
and what was expected versus found. A version this code does not know is refused, never guessed.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from hogwild.errors import DataError

MAGIC = b"HWIM"
"""The first four bytes of every record."""

RECORD_VERSION = 1
"""The record format version this module writes and reads."""

HEADER = struct.Struct("<4sHHIIiI")
"""The header layout: magic, version, channels, height, width, label, pixel CRC-32."""

HEADER_SIZE = HEADER.size
"""Bytes before the pixels (24)."""

MAX_SIDE = 1 << 16
"""Largest height or width a record may declare (a guard against garbage headers)."""


@dataclass(frozen=True)
class RecordHeader:
    """The decoded header of one record.

    Attributes:
        version: Record format version.
        channels: C, 1 or 3.
        height: H in pixels.
        width: W in pixels.
        label: Class index.
        crc32: CRC-32 of the pixel bytes.
    """

    version: int
    channels: int
    height: int
    width: int
    label: int
    crc32: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """(H, W, C) of the pixels."""
        return (self.height, self.width, self.channels)

    @property
    def pixel_bytes(self) -> int:
        """H * W * C."""
        return self.height * self.width * self.channels


def record_size(shape: tuple[int, int, int]) -> int:
    """Bytes of one record holding an image of ``shape`` (H, W, C)."""
    height, width, channels = shape
    return HEADER_SIZE + height * width * channels


def header_prefix(shape: tuple[int, int, int]) -> np.ndarray:
    """The 16 bytes every record of ``shape`` starts with, as two little-endian uint64 words."""
    height, width, channels = shape
    raw = HEADER.pack(MAGIC, RECORD_VERSION, channels, height, width, 0, 0)[:16]
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64)


def encode(pixels: np.ndarray, label: int) -> bytes:
    """Encode one image as a version-1 record.

    Args:
        pixels: uint8 ``[H, W]`` (grey) or ``[H, W, C]`` with C in (1, 3).
        label: The class index, 0 or more.

    Returns:
        The record's bytes: header then pixels.

    Raises:
        ValueError: The array is not uint8, has another rank or channel count, or the label is
            negative.
    """
    pixels = np.asarray(pixels)
    if pixels.dtype != np.uint8:
        raise ValueError(f"record pixels must be uint8, got {pixels.dtype}")
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pixels.ndim != 3 or pixels.shape[2] not in (1, 3):
        raise ValueError(f"record pixels must be [H, W] or [H, W, 1|3], got {list(pixels.shape)}")
    height, width, channels = pixels.shape
    if not (0 < height <= MAX_SIDE and 0 < width <= MAX_SIDE):
        raise ValueError(f"image sides must be 1..{MAX_SIDE}, got {height}x{width}")
    if label < 0:
        raise ValueError(f"labels must be 0 or more, got {label}")
    body = np.ascontiguousarray(pixels).tobytes()
    header = HEADER.pack(MAGIC, RECORD_VERSION, channels, height, width, label, zlib.crc32(body))
    return header + body


def encode_batch(images: np.ndarray, labels: np.ndarray) -> list[bytes]:
    """Encode ``n`` images (uint8 ``[n, H, W]`` or ``[n, H, W, C]``) with their labels."""
    return [encode(images[i], int(labels[i])) for i in range(len(images))]


def decode_header(raw: bytes | memoryview, *, where: str = "record") -> RecordHeader:
    """Parse and check a record's header and size.

    Args:
        raw: The whole record.
        where: What the record is ("record 17 of cache/data.mdb"), for error messages.

    Raises:
        DataError: Too short, wrong magic, an unknown version, an impossible shape, or a size
            that does not match the shape.
    """
    if len(raw) < HEADER_SIZE:
        raise DataError(
            f"{where}: truncated record: {len(raw)} byte(s), expected a {HEADER_SIZE}-byte header"
        )
    magic, version, channels, height, width, label, crc = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise DataError(
            f"{where}: not a hogwild image record: expected magic {MAGIC!r}, found {magic!r}"
        )
    if version != RECORD_VERSION:
        raise DataError(
            f"{where}: record format version {version}, but this hogwild reads version "
            f"{RECORD_VERSION}; rebuild the cache with `hogwild data ingest`"
        )
    if channels not in (1, 3) or not (0 < height <= MAX_SIDE and 0 < width <= MAX_SIDE):
        raise DataError(f"{where}: impossible image shape {height}x{width}x{channels}")
    header = RecordHeader(version, channels, height, width, label, crc)
    if len(raw) != HEADER_SIZE + header.pixel_bytes:
        raise DataError(
            f"{where}: record of {len(raw)} bytes, expected {HEADER_SIZE + header.pixel_bytes} "
            f"for a {height}x{width}x{channels} image"
        )
    return header


def decode(
    raw: bytes | memoryview,
    *,
    shape: tuple[int, int, int] | None = None,
    verify: bool = False,
    where: str = "record",
) -> tuple[np.ndarray, int]:
    """Decode one record into (pixels uint8 ``[H, W, C]``, label).

    Args:
        raw: The record's bytes.
        shape: The (H, W, C) the caller expects (a cache's shape); ``None`` accepts any.
        verify: Also check the pixels' CRC-32.
        where: What the record is, for error messages.

    Returns:
        A read-only view of the pixels (copy it to keep it past the buffer's life) and the label.

    Raises:
        DataError: As :func:`decode_header`, a shape other than ``shape``, or a CRC mismatch.
    """
    header = decode_header(raw, where=where)
    if shape is not None and header.shape != tuple(shape):
        raise DataError(f"{where}: image of shape {list(header.shape)}, expected {list(shape)}")
    body = memoryview(raw)[HEADER_SIZE:]
    if verify and zlib.crc32(body) != header.crc32:
        raise DataError(f"{where}: pixel checksum mismatch: the record is corrupt")
    pixels = np.frombuffer(body, dtype=np.uint8).reshape(header.shape)
    return pixels, header.label
