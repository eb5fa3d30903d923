"""A checkpoint's tensor files: the safetensors format, through its package, written atomically.

The format (an 8-byte length, a JSON header, the raw little-endian buffer) is written and parsed
by the ``safetensors`` package; this module adds what a checkpoint needs around it:

* A file at its final path is always whole: :func:`write_atomic` writes a temp file in the same
  directory, flushes and fsyncs it, renames it over the target with ``os.replace`` and fsyncs
  the directory. A crash leaves the old file or the new one, plus at most a stray temp file
  named by :func:`temp_owner_pid`.
* :func:`load_tensors` trusts nothing in the file: the package validates the header, dtypes,
  shapes and offsets; every problem (and a sha256 that differs from the recorded one) is a
  :class:`~hogwild.errors.CheckpointError` naming the file. Loaded arrays are writable copies in
  native byte order, backed by process memory, not by the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from hogwild.errors import CheckpointError

__all__ = ["load_tensors", "save_tensors", "temp_owner_pid", "write_atomic"]

_METADATA_KEY = "__metadata__"
_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")
#: The numpy dtypes safetensors stores (kind, itemsize); BF16 and FP8 have no numpy equivalent.
_STORABLE = {
    ("f", 8),
    ("f", 4),
    ("f", 2),
    ("i", 8),
    ("i", 4),
    ("i", 2),
    ("i", 1),
    ("u", 8),
    ("u", 4),
    ("u", 2),
    ("u", 1),
    ("b", 1),
}


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


def save_tensors(
    path: Path,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write ``tensors`` and ``metadata`` to a safetensors file, atomically.

    Args:
        path: Destination file; its directory must exist. An existing file is replaced.
        tensors: Name -> array, any shape (0-d and empty included) and any layout.
        metadata: Optional string -> string map, stored as the header's ``__metadata__``.

    Raises:
        TypeError: A name is not a string, a dtype is not storable, or metadata is not str->str.
        ValueError: A tensor is named ``__metadata__``.
    """
    arrays = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"tensor names must be non-empty strings, got {name!r}")
        if name == _METADATA_KEY:
            raise ValueError(f"{_METADATA_KEY!r} is reserved and cannot name a tensor")
        arr = np.asarray(value)
        if (arr.dtype.kind, arr.dtype.itemsize) not in _STORABLE:
            raise TypeError(
                f"tensor {name!r} has dtype {arr.dtype}, which safetensors cannot store; "
                "expected a float, integer or bool dtype"
            )
        arrays[name] = np.asarray(arr, dtype=arr.dtype.newbyteorder("<"), order="C")
    if metadata is not None:
        for key, val in metadata.items():
            if not isinstance(key, str) or not isinstance(val, str):
                raise TypeError(f"metadata must map str to str, got {key!r}: {val!r}")
    blob = safetensors.numpy.save(arrays, metadata=dict(metadata) if metadata else None)
    write_atomic(Path(path), [blob])


def load_tensors(
    path: Path, *, expect_sha256: str | None = None
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read and validate a safetensors file.

    Args:
        path: The file to read.
        expect_sha256: If given, the hex sha256 the whole file must have.

    Returns:
        ``(tensors, metadata)``: name -> writable, native-order array, and the
        ``__metadata__`` map (empty if absent).

    Raises:
        CheckpointError: The file is missing, unreadable, not a valid safetensors file, or its
            sha256 differs from ``expect_sha256``. The message names the file.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CheckpointError(f"{path}: is a directory, expected a .safetensors file") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc}") from exc
    if expect_sha256 is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != expect_sha256:
            raise CheckpointError(
                f"{path}: sha256 mismatch: file has {actual}, expected {expect_sha256} "
                "(corrupt or replaced file)"
            )
    try:
        loaded = safetensors.numpy.load(data)
    except (safetensors.SafetensorError, ValueError, TypeError) as exc:
        raise CheckpointError(
            f"{path}: not a valid safetensors file ({len(data)} bytes): {exc}"
        ) from None
    except KeyError as exc:  # a dtype numpy cannot represent (BF16, the FP8 codes)
        raise CheckpointError(
            f"{path}: holds a tensor of dtype {exc.args[0]}, which numpy cannot represent"
        ) from None
    tensors = {
        name: np.array(arr, dtype=arr.dtype.newbyteorder("=")) for name, arr in loaded.items()
    }
    return tensors, _metadata(path, data)


def _metadata(path: Path, data: bytes) -> dict[str, str]:
    """The ``__metadata__`` map of a file the package has already validated."""
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    meta = header.get(_METADATA_KEY) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise CheckpointError(f"{path}: __metadata__ must map str to str, got {meta!r}")
    return dict(meta)
