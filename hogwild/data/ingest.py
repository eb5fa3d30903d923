"""Building an LMDB image cache from a source, resumably: ``hogwild data ingest SRC --out CACHE``.

The ingest walks each split of a :class:`~hogwild.data.sources.IngestSource` in its fixed order and
writes records (:mod:`hogwild.data.record`) in chunks. Image files are decoded by a pool of
spawned processes (:func:`~hogwild.data.sources.decode_images`) while the parent writes the
previous chunk. A file Pillow cannot read is skipped: counted, listed in the cache's ``skipped``
meta entry and in ``CACHE/skipped.txt``, and given no record (record indices stay gapless).

Invariant (crash safety): each chunk's records and the resume point (``progress``: split, source
position, records written, skipped files) are committed in *one* LMDB write transaction, so
whatever kills the ingest -- Ctrl-C, SIGKILL, power loss -- the cache holds whole chunks and a
progress entry that describes exactly them. Running the same command again continues at that
point: no record is written twice and none is half-written. A split is finished by storing its
label array and SHA-256; the cache is finished by storing the manifest, last. The progress entry
names the source (:meth:`~hogwild.data.sources.IngestSource.fingerprint`); a different source is
refused rather than mixed in.

The LMDB map starts at the expected size and doubles whenever a transaction runs out of room
(``MapFullError``): the transaction is aborted and the chunk written again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import lmdb
import numpy as np

from hogwild.data.labels import check_labels
from hogwild.data.layout import (
    CACHE_FORMAT,
    CACHE_VERSION,
    MANIFEST_FILE,
    META_DB,
    Manifest,
    SplitInfo,
    check_format,
    labels_key,
    open_environment,
    open_meta,
    record_key,
    records_db,
)
from hogwild.data.pool import spawn_pool
from hogwild.data.record import RECORD_VERSION, encode, record_size
from hogwild.data.sources import (
    IMAGE_FORMATS,
    IngestSource,
    IngestSplit,
    decode_images,
    detect_source,
)
from hogwild.errors import DataError
from hogwild.outputs import writable_directory
from hogwild.progress import progress_bar

DEFAULT_CHUNK = 1024
"""Records per write transaction."""

SKIPPED_FILE = "skipped.txt"
_DECODE_TASK = 32  # files per task sent to a decoding process


@dataclass
class IngestReport:
    """What an ingest did.

    Attributes:
        path: The cache directory.
        manifest: The finished cache's manifest.
        written: Records written by this run, per split.
        resumed: Records already present when this run started, per split.
        skipped: (split, file, reason) of every unreadable image, this run and earlier ones.
        already_complete: The cache was complete before this run; nothing was written.
    """

    path: Path
    manifest: Manifest
    written: dict[str, int] = field(default_factory=dict)
    resumed: dict[str, int] = field(default_factory=dict)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)
    already_complete: bool = False


def ingest(
    src: str | os.PathLike,
    out: str | os.PathLike,
    *,
    size: int = 256,
    channels: int = 3,
    workers: int | None = None,
    chunk: int = DEFAULT_CHUNK,
    progress: bool = True,
    initial_map_size: int | None = None,
    formats: tuple[str, ...] | str = IMAGE_FORMATS,
    follow_symlinks: bool = False,
) -> IngestReport:
    """Build (or finish) the image cache ``out`` from ``src``.

    Args:
        src: idx files, CIFAR-10 batches or image folders (see :mod:`hogwild.data.sources`).
        out: The cache directory, created if missing.
        size: Side of the square images a folder source is resized and cropped to.
        channels: 3 (RGB) or 1 (grey) for folder sources.
        workers: Decoding processes for folder sources (default: usable cores; 0 decodes in
            this process).
        chunk: Records per transaction (the granularity of resuming).
        progress: Draw a progress bar on stderr.
        initial_map_size: The LMDB map size to start from (default: the expected size).
        formats, follow_symlinks: Folder sources: the image formats decoded and whether links
            out of ``src`` are taken (:func:`~hogwild.data.sources.detect_source`).

    Returns:
        An :class:`IngestReport`.

    Raises:
        DataError: The source is unreadable or unrecognised; ``out`` exists and is not a cache,
            is a cache of a different source or version, or is truncated.
    """
    source = detect_source(
        src, size=size, channels=channels, formats=formats, follow_symlinks=follow_symlinks
    )
    return _run(source, Path(out), workers, chunk, progress, initial_map_size)


def _run(
    source: IngestSource, out: Path, workers, chunk, progress, initial_map_size
) -> IngestReport:
    for split in source.splits:  # before anything is written: a label is a class index
        if split.labels is not None:
            where = f"{source.path}: split {split.name!r} ({len(source.classes)} classes)"
            check_labels(np.asarray(split.labels), len(source.classes), where)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / "data.mdb").exists():
        raise DataError(
            f"{out}: exists, is not empty and is not an image cache; choose another --out"
        )
    writable_directory(out, "image cache (--out)")
    expected = sum(len(s) for s in source.splits) * record_size(source.shape)
    map_size = initial_map_size or max(1 << 20, int(expected * 1.2) + (8 << 20))
    if (out / "data.mdb").exists():
        map_size = max(map_size, (out / "data.mdb").stat().st_size)
    env = open_environment(out, write=True, map_size=map_size)
    try:
        return _Ingest(source, out, env, workers, max(1, chunk), progress).run()
    finally:
        env.close()


def ingest_arrays(
    out: str | os.PathLike,
    splits: dict[str, tuple[np.ndarray, np.ndarray]],
    *,
    classes: tuple[str, ...] | None = None,
    chunk: int = DEFAULT_CHUNK,
    progress: bool = False,
) -> IngestReport:
    """Build the cache ``out`` from in-memory arrays (benchmarks, tests, generated data).

    Args:
        out: The cache directory.
        splits: Split name -> (uint8 images ``[N, H, W]`` or ``[N, H, W, C]``, int labels ``[N]``),
            every split of the same image shape.
        classes: Class names (default: "0".."max label").
        chunk: Records per transaction.
        progress: Draw a progress bar.
    """
    parts = []
    for name, (images, labels) in splits.items():
        images = images if images.ndim == 4 else images[:, :, :, None]
        raw = np.asarray(labels)
        if raw.size and raw.max() >= 2**31:  # would wrap in int32 to a label in range
            check_labels(raw, 2**31 - 1, f"{out}: split {name!r}")
        parts.append(IngestSplit(name, images, raw.astype(np.int32)))
    shape = tuple(int(v) for v in parts[0].images.shape[1:])
    if any(p.images.shape[1:] != shape for p in parts):
        raise ValueError("every split must have the same image shape")
    top = max((int(p.labels.max()) for p in parts if len(p)), default=0)
    top = max(top, 0)  # a negative label is refused by name below, not as "no classes"
    classes = classes or tuple(str(i) for i in range(top + 1))
    source = IngestSource("arrays", Path(out), tuple(classes), shape, parts)
    return _run(source, Path(out), 0, chunk, progress, None)


class _Ingest:
    def __init__(self, source: IngestSource, out: Path, env, workers, chunk, progress) -> None:
        self.source, self.out, self.env = source, out, env
        self.workers = len(os.sched_getaffinity(0)) if workers is None else max(0, workers)
        self.chunk, self.progress = chunk, progress
        self.where = str(out / "data.mdb")
        self.fingerprint = source.fingerprint()
        self.meta = None
        self.state: dict = {}
        self.report: IngestReport | None = None

    def run(self) -> IngestReport:
        self._start()
        if self.report is not None:
            return self.report
        written, resumed = {}, {}
        pool = None
        try:
            for split in self.source.splits:
                if split.name in self.state["done"]:
                    resumed[split.name] = self.state["done"][split.name]["count"]
                    written[split.name] = 0
                    continue
                if split.files and self.workers and pool is None:
                    pool = spawn_pool(self.workers)
                before = self.state["count"] if self.state["split"] == split.name else 0
                resumed[split.name] = before
                written[split.name] = self._ingest_split(split, pool) - before
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        manifest = self._finish()
        return IngestReport(self.out, manifest, written, resumed, self._all_skipped())

    def _start(self) -> None:
        """Check ``out`` is empty, or a cache of this source; load the resume point."""
        with self.env.begin() as txn:
            meta_exists = txn.get(META_DB.encode()) is not None
        if not meta_exists and self.env.stat()["entries"] > 0:
            raise DataError(
                f"{self.where}: an LMDB environment that is not a hogwild image cache; "
                "choose another --out"
            )
        self.meta = open_meta(self.env, self.out, create=True)
        with self.env.begin(write=True, db=self.meta) as txn:
            fmt = txn.get(b"format")
            if fmt is None:
                doc = {"format": CACHE_FORMAT, "version": CACHE_VERSION}
                txn.put(b"format", json.dumps({**doc, "record_version": RECORD_VERSION}).encode())
            else:
                check_format(fmt, self.where)
            manifest = txn.get(b"manifest")
            raw_state = txn.get(b"progress")
        if manifest is not None:
            manifest = Manifest.from_json(manifest, self.where)
            if manifest.source.get("fingerprint") != self.fingerprint:
                raise DataError(
                    f"{self.out}: already holds a complete cache of another source "
                    f"({manifest.source.get('fingerprint', {}).get('path')}); choose another --out"
                )
            self.report = IngestReport(
                self.out, manifest, skipped=self._all_skipped(), already_complete=True
            )
            return
        if raw_state is None:
            self.state = {
                "fingerprint": self.fingerprint,
                "split": None,
                "position": 0,
                "count": 0,
                "done": {},
            }
            return
        self.state = json.loads(raw_state)
        if self.state.get("fingerprint") != self.fingerprint:
            found = self.state.get("fingerprint", {})
            raise DataError(
                f"{self.out}: holds an interrupted ingest of another source ({found.get('kind')} "
                f"at {found.get('path')}, {found.get('splits')}); rerun with that source or "
                "choose another --out"
            )

    def _ingest_split(self, split: IngestSplit, pool) -> int:
        name = split.name
        db = self.env.open_db(records_db(name).encode(), create=True)
        if self.state["split"] != name:
            self.state.update(split=name, position=0, count=0)
        position, count = self.state["position"], self.state["count"]
        with self.env.begin(db=db) as txn:
            present = txn.stat(db)["entries"]
        if present != count:
            raise DataError(
                f"{self.where}: split {name!r} holds {present} records but its resume point says "
                f"{count}; the cache is inconsistent: remove it and ingest again"
            )
        if position and self.progress:
            print(
                f"ingest {name}: resuming at item {position:,} of {len(split):,}", file=sys.stderr
            )
        bar = progress_bar(
            len(split), f"ingest {name}", "img", initial=position, enabled=self.progress
        )
        skipped = self._skipped(name)
        for end, images, labels, errors in self._chunks(split, position, pool):
            records = []
            for i in range(len(images)):
                if errors[i] is None:
                    records.append(encode(images[i], int(labels[i])))
                else:
                    file = split.files[end - len(images) + i]
                    skipped.append([str(file.relative_to(self.source.path)), errors[i]])
            self.state.update(position=end, count=count + len(records))
            self._commit(db, count, records, name, skipped)
            count += len(records)
            bar.update(end - bar.n)
            if skipped:
                bar.set_postfix_str(f"{len(skipped)} skipped", refresh=False)
        bar.close()
        self._finish_split(db, name, count, len(skipped))
        return count

    def _chunks(self, split: IngestSplit, start: int, pool) -> Iterator[tuple]:
        """(end position, images, labels, errors) of each chunk from ``start`` on, in order."""
        total = len(split)
        bounds = [(lo, min(lo + self.chunk, total)) for lo in range(start, total, self.chunk)]
        if split.images is not None:
            for lo, hi in bounds:
                yield hi, split.images[lo:hi], split.labels[lo:hi], [None] * (hi - lo)
            return
        size, _, channels = self.source.shape
        formats = self.source.formats or IMAGE_FORMATS

        def submit(lo, hi):
            files = [str(f) for f in split.files[lo:hi]]
            if pool is None:
                return [decode_images(files, size, channels, formats)]
            return [
                pool.submit(decode_images, files[i : i + _DECODE_TASK], size, channels, formats)
                for i in range(0, len(files), _DECODE_TASK)
            ]

        pending = [submit(*b) for b in bounds[:2]]  # decode one chunk ahead of the writer
        for k, (lo, hi) in enumerate(bounds):
            parts = [p if pool is None else _result(p, split.files[lo]) for p in pending.pop(0)]
            if k + 2 < len(bounds):
                pending.append(submit(*bounds[k + 2]))
            images = np.concatenate([p[0] for p in parts])
            errors = [e for p in parts for e in p[1]]
            yield hi, images, split.labels[lo:hi], errors

    def _commit(self, db, first: int, records: list[bytes], split: str, skipped: list) -> None:
        """Write records ``first..`` and the resume point in one transaction, growing the map."""
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    cursor = txn.cursor(db=db)
                    for i, value in enumerate(records):
                        cursor.put(record_key(first + i), value, append=True)
                    txn.put(b"progress", json.dumps(self.state).encode(), db=self.meta)
                    txn.put(f"skipped:{split}".encode(), json.dumps(skipped).encode(), db=self.meta)
                return
            except lmdb.MapFullError:
                self._grow(sum(len(r) for r in records))

    def _grow(self, needed: int) -> None:
        size = self.env.info()["map_size"]
        self.env.set_mapsize(max(2 * size, size + 2 * needed))

    def _finish_split(self, db, name: str, count: int, skipped: int) -> None:
        digest = hashlib.sha256()
        labels = np.empty(count, dtype="<i4")
        with self.env.begin(db=db, buffers=True) as txn:
            for i, (key, value) in enumerate(txn.cursor()):
                if bytes(key) != record_key(i):
                    raise DataError(f"{self.where}: split {name!r} has a gap at record {i}")
                digest.update(value)
                labels[i] = int.from_bytes(value[16:20], "little", signed=True)
        info = SplitInfo(count, "sha256:" + digest.hexdigest(), skipped)
        self.state["done"][name] = vars(info)
        self.state.update(split=None, position=0, count=0)
        while True:
            try:
                with self.env.begin(write=True, db=self.meta) as txn:
                    txn.put(labels_key(name), labels.tobytes())
                    txn.put(b"progress", json.dumps(self.state).encode())
                return
            except lmdb.MapFullError:
                self._grow(labels.nbytes)

    def _finish(self) -> Manifest:
        manifest = Manifest(
            shape=self.source.shape,
            classes=self.source.classes,
            splits={s.name: SplitInfo(**self.state["done"][s.name]) for s in self.source.splits},
            source={"kind": self.source.kind, "fingerprint": self.fingerprint},
            created=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        text = manifest.to_json()
        while True:
            try:
                with self.env.begin(write=True, db=self.meta) as txn:
                    txn.put(b"manifest", text.encode())
                    txn.delete(b"progress")
                break
            except lmdb.MapFullError:
                self._grow(len(text))
        self.env.sync(True)
        _write_atomically(self.out / MANIFEST_FILE, text + "\n")
        skipped = self._all_skipped()
        if skipped:
            lines = [f"{split}\t{file}\t{reason}" for split, file, reason in skipped]
            _write_atomically(self.out / SKIPPED_FILE, "\n".join(lines) + "\n")
        return manifest

    def _skipped(self, split: str) -> list:
        with self.env.begin(db=self.meta) as txn:
            raw = txn.get(f"skipped:{split}".encode())
        return json.loads(raw) if raw else []

    def _all_skipped(self) -> list[tuple[str, str, str]]:
        return [(s.name, f, r) for s in self.source.splits for f, r in self._skipped(s.name)]


def _result(future, first_file: Path):
    try:
        return future.result()
    except BrokenProcessPool:
        raise DataError(
            f"a decoding process died (killed, or out of memory) while decoding images near "
            f"{first_file}; run the same ingest again to resume"
        ) from None


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
