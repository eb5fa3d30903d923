"""The on-disk layout of hogwild's LMDB image cache, its manifest, and opening it safely.

A cache is one LMDB environment (a directory holding ``data.mdb``) written by
:mod:`hogwild.data.ingest`, with these named databases:

- ``meta``: ``format`` (JSON: format name, cache version, record version), ``manifest`` (JSON,
  written last: its presence marks the cache complete), ``labels:<split>`` (int32 array),
  ``progress`` (the ingest's resume point) and ``skipped:<split>`` (images that could not be read).
- ``records:<split>`` (``train``, ``test``...): key = the record index as 8 big-endian bytes,
  value = one :mod:`hogwild.data.record` record. Indices run 0..count-1 without gaps.

Every record of a cache has the same shape, the manifest's ``shape`` (H, W, C).
``manifest.json`` beside ``data.mdb`` is a human-readable copy of the manifest.

Invariants: :func:`open_environment` never hands out an environment whose file is shorter than
its own meta page says (reading a truncated memory map would crash the process with SIGBUS),
and names the file in every error. LMDB allows one open of an environment per process, so
readers share one environment per file and process (:func:`acquire_environment`).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

from hogwild.data.record import RECORD_VERSION, record_size
from hogwild.errors import DataError

CACHE_FORMAT = "hogwild-image-cache"
"""The ``format`` name in a cache's meta database."""

CACHE_VERSION = 1
"""The cache layout version this code writes and reads."""

MAX_DBS = 16
"""Named databases an environment may hold (meta plus the splits)."""

META_DB = "meta"
MANIFEST_FILE = "manifest.json"


def records_db(split: str) -> str:
    """The name of the database holding ``split``'s records."""
    return f"records:{split}"


def labels_key(split: str) -> bytes:
    """The meta key of ``split``'s label array."""
    return f"labels:{split}".encode()


def record_key(index: int) -> bytes:
    """The key of record ``index``: 8 big-endian bytes, so LMDB's order is the index order."""
    return index.to_bytes(8, "big")


def is_image_cache(path: str | os.PathLike) -> bool:
    """Whether ``path`` looks like an LMDB image cache (a directory with ``data.mdb``), as opposed
    to a directory of idx files; :func:`hogwild.data.cache.open_cache` still validates it. Here,
    not beside the reader: the processes that only ask (a data server of idx files, a driver)
    load neither the reader's numba kernel nor numba."""
    return (Path(path) / "data.mdb").is_file()


@dataclass(frozen=True)
class SplitInfo:
    """One split of a cache: how many records, their SHA-256, how many images were skipped."""

    count: int
    checksum: str
    skipped: int = 0


@dataclass(frozen=True)
class Manifest:
    """What a complete cache holds.

    Attributes:
        shape: (H, W, C) of every image.
        classes: Class names; label ``i`` is ``classes[i]``.
        splits: Split name -> :class:`SplitInfo`.
        source: How the cache was made (source kind, path, options).
        version: Cache layout version.
        record_version: Record format version.
        created: When the ingest finished (ISO 8601, UTC).
    """

    shape: tuple[int, int, int]
    classes: tuple[str, ...]
    splits: dict[str, SplitInfo]
    source: dict = field(default_factory=dict)
    version: int = CACHE_VERSION
    record_version: int = RECORD_VERSION
    created: str = ""

    @property
    def count(self) -> int:
        """Records over all splits."""
        return sum(info.count for info in self.splits.values())

    def to_json(self) -> str:
        """The manifest as a JSON document."""
        return json.dumps(
            {
                "format": CACHE_FORMAT,
                "version": self.version,
                "record_version": self.record_version,
                "count": self.count,
                "shape": list(self.shape),
                "record_bytes": record_size(self.shape),
                "num_classes": len(self.classes),
                "classes": list(self.classes),
                "splits": {name: vars(info) for name, info in self.splits.items()},
                "source": self.source,
                "created": self.created,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Manifest:
        """Parse a manifest, raising :class:`DataError` naming ``where`` if it is malformed."""
        try:
            doc = json.loads(text)
            shape = tuple(int(v) for v in doc["shape"])
            splits = {
                str(name): SplitInfo(int(s["count"]), str(s["checksum"]), int(s.get("skipped", 0)))
                for name, s in doc["splits"].items()
            }
            manifest = cls(
                shape=shape,
                classes=tuple(str(c) for c in doc["classes"]),
                splits=splits,
                source=dict(doc.get("source", {})),
                version=int(doc["version"]),
                record_version=int(doc["record_version"]),
                created=str(doc.get("created", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataError(f"{where}: malformed cache manifest ({exc!r})") from None
        if len(shape) != 3 or min(shape) < 1 or shape[2] not in (1, 3):
            raise DataError(f"{where}: manifest shape {list(shape)} is not [H, W, 1|3]")
        return manifest


def check_format(raw: bytes | None, where: str) -> None:
    """Check a cache's ``format`` meta entry; ``raw`` None means the entry is missing."""
    if raw is None:
        raise DataError(f"{where}: an LMDB environment but not a hogwild image cache (no format)")
    try:
        doc = json.loads(raw)
        name, version, rec = doc["format"], int(doc["version"]), int(doc["record_version"])
    except (ValueError, KeyError, TypeError):
        raise DataError(f"{where}: malformed cache format entry {bytes(raw)[:80]!r}") from None
    if name != CACHE_FORMAT:
        raise DataError(f"{where}: not a hogwild image cache (format {name!r})")
    if version != CACHE_VERSION or rec != RECORD_VERSION:
        raise DataError(
            f"{where}: cache version {version} with record version {rec}; this hogwild reads "
            f"cache version {CACHE_VERSION}, record version {RECORD_VERSION}: rebuild it with "
            "`hogwild data ingest`"
        )


def open_environment(path: str | os.PathLike, *, write: bool = False, map_size: int = 0):
    """Open a cache directory's LMDB environment, refusing missing, foreign or truncated files.

    Args:
        path: The cache directory.
        write: Open for writing (the ingest); otherwise read-only without the lock file.
        map_size: The map size for writing (bytes).

    Returns:
        The ``lmdb.Environment``.

    Raises:
        DataError: Naming the file: missing, not an LMDB environment, or shorter than its meta page
            says (truncated).
    """
    path = Path(path)
    data_file = path / "data.mdb"
    if not write:
        if not path.is_dir():
            raise DataError(f"{path}: no such cache directory (expected an LMDB image cache)")
        if not data_file.is_file():
            raise DataError(f"{data_file}: missing: {path} is not an LMDB image cache")
    try:
        if write:
            env = lmdb.open(str(path), map_size=map_size, max_dbs=MAX_DBS, readahead=False)
        else:
            env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=MAX_DBS, readahead=False)
    except lmdb.Error as exc:
        raise DataError(f"{data_file}: not a readable LMDB environment ({exc})") from None
    try:
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        size = data_file.stat().st_size
    except (lmdb.Error, OSError) as exc:
        env.close()
        raise DataError(f"{data_file}: cannot inspect the LMDB environment ({exc})") from None
    if size < needed:
        env.close()
        raise DataError(
            f"{data_file}: truncated: its LMDB meta page needs {needed} bytes, the file has {size}"
        )
    return env


_SHARED: dict[tuple[int, int, int], list] = {}
_SHARED_LOCK = threading.Lock()


def acquire_environment(path: Path) -> tuple[object, tuple[int, int, int]]:
    """This process's read-only environment of the cache at ``path``, shared and counted.

    LMDB (and the ``lmdb`` package, which enforces it) allows one open of an environment per
    process, so the splits of a cache opened in one process share it.

    Returns:
        (the environment, the key to pass to :func:`release_environment`).

    Raises:
        DataError: As :func:`open_environment`.
    """
    try:
        stat = (path / "data.mdb").stat()
    except OSError:
        open_environment(path)  # raises the right message for a missing cache
        raise
    key = (os.getpid(), stat.st_dev, stat.st_ino)
    with _SHARED_LOCK:
        entry = _SHARED.get(key)
        if entry is None:
            entry = _SHARED[key] = [open_environment(path), 0]
        entry[1] += 1
        return entry[0], key


def release_environment(key: tuple[int, int, int]) -> None:
    """Drop one reference taken by :func:`acquire_environment`; close on the last one."""
    with _SHARED_LOCK:
        entry = _SHARED.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _SHARED[key]
            if key[0] == os.getpid():
                entry[0].close()


def open_meta(env, path: Path, *, create: bool = False):
    """The ``meta`` database of ``env``; DataError naming ``path`` if it is not a hogwild cache."""
    try:
        return env.open_db(META_DB.encode(), create=create)
    except (lmdb.NotFoundError, lmdb.IncompatibleError, lmdb.ReadonlyError):
        raise DataError(
            f"{path / 'data.mdb'}: an LMDB environment but not a hogwild image cache "
            "(no 'meta' database); build one with `hogwild data ingest`"
        ) from None


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Read a complete cache's manifest.

    Raises:
        DataError: As :func:`open_cache`, for the environment, format and completeness checks.
    """
    path = Path(path)
    env, key = acquire_environment(path)
    try:
        return manifest_of(env, path)
    finally:
        release_environment(key)


def manifest_of(env, path: Path) -> Manifest:
    where = str(path / "data.mdb")
    meta = open_meta(env, path)
    with env.begin(db=meta) as txn:
        check_format(txn.get(b"format"), where)
        raw = txn.get(b"manifest")
    if raw is None:
        raise DataError(
            f"{path}: incomplete image cache (its ingest was interrupted); rerun "
            "`hogwild data ingest` with the same source and --out to finish it"
        )
    return Manifest.from_json(raw, where)
