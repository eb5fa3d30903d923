"""Reading one split of an LMDB image cache: validated opening, batched reads, RAM residency.

The layout is described in :mod:`hogwild.data.layout`. Adam's data servers hold the image cache
in memory (section 3.1). Here each worker process opens the cache itself (:func:`open_cache`);
the pages come from the OS page cache, shared by all workers. ``ram_budget_bytes``
additionally copies records into the process's own memory, up to that many bytes (the first
records of the split), and reads those from there. Reads go through
:mod:`hogwild.data.lmdb_gather` (one numba call per batch) when liblmdb's C API is available,
else through the ``lmdb`` package.

Invariants: an :class:`ImageCache` is used only in the process that opened it -- LMDB
environments and the record addresses remembered by :mod:`hogwild.data.lmdb_gather` do not
survive fork -- so every method checks the pid, and pickling is refused (pass the path instead).
Opening checks everything that is cheap to check: the file is an LMDB environment, is not
truncated, is a hogwild cache of a known version, is complete, and its record count, labels and
first and last records agree with the manifest. Every read checks each record's header;
:meth:`ImageCache.verify` checks every pixel against its CRC and the manifest's SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import lmdb
import numpy as np

from hogwild.data import lmdb_gather
from hogwild.data.labels import check_labels
from hogwild.data.layout import (
    MAX_DBS,
    Manifest,
    acquire_environment,
    is_image_cache,
    labels_key,
    manifest_of,
    open_meta,
    read_manifest,
    record_key,
    records_db,
    release_environment,
)
from hogwild.data.record import decode, header_prefix, record_size
from hogwild.errors import DataError

__all__ = ["ImageCache", "Manifest", "is_image_cache", "open_cache", "read_manifest"]


def open_cache(
    path: str | os.PathLike,
    split: str = "train",
    *,
    ram_budget_bytes: int = 0,
    native: bool | None = None,
) -> ImageCache:
    """Open one split of an image cache for reading, in the process that will read it.

    Args:
        path: The cache directory.
        split: Which split to read (``train``, ``test``...).
        ram_budget_bytes: Copy up to this many bytes of records into this process's memory.
        native: Read through liblmdb's C API in numba (default: when available) or, if False,
            through the Python binding.

    Raises:
        DataError: Naming the file: missing, not LMDB, truncated, not a hogwild cache, a cache or
            record version this code does not read, incomplete, or inconsistent with its manifest.
    """
    return ImageCache(Path(path), split, ram_budget_bytes, native)


class ImageCache:
    """One split of an image cache, open for batched reads (see :func:`open_cache`).

    Attributes:
        path: The cache directory.
        split: The split read.
        manifest: The cache's :class:`Manifest`.
        shape: (H, W, C) of every image.
        labels: int32 ``[N]``, every record's label (read-only).
        resident: How many records (the first ones) are held in this process's memory.
    """

    def __init__(self, path: Path, split: str, ram_budget_bytes: int, native: bool | None):
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._native = None
        self.path, self.split = path, split
        self._where = str(path / "data.mdb")
        self._env, self._env_key = acquire_environment(path)
        try:
            self._open(ram_budget_bytes, lmdb_gather.AVAILABLE if native is None else native)
        except BaseException:
            self.close()
            raise

    def _open(self, ram_budget_bytes: int, native: bool) -> None:
        path, split, where = self.path, self.split, self._where
        self.manifest = manifest_of(self._env, path)
        if split not in self.manifest.splits:
            raise DataError(
                f"{path}: no split {split!r} in this cache "
                f"(it holds {sorted(self.manifest.splits)})"
            )
        self.shape = self.manifest.shape
        self.record_bytes = record_size(self.shape)
        self.pixel_bytes = self.record_bytes - 24
        count = self.manifest.splits[split].count
        try:
            self._db = self._env.open_db(records_db(split).encode(), create=False)
        except lmdb.Error:
            raise DataError(f"{where}: the records of split {split!r} are missing") from None
        self._txn = self._env.begin(db=self._db, buffers=True)
        found = self._txn.stat(self._db)["entries"]
        if found != count:
            raise DataError(
                f"{where}: split {split!r} holds {found} records, manifest says {count}"
            )
        raw_labels = self._txn.get(labels_key(split), db=open_meta(self._env, path))
        if raw_labels is None or len(raw_labels) != 4 * count:
            raise DataError(f"{where}: the labels of split {split!r} are missing or truncated")
        self.labels = np.frombuffer(bytes(raw_labels), dtype="<i4").astype(np.int32)
        self.labels.flags.writeable = False
        self.n_classes = len(self.manifest.classes)
        check_labels(self.labels, self.n_classes, f"{where}: the labels of split {split!r}")
        self._prefix = header_prefix(self.shape)
        self._addresses = np.zeros(count, dtype=np.uint64)
        self._error = np.zeros(3, dtype=np.int64)
        for index in {0, count - 1} if count else ():
            self._decode_one(index)
        if native:
            try:
                self._native = lmdb_gather.NativeEnv(path, records_db(split), MAX_DBS)
            except (OSError, RuntimeError) as exc:
                raise DataError(f"{where}: cannot open for batched reads ({exc})") from None
        self.resident = min(count, max(0, int(ram_budget_bytes)) // self.record_bytes)
        self._ram = np.empty((self.resident, self.record_bytes), dtype=np.uint8)
        for lo in range(0, self.resident, 4096):
            hi = min(lo + 4096, self.resident)
            for i in range(lo, hi):
                self._ram[i] = np.frombuffer(self._get(i), dtype=np.uint8)
        if self.resident:
            base = self._ram.ctypes.data
            self._addresses[: self.resident] = base + self.record_bytes * np.arange(
                self.resident, dtype=np.uint64
            )

    def __len__(self) -> int:
        return self._addresses.shape[0]

    @property
    def native(self) -> bool:
        """Whether reads go through liblmdb's C API (one numba call per batch)."""
        return self._native is not None

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; label ``i`` is ``classes[i]``."""
        return self.manifest.classes

    def __reduce__(self):
        raise TypeError(
            "an ImageCache cannot be sent to another process; send its path and call "
            "open_cache() inside that process"
        )

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise DataError(
                f"{self.path}: this cache was opened in process {self._pid} and cannot be used in "
                f"process {os.getpid()}: LMDB environments do not survive fork; call open_cache() "
                "inside the process that reads it"
            )
        if self._env is None:
            raise DataError(f"{self.path}: the cache is closed")

    def _get(self, index: int) -> memoryview:
        raw = self._txn.get(record_key(index))
        if raw is None:
            raise DataError(f"{self._where}: record {index} of split {self.split!r} is missing")
        return raw

    def _decode_one(self, index: int, verify: bool = False) -> tuple[np.ndarray, int]:
        where = f"{self._where}: record {index} of split {self.split!r}"
        return decode(self._get(index), shape=self.shape, verify=verify, where=where)

    def read(
        self,
        indices: np.ndarray | list[int],
        out: np.ndarray | None = None,
        labels_out: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Read records ``indices`` into preallocated arrays.

        Args:
            indices: Record indices, any order, repeats allowed.
            out: uint8, C-contiguous, at least ``n`` rows of H*W*C bytes each (``[n, H, W, C]``,
                ``[n, H, W]`` for grey, or ``[n, H*W*C]``); the first ``n`` rows are filled. A new
                ``[n, H, W, C]`` array when None.
            labels_out: Integer array of at least ``n`` entries; a new int32 array when None.

        Returns:
            ``(out[:n], labels_out[:n])``.

        Raises:
            IndexError: An index is outside ``0..len(self)-1``.
            DataError: A record is missing or is not a version-1 record of the cache's shape
                (naming the file and the record), or the cache is used after fork or closed.
        """
        self._check_process()
        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        n = idx.shape[0]
        if out is None:
            out = np.empty((n, *self.shape), dtype=np.uint8)
        if labels_out is None:
            labels_out = np.empty(n, dtype=np.int32)
        if (
            out.dtype != np.uint8
            or not out.flags.c_contiguous
            or out.shape[0] < n
            or out[:1].size not in (0, self.pixel_bytes)
        ):
            raise ValueError(
                f"out must be a C-contiguous uint8 array of at least {n} rows of "
                f"{self.pixel_bytes} bytes (shape {list(self.shape)}), got {out.dtype} "
                f"{list(out.shape)}"
            )
        if labels_out.shape[0] < n:
            raise ValueError(f"labels_out holds {labels_out.shape[0]} entries, {n} needed")
        rows = out[:n].reshape(n, self.pixel_bytes)
        direct = labels_out.dtype == np.int32 and labels_out.flags.c_contiguous
        labels = labels_out[:n] if direct else np.empty(n, dtype=np.int32)
        with self._lock:
            if self._native is not None:
                self._read_native(idx, rows, labels)
            else:
                self._read_python(idx, rows, labels)
            check_labels(labels, self.n_classes, f"{self._where}: split {self.split!r}", idx)
        if not direct:
            labels_out[:n] = labels
        return out[:n], labels_out[:n]

    def _read_native(self, idx: np.ndarray, rows: np.ndarray, labels: np.ndarray) -> None:
        status = lmdb_gather.gather_records(
            self._native.txn,
            self._native.dbi,
            self._addresses,
            idx,
            rows,
            labels,
            self._prefix,
            self.record_bytes,
            self._error,
        )
        if status != lmdb_gather.STATUS_OK:
            self._raise_read_error(status, int(self._error[1]), int(self._error[2]))

    def _read_python(self, idx: np.ndarray, rows: np.ndarray, labels: np.ndarray) -> None:
        count, prefix = len(self), self._prefix.tobytes()
        for j in range(idx.shape[0]):
            index = int(idx[j])
            if not 0 <= index < count:
                self._raise_read_error(lmdb_gather.STATUS_OUT_OF_RANGE, index, 0)
            if index < self.resident:
                raw = self._ram[index].data
            else:
                raw = self._txn.get(record_key(index))
                if raw is None:
                    self._raise_read_error(lmdb_gather.STATUS_NOT_FOUND, index, 0)
                if len(raw) != self.record_bytes:
                    self._raise_read_error(lmdb_gather.STATUS_BAD_SIZE, index, len(raw))
            if raw[:16] != prefix:
                self._raise_read_error(lmdb_gather.STATUS_BAD_HEADER, index, 0)
            labels[j] = int.from_bytes(raw[16:20], "little", signed=True)
            rows[j] = np.frombuffer(raw, dtype=np.uint8, count=self.pixel_bytes, offset=24)

    def _raise_read_error(self, status: int, index: int, detail: int) -> None:
        where = f"{self._where}: record {index} of split {self.split!r}"
        if status == lmdb_gather.STATUS_OUT_OF_RANGE:
            raise IndexError(f"record index {index} outside 0..{len(self) - 1} of {self.path}")
        if status == lmdb_gather.STATUS_NOT_FOUND:
            raise DataError(f"{where} is missing")
        if status == lmdb_gather.STATUS_BAD_SIZE:
            raise DataError(f"{where}: {detail} bytes, expected {self.record_bytes}")
        if status == lmdb_gather.STATUS_BAD_HEADER:
            self._decode_one(index)  # raises the precise message (magic, version, shape)
            raise DataError(f"{where}: unexpected record header")
        raise DataError(f"{where}: LMDB error {lmdb_gather.NativeEnv.strerror(detail)}")

    def verify(self) -> None:
        """Check every record's CRC and the split's SHA-256 against the manifest.

        Raises:
            DataError: Naming the first corrupt record, or the checksum mismatch.
        """
        self._check_process()
        digest = hashlib.sha256()
        with self._lock:
            for index in range(len(self)):
                self._decode_one(index, verify=True)
                digest.update(self._get(index))
        expected = self.manifest.splits[self.split].checksum
        if "sha256:" + digest.hexdigest() != expected:
            raise DataError(
                f"{self._where}: split {self.split!r} checksum sha256:{digest.hexdigest()} "
                f"does not match the manifest's {expected}"
            )

    def close(self) -> None:
        """Release the environment (a no-op in a process other than the one that opened it)."""
        if os.getpid() != self._pid:
            return
        if self._native is not None:
            self._native.close()
            self._native = None
        if getattr(self, "_txn", None) is not None:
            self._txn.abort()
            self._txn = None
        if self._env is not None:
            self._env = None
            release_environment(self._env_key)
        self._addresses = np.zeros(0, dtype=np.uint64)

    def __enter__(self) -> ImageCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
