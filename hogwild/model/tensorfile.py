"""The safetensors file format, written and read without the ``safetensors`` package.

A file is an 8-byte little-endian u64 ``N``, then ``N`` bytes of UTF-8 JSON header, then the
raw little-endian byte buffer::

    {"conv1.weight": {"dtype": "F32", "shape": [10, 1, 5, 5], "data_offsets": [0, 1000]},
     ...,
     "__metadata__": {"format": "pt"}}

``data_offsets`` are ``[begin, end)`` relative to the start of the buffer. The header is padded
with spaces so that the buffer starts on an 8-byte boundary. This module writes tensors
contiguously in the order they are given (the header lists them in the same order), which is
what ``safetensors.numpy.load_file`` and ``safetensors.torch.load_file`` accept.

Invariants:

* A file at its final path is always whole: :func:`save_tensors` writes a temp file in the same
  directory, flushes and fsyncs it, renames it over the target with ``os.replace`` and fsyncs
  the directory (:func:`write_atomic`). A crash leaves the old file or the new one, plus at most
  a stray temp file named by :func:`temp_owner_pid`.
* :func:`load_tensors` trusts nothing in the file: every length, dtype, shape and offset is
  checked, and every problem is a :class:`~hogwild.errors.CheckpointError` that names the file
  and what is wrong. The tensors must tile the buffer exactly (no gaps, overlaps or trailing
  bytes), as the reference implementation requires.

Loaded arrays are writable, in native byte order, and backed by process memory, not by the
file (the file is read once into one buffer and closed; nothing is memory-mapped). Aligned
tensors are views into that shared read buffer; a tensor whose offset is not a multiple of its
item size is copied so that every returned array is aligned (numba kernels expect it).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hogwild.errors import CheckpointError

__all__ = [
    "DTYPES",
    "MAX_HEADER_BYTES",
    "load_tensors",
    "save_tensors",
    "temp_owner_pid",
    "write_atomic",
]

#: safetensors dtype code -> little-endian numpy dtype. BF16 and the FP8 codes have no numpy
#: equivalent and are rejected on load.
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_CODE_OF: dict[tuple[str, int], str] = {(dt.kind, dt.itemsize): code for code, dt in DTYPES.items()}

#: Largest header accepted on load (the reference implementation's limit is 100 MB).
MAX_HEADER_BYTES = 100_000_000

_METADATA_KEY = "__metadata__"
_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")


# --------------------------------------------------------------------------- atomic writes


def temp_owner_pid(name: str) -> int | None:
    """Return the writer's pid if ``name`` is a temp file made by :func:`write_atomic`.

    Args:
        name: A file name (no directory).

    Returns:
        The pid encoded in the temp file's name, or ``None`` if ``name`` is not such a file.
    """
    match = _TEMP_RE.match(name)
    return int(match["pid"]) if match else None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, chunks: Iterable[Any]) -> None:
    """Write ``chunks`` to ``path`` so that readers see the old file or the whole new one.

    The data go to ``.<name>.<pid>.<random>.tmp`` in the same directory, which is flushed,
    fsynced, renamed over ``path`` and the directory fsynced. On any failure the temp file is
    removed and the previous ``path`` (if any) is untouched.

    Args:
        path: Final file path; its directory must exist.
        chunks: Objects supporting the buffer protocol (bytes, memoryview, contiguous arrays).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


# --------------------------------------------------------------------------- writing


def _as_storable(name: object, value: Any) -> tuple[str, np.ndarray]:
    if not isinstance(name, str) or not name:
        raise TypeError(f"tensor names must be non-empty strings, got {name!r}")
    if name == _METADATA_KEY:
        raise ValueError(f"{_METADATA_KEY!r} is reserved and cannot name a tensor")
    arr = np.asarray(value)
    code = _CODE_OF.get((arr.dtype.kind, arr.dtype.itemsize))
    if code is None:
        raise TypeError(
            f"tensor {name!r} has dtype {arr.dtype}, which safetensors cannot store; "
            f"expected one of {', '.join(str(d) for d in DTYPES.values())}"
        )
    # order="C" copies only when needed and (unlike ascontiguousarray) keeps 0-d arrays 0-d.
    return code, np.asarray(arr, dtype=DTYPES[code], order="C")


def save_tensors(
    path: Path,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write ``tensors`` and ``metadata`` to a safetensors file, atomically.

    Args:
        path: Destination file; its directory must exist. An existing file is replaced.
        tensors: Name -> array. Arrays may have any shape (0-d and empty included) and any
            layout; non-contiguous or big-endian arrays are copied. Stored in this order.
        metadata: Optional string -> string map, stored as the header's ``__metadata__``.

    Raises:
        TypeError: A name is not a string, a dtype is not storable, or metadata is not str->str.
        ValueError: A tensor is named ``__metadata__``.
    """
    header: dict[str, Any] = {}
    arrays: list[np.ndarray] = []
    offset = 0
    for name, value in tensors.items():
        code, arr = _as_storable(name, value)
        header[name] = {
            "dtype": code,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
        arrays.append(arr)
    if metadata is not None:
        for key, val in metadata.items():
            if not isinstance(key, str) or not isinstance(val, str):
                raise TypeError(f"metadata must map str to str, got {key!r}: {val!r}")
        header[_METADATA_KEY] = dict(metadata)
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    chunks: list[Any] = [len(blob).to_bytes(8, "little"), blob]
    chunks.extend(arr.reshape(-1).view(np.uint8) for arr in arrays if arr.nbytes)
    write_atomic(Path(path), chunks)


# --------------------------------------------------------------------------- reading


def _read_whole(path: Path) -> np.ndarray:
    """Read ``path`` into one uint8 array, or raise CheckpointError naming it."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            buf = np.empty(size, dtype=np.uint8)
            got = f.readinto(memoryview(buf))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CheckpointError(f"{path}: is a directory, expected a .safetensors file") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc}") from exc
    if got != size:
        raise CheckpointError(f"{path}: read {got} of {size} bytes (file changed while reading?)")
    return buf


def _parse_header(path: Path, buf: np.ndarray) -> tuple[dict[str, Any], int]:
    """Return the decoded JSON header and the buffer's start offset."""
    if buf.size < 8:
        raise CheckpointError(
            f"{path}: truncated: {buf.size} bytes, too short for the 8-byte header length"
        )
    n = int.from_bytes(buf[:8].tobytes(), "little")
    if n > buf.size - 8:
        raise CheckpointError(
            f"{path}: header length {n} is larger than the file ({buf.size} bytes); "
            "truncated or not a safetensors file"
        )
    if n > MAX_HEADER_BYTES:
        raise CheckpointError(f"{path}: header length {n} exceeds the {MAX_HEADER_BYTES} limit")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, val in pairs:
            if key in out:
                raise ValueError(f"duplicate key {key!r}")
            out[key] = val
        return out

    try:
        header = json.loads(
            buf[8 : 8 + n].tobytes().decode("utf-8"), object_pairs_hook=no_duplicates
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path}: header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is a JSON {type(header).__name__}, expected object")
    return header, 8 + n


def _check_entry(path: Path, name: str, entry: Any) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """Validate one header entry; return (dtype, shape, begin, end)."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise CheckpointError(f"{where}: expected keys dtype, shape, data_offsets, got {entry!r}")
    code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if code not in DTYPES:
        raise CheckpointError(
            f"{where}: unsupported dtype {code!r}; expected one of {', '.join(DTYPES)}"
        )

    def is_count(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    if not isinstance(shape, list) or not all(is_count(d) for d in shape):
        raise CheckpointError(f"{where}: shape must be a list of non-negative ints, got {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(is_count(x) for x in offsets)
        or offsets[0] > offsets[1]
    ):
        raise CheckpointError(f"{where}: data_offsets must be [begin, end], got {offsets!r}")
    dtype = DTYPES[code]
    expected = math.prod(shape) * dtype.itemsize
    begin, end = offsets
    if end - begin != expected:
        raise CheckpointError(
            f"{where}: data_offsets {offsets} span {end - begin} bytes but shape {shape} "
            f"of {code} needs {expected}"
        )
    return dtype, tuple(shape), begin, end


def load_tensors(
    path: Path, *, expect_sha256: str | None = None
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read a safetensors file, validating every field.

    Args:
        path: The file to read.
        expect_sha256: If given, the hex sha256 the whole file must have; checked on the same
            single read that parses it.

    Returns:
        ``(tensors, metadata)``: name -> writable, aligned, native-order array in header order
        (backed by memory, not the file; see the module docstring), and the ``__metadata__``
        map (empty if absent).

    Raises:
        CheckpointError: The file is missing, unreadable, truncated, has a bad header, a
            dtype we cannot represent, offsets that do not tile the buffer, or a sha256
            different from ``expect_sha256``. The message names the file.
    """
    path = Path(path)
    buf = _read_whole(path)
    if expect_sha256 is not None:
        actual = hashlib.sha256(memoryview(buf)).hexdigest()
        if actual != expect_sha256:
            raise CheckpointError(
                f"{path}: sha256 mismatch: file has {actual}, expected {expect_sha256} "
                "(corrupt or replaced file)"
            )
    header, start = _parse_header(path, buf)
    data = buf[start:]

    raw_meta = header.pop(_METADATA_KEY, None) or {}
    if not isinstance(raw_meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw_meta.items()
    ):
        raise CheckpointError(f"{path}: __metadata__ must map str to str, got {raw_meta!r}")

    entries = {name: _check_entry(path, name, entry) for name, entry in header.items()}
    cursor = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: kv[1][2:]):
        if begin != cursor:
            problem = "overlaps the previous tensor" if begin < cursor else "leaves a gap"
            raise CheckpointError(
                f"{path}: tensor {name!r} at byte {begin} {problem} (expected {cursor})"
            )
        cursor = end
    if cursor != data.size:
        raise CheckpointError(
            f"{path}: tensors cover {cursor} bytes but the buffer holds {data.size} "
            f"({'truncated' if cursor > data.size else 'trailing bytes'})"
        )

    tensors: dict[str, np.ndarray] = {}
    for name, (dtype, shape, begin, end) in entries.items():
        arr = data[begin:end].view(dtype).reshape(shape)
        if not arr.flags.aligned:
            arr = arr.copy()
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        tensors[name] = arr
    return tensors, dict(raw_meta)
