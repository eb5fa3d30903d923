"""The idx file format MNIST ships in: strict reading (gzip or plain) and writing.

An idx file is a 4-byte magic number -- two zero bytes, a type code (0x08 for unsigned bytes) and
the number of dimensions -- then one big-endian uint32 per dimension, then the values in C order,
big-endian. MNIST gzips each file; a plain (already decompressed) file is read the same way. The
compression is recognised by the gzip signature, not by the file name.

Invariant: every array returned here matches its header exactly -- the magic, the type code, the
shape the caller expects and the number of data bytes (neither fewer nor trailing extra), and for a
gzip file the stream's CRC. Anything else raises :class:`hogwild.errors.DataError` with the path
and what was expected versus found. The data is read straight into the result array (no per-byte
Python loops, no intermediate copy) and the shape is checked before anything is allocated, so a
foreign file whose "header" claims terabytes fails fast instead of exhausting memory.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.typing import DTypeLike

from hogwild.errors import DataError

IMAGE_SHAPE = (28, 28)
"""Height and width of an MNIST image."""

NUM_CLASSES = 10
"""MNIST labels are the digits 0..9."""

_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES = {dtype.newbyteorder("="): code for code, dtype in _DTYPES.items()}
_GZIP_MAGIC = b"\x1f\x8b"
# Deflate cannot expand data by more than about 1032:1; a header claiming more is lying.
_MAX_DEFLATE_RATIO = 1032
_SIGNATURES = (
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"PK\x03\x04", "a zip archive"),
    (b"<", "HTML or XML text"),
)


def read_idx(
    path: str | os.PathLike,
    *,
    shape: Sequence[int | None] | None = None,
    dtype: DTypeLike | None = None,
    what: str = "idx data",
) -> np.ndarray:
    """Read an idx file, gzip-compressed or plain, validating it completely.

    Args:
        path: The file to read.
        shape: The expected shape; ``None`` entries accept any size (``(None, 28, 28)`` for
            images). ``None`` accepts any shape.
        dtype: The expected element type (``np.uint8`` for MNIST); ``None`` accepts any.
        what: What the file should hold ("images", "labels"), used in error messages.

    Returns:
        The values, in native byte order, with the shape the header gives. The array is writable
        and is its own (no other array shares its memory).

    Raises:
        DataError: The file is missing or unreadable, is not an idx file, has an unexpected type
            or shape, is truncated or has trailing bytes, or its gzip stream is corrupt.
    """
    path = Path(path)
    try:
        raw = path.open("rb")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found (expected an idx file of {what})") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot open: {exc.strerror or exc}") from None
    with raw:
        compressed = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        file_size = os.fstat(raw.fileno()).st_size
        stream: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw
        try:
            return _parse(stream, path, compressed, file_size, shape, dtype, what)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise DataError(
                f"{path}: corrupt or truncated gzip stream ({exc}); expected a complete "
                f"gzip-compressed idx file of {what}"
            ) from None
        finally:
            if compressed:
                stream.close()


def read_images(path: str | os.PathLike) -> np.ndarray:
    """Read an MNIST image file: uint8 of shape ``[N, 28, 28]``.

    Raises:
        DataError: As :func:`read_idx`.
    """
    return read_idx(path, shape=(None, *IMAGE_SHAPE), dtype=np.uint8, what="images")


def read_labels(path: str | os.PathLike, num_classes: int = NUM_CLASSES) -> np.ndarray:
    """Read an MNIST label file: uint8 of shape ``[N]``, every value in ``0..num_classes-1``.

    Raises:
        DataError: As :func:`read_idx`, or a label is out of range.
    """
    labels = read_idx(path, shape=(None,), dtype=np.uint8, what="labels")
    bad = labels >= num_classes
    if bad.any():
        first = int(np.argmax(bad))
        raise DataError(
            f"{path}: label values must be 0..{num_classes - 1}, found {int(labels[first])} at "
            f"index {first} ({int(bad.sum())} of {labels.size} labels out of range)"
        )
    return labels


def write_idx(path: str | os.PathLike, array: np.ndarray, *, compress: bool | None = None) -> None:
    """Write an array as an idx file (gzip-compressed when ``compress`` or the name ends in .gz).

    Args:
        path: The file to write (replaced if it exists).
        array: Values of one of the idx types: uint8, int8, int16, int32, float32, float64.
        compress: Gzip the file; ``None`` decides by the ``.gz`` suffix.

    Raises:
        ValueError: The array's type or shape cannot be stored in an idx file.
    """
    path = Path(path)
    array = np.asarray(array)
    code = _CODES.get(array.dtype.newbyteorder("="))
    if code is None:
        raise ValueError(f"idx files cannot hold {array.dtype}; use one of {sorted(_CODES)}")
    if not 1 <= array.ndim <= 255:
        raise ValueError(f"idx files hold 1 to 255 dimensions, got {array.ndim}")
    header = bytes((0, 0, code, array.ndim)) + np.asarray(array.shape, dtype=">u4").tobytes()
    body = np.ascontiguousarray(array, dtype=_DTYPES[code]).tobytes()
    if compress is None:
        compress = path.suffix == ".gz"
    if compress:
        with gzip.GzipFile(path, "wb", mtime=0) as out:
            out.write(header)
            out.write(body)
    else:
        with path.open("wb") as out:
            out.write(header)
            out.write(body)


def _parse(
    stream: BinaryIO,
    path: Path,
    compressed: bool,
    file_size: int,
    shape: Sequence[int | None] | None,
    dtype: DTypeLike | None,
    what: str,
) -> np.ndarray:
    """Read header and data from an open (decompressing) stream; see :func:`read_idx`."""
    magic = _read_exact(stream, 4)
    if len(magic) < 4:
        raise DataError(
            f"{path}: truncated: expected a 4-byte idx header, found {len(magic)} byte(s)"
        )
    if magic[:2] != b"\0\0" or magic[2] not in _DTYPES or magic[3] == 0:
        found = magic.hex(" ")
        guess = next((name for sig, name in _SIGNATURES if magic.startswith(sig)), None)
        raise DataError(
            f"{path}: not an idx file: expected magic bytes 00 00 <type> <ndim> "
            f"(00 00 08 0N for MNIST {what}), found {found}" + (f" ({guess})" if guess else "")
        )
    found_dtype, ndim = _DTYPES[magic[2]], magic[3]
    if dtype is not None and found_dtype.newbyteorder("=") != np.dtype(dtype):
        raise DataError(
            f"{path}: expected {what} of type {np.dtype(dtype)}, found idx type code "
            f"0x{magic[2]:02x} ({found_dtype.newbyteorder('=')})"
        )
    dims_bytes = _read_exact(stream, 4 * ndim)
    if len(dims_bytes) < 4 * ndim:
        raise DataError(
            f"{path}: truncated: the header announces {ndim} dimension(s) "
            f"({4 * ndim} bytes), found {len(dims_bytes)} byte(s)"
        )
    dims = tuple(int(d) for d in np.frombuffer(dims_bytes, dtype=">u4"))
    if shape is not None and (
        len(dims) != len(shape)
        or any(e is not None and e != d for e, d in zip(shape, dims, strict=True))
    ):
        wanted = "[" + ", ".join("N" if e is None else str(e) for e in shape) + "]"
        raise DataError(f"{path}: expected {what} of shape {wanted}, found {list(dims)}")

    nbytes = found_dtype.itemsize * int(np.prod(dims, dtype=object))
    header_size = 4 + 4 * ndim
    if not compressed and file_size - header_size != nbytes:
        problem = "truncated" if file_size - header_size < nbytes else "trailing bytes"
        raise DataError(
            f"{path}: {problem}: shape {list(dims)} needs {nbytes} bytes of data after the "
            f"{header_size}-byte header, found {file_size - header_size}"
        )
    if compressed and nbytes > _MAX_DEFLATE_RATIO * file_size:
        raise DataError(
            f"{path}: the header claims shape {list(dims)} ({nbytes} bytes), more than a "
            f"{file_size}-byte gzip file can hold; the file is corrupt"
        )

    if compressed:  # the header's size is a claim: memory grows only as the stream delivers
        array, filled = _read_claimed(stream, nbytes, dims, found_dtype)
    else:
        array = np.empty(dims, dtype=found_dtype)
        view = memoryview(array.reshape(-1).view(np.uint8))
        filled = 0
        while filled < nbytes:
            got = stream.readinto(view[filled:])
            if not got:
                break
            filled += got
    if filled < nbytes:
        raise DataError(
            f"{path}: truncated: shape {list(dims)} needs {nbytes} bytes of data, "
            f"found only {filled}"
        )
    if stream.read(1):  # for gzip this also reaches the end of the stream and checks its CRC
        raise DataError(
            f"{path}: trailing bytes after the {nbytes} bytes of data that shape {list(dims)} needs"
        )
    return array if found_dtype.isnative else array.astype(found_dtype.newbyteorder("="))


_GROW_BYTES = 1 << 20  # a compressed stream is read in pieces of this


def _read_claimed(stream: BinaryIO, nbytes: int, dims, dtype) -> tuple[np.ndarray, int]:
    """Up to ``nbytes`` from a decompressing stream into an array of ``dims``, grown piece by
    piece as the data arrives: a header that claims more than the stream holds costs what the
    stream holds (at most twice, while the last piece is added), not what it claims."""
    data = bytearray()
    while len(data) < nbytes:
        piece = stream.read(min(_GROW_BYTES, nbytes - len(data)))
        if not piece:
            break
        data += piece
    if len(data) < nbytes:
        return np.empty(0, dtype), len(data)
    return np.frombuffer(data, dtype=dtype).reshape(dims), len(data)


def _read_exact(stream: BinaryIO, size: int) -> bytes:
    """Read ``size`` bytes, fewer only at the end of the stream."""
    chunks, remaining = [], size
    while remaining > 0:
        chunk = stream.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
