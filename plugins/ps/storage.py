"""Delayed persistence (Adam 3.3.2): the server's memory is a write-back cache of an LMDB store.

Updates change shards in memory only. A background :class:`Flusher` takes a round of snapshots
every ``ps.flush_s`` seconds (the shards changed since the last round, each copied between two
updates by its own update thread: values, rule state and the version they correspond to) and
writes the whole round in ONE LMDB write transaction: however many updates a shard took in the
meantime, it costs one write, and a round is on disk entirely or not at all. A server restarted
on the same store recovers every shard at the version of its last flush; what came after is the
loss window, reported in the status (seconds and updates since the last flush).

A round that fails (the disk full, the store's file gone bad) changes nothing on disk: the store
keeps its last round whole, and LMDB writes again once there is room. The server serves on (its
memory holds every acknowledged update) while the failure is a recorded state: the error, the
failures counted and how long flushes have failed, in the status and its gauges
(``flush_failures``, ``flush_failing_s``), said on stderr when the streak begins and ends, and
the loss window grows meanwhile. What relies on a flush stops: a shard's flushed version is not
advanced, the next round writes every shard, and a final flush that fails makes ``hogwild ps
serve`` exit 1 saying so.

Store layout (one LMDB environment, ``DIR/data.mdb``):

* ``b"header"``: JSON ``{"kind": "hogwild-ps-store", "format": 1, "job", "n_params",
  "shard_floats", "rule"}``: a store of another job, model size, sharding or rule is refused;
* ``b"shard/%08d"``: a record header (:data:`RECORD`: magic ``b"HGSH"``, shard, version, value
  count, state count, CRC-32 of the arrays), then the float32 values and the rule state;
* ``b"bucket/%08d"`` (replicated servers): the newest epoch of that bucket's etcd record this
  store's server has seen, with that record's primary and lease (:data:`MARK`: magic
  ``b"HGBK"``, the mark's format, bucket, epoch, primary, lease, CRC-32 of what precedes it),
  written in one transaction per change, before the server acts on that record: a process
  started on the store later knows the bucket had a record, and never starts it afresh over
  etcd's lost state (:mod:`~hogwild_plugins.ps.replication.marks`). A store without them
  (written by a server without copies, or by an earlier hogwild) remembers no bucket.

A record whose header, length or CRC does not check out (a bucket's mark of a format this
hogwild does not know, or of a bucket the job does not have, included), or an environment LMDB
cannot open, is a :class:`StoreError` naming the file: the server does not start on a corrupt
store.
"""

from __future__ import annotations

import json
import struct
import sys
import threading
import time
import zlib
from pathlib import Path

import lmdb
import numpy as np

from hogwild.errors import HogwildError

__all__ = ["MARK", "RECORD", "Flusher", "ShardStore", "StoreError"]

KIND, FORMAT = "hogwild-ps-store", 1
RECORD = struct.Struct("<4sIQQQI")
RECORD_MAGIC = b"HGSH"
HEADER_KEY = b"header"
MARK = struct.Struct("<4sHIQIQ")  # then the CRC-32 of these 30 bytes ("<I")
MARK_MAGIC, MARK_FORMAT, MARK_PREFIX = b"HGBK", 1, b"bucket/"
MAX_EPOCH = 2**32  # an epoch travels in a 32-bit header field
MIN_MAP_BYTES = 1 << 30


class StoreError(HogwildError):
    """A parameter store that cannot be used: corrupt, foreign, or unreadable."""


def shard_key(shard: int) -> bytes:
    return b"shard/%08d" % shard


def mark_key(bucket: int) -> bytes:
    return MARK_PREFIX + b"%08d" % bucket


class ShardStore:
    """One server's LMDB store.

    Args:
        directory: The store's directory (created if missing).
        job, n_params, shard_floats, rule: What the store must belong to.

    Raises:
        StoreError: LMDB cannot open it, or it belongs to another job, model, sharding or rule.
    """

    def __init__(
        self, directory: str | Path, *, job: str, n_params: int, shard_floats: int, rule: str
    ) -> None:
        self.directory = Path(directory)
        self.file = self.directory / "data.mdb"
        self.expected = {
            "kind": KIND,
            "format": FORMAT,
            "job": job,
            "n_params": n_params,
            "shard_floats": shard_floats,
            "rule": rule,
        }
        map_size = max(MIN_MAP_BYTES, 4 * 2 * 4 * n_params)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.env = lmdb.open(
                str(self.directory), map_size=map_size, subdir=True, max_dbs=0, readahead=False
            )
        except (lmdb.Error, OSError) as exc:
            raise StoreError(f"{self.file}: cannot open the parameter store: {exc}") from exc
        try:
            self._check_header()
        except BaseException:
            self.env.close()
            raise

    def _check_header(self) -> None:
        try:
            with self.env.begin(write=True) as txn:
                raw = txn.get(HEADER_KEY)
                if raw is None:
                    if txn.stat()["entries"]:
                        raise StoreError(
                            f"{self.file}: an LMDB database without a hogwild parameter-store "
                            "header; not a store of this program"
                        )
                    txn.put(HEADER_KEY, json.dumps(self.expected).encode())
                    return
        except lmdb.Error as exc:
            raise StoreError(f"{self.file}: unreadable parameter store: {exc}") from exc
        try:
            found = json.loads(bytes(raw))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreError(f"{self.file}: corrupt store header ({exc})") from exc
        if not isinstance(found, dict) or found.get("kind") != KIND:
            raise StoreError(f"{self.file}: not a hogwild parameter store")
        wrong = {k: found.get(k) for k, v in self.expected.items() if found.get(k) != v}
        if wrong:
            theirs = ", ".join(f"{k}={v!r}" for k, v in wrong.items())
            ours = ", ".join(f"{k}={self.expected[k]!r}" for k in wrong)
            raise StoreError(
                f"{self.file}: this store belongs to another job or model ({theirs}); this "
                f"server has {ours}. Use another --store directory, or the job it was made for"
            )

    def load(self, shards: list[int], shard_sizes: dict[int, int], state_arrays: int) -> dict:
        """``{shard: (version, values, state)}`` of the listed shards the store holds.

        Raises:
            StoreError: A record that is corrupt (magic, sizes or CRC), naming the file and key.
        """
        out = {}
        try:
            with self.env.begin() as txn:
                for shard in shards:
                    raw = txn.get(shard_key(shard))
                    if raw is not None:
                        n = shard_sizes[shard]
                        out[shard] = self._decode(shard, bytes(raw), n, n * state_arrays)
        except lmdb.Error as exc:
            raise StoreError(f"{self.file}: unreadable parameter store: {exc}") from exc
        return out

    def _decode(self, shard: int, raw: bytes, n: int, n_state: int):
        where = f"{self.file}: record {shard_key(shard).decode()}"
        if len(raw) < RECORD.size:
            raise StoreError(f"{where}: {len(raw)} bytes, shorter than its header")
        magic, index, version, n_values, n_st, crc = RECORD.unpack_from(raw)
        if magic != RECORD_MAGIC or index != shard:
            raise StoreError(f"{where}: corrupt record header (magic {magic!r}, shard {index})")
        if n_values != n or n_st != n_state or len(raw) != RECORD.size + 4 * (n + n_state):
            raise StoreError(
                f"{where}: {n_values} values and {n_st} state in {len(raw)} bytes, expected "
                f"{n} and {n_state}"
            )
        body = memoryview(raw)[RECORD.size :]
        if zlib.crc32(body) != crc:
            raise StoreError(f"{where}: checksum mismatch; the store is corrupt")
        arrays = np.frombuffer(body, np.float32)
        return version, arrays[:n].copy(), arrays[n:].copy()

    def write(self, items) -> int:
        """Write snapshots ``(shard, version, values, state)`` in one transaction; bytes written.

        Raises:
            StoreError: LMDB failed (the round is not on disk; nothing half-written).
        """
        written = 0
        try:
            with self.env.begin(write=True) as txn:
                for shard, version, values, state in items:
                    body = values.tobytes() + state.tobytes()
                    head = RECORD.pack(
                        RECORD_MAGIC, shard, version, values.size, state.size, zlib.crc32(body)
                    )
                    txn.put(shard_key(shard), head + body)
                    written += len(head) + len(body)
        except lmdb.Error as exc:
            raise StoreError(f"{self.file}: flush failed: {exc}") from exc
        return written

    def marks(
        self, n_buckets: int, n_servers: int | None = None
    ) -> dict[int, tuple[int, int, int]]:
        """``{bucket: (epoch, primary, lease)}``: the newest epoch of each bucket's record a
        server on this store saw, and that record's primary and lease (the buckets it never saw
        a record of are absent).

        Raises:
            StoreError: A mark that is corrupt (its key, magic, length or CRC), of an unknown
                format, of a bucket outside ``[0, n_buckets)`` or naming a primary outside
                ``[0, n_servers)`` (when given), naming the file and key.
        """
        out = {}
        try:
            with self.env.begin() as txn:
                cursor = txn.cursor()
                found = cursor.set_range(MARK_PREFIX)
                while found and bytes(cursor.key()).startswith(MARK_PREFIX):
                    key = bytes(cursor.key())
                    raw = bytes(cursor.value())
                    bucket, mark = self._decode_mark(key, raw, n_buckets, n_servers)
                    out[bucket] = mark
                    found = cursor.next()
        except lmdb.Error as exc:
            raise StoreError(f"{self.file}: unreadable parameter store: {exc}") from exc
        return out

    def _decode_mark(
        self, key: bytes, raw: bytes, n_buckets: int, n_servers: int | None
    ) -> tuple[int, tuple[int, int, int]]:
        where = f"{self.file}: record {key.decode(errors='replace')}"
        index = key[len(MARK_PREFIX) :]
        if len(index) != 8 or not index.isdigit():
            raise StoreError(f"{where}: not a bucket's mark (expected bucket/NNNNNNNN)")
        if len(raw) != MARK.size + 4:
            raise StoreError(f"{where}: {len(raw)} bytes, expected {MARK.size + 4}")
        magic, fmt, bucket, epoch, primary, lease = MARK.unpack_from(raw)
        if magic != MARK_MAGIC:
            raise StoreError(f"{where}: corrupt mark (magic {magic!r})")
        if zlib.crc32(raw[: MARK.size]) != struct.unpack_from("<I", raw, MARK.size)[0]:
            raise StoreError(f"{where}: checksum mismatch; the store is corrupt")
        if fmt != MARK_FORMAT:
            raise StoreError(
                f"{where}: a mark of format {fmt}, this hogwild reads format {MARK_FORMAT} "
                "(written by another version?)"
            )
        if bucket != int(index) or not 0 <= bucket < n_buckets:
            raise StoreError(
                f"{where}: marks bucket {bucket}, expected {int(index)} in [0, {n_buckets}) "
                "(this job's buckets: a store of another layout? use another --store directory)"
            )
        if not 1 <= epoch < MAX_EPOCH:
            raise StoreError(f"{where}: epoch {epoch}, expected one in [1, {MAX_EPOCH})")
        if n_servers is not None and not 0 <= primary < n_servers:
            raise StoreError(
                f"{where}: primary {primary}, expected one of the job's servers [0, {n_servers})"
            )
        if not 0 <= lease < 2**63:
            raise StoreError(f"{where}: lease {lease}, expected one in [0, 2**63)")
        return bucket, (epoch, primary, lease)

    def mark(self, marks: dict[int, tuple[int, int, int]]) -> None:
        """Write each bucket's newest record seen (``{bucket: (epoch, primary, lease)}``) in one
        transaction, synced to disk before it returns (LMDB's commit).

        Raises:
            StoreError: LMDB failed (nothing of it is on disk).
        """
        try:
            with self.env.begin(write=True) as txn:
                for bucket, (epoch, primary, lease) in marks.items():
                    head = MARK.pack(MARK_MAGIC, MARK_FORMAT, bucket, epoch, primary, lease)
                    txn.put(mark_key(bucket), head + struct.pack("<I", zlib.crc32(head)))
        except lmdb.Error as exc:
            raise StoreError(f"{self.file}: a bucket's mark could not be written: {exc}") from exc

    def close(self) -> None:
        self.env.close()


class Flusher:
    """The background thread that flushes rounds of dirty shards (see the module docstring).

    Args:
        snapshot: ``snapshot(full)`` returns a round (``items``, ``applied_updates``) or None.
        store: Where rounds go.
        interval_s: Seconds between rounds.
    """

    def __init__(self, snapshot, store: ShardStore, interval_s: float) -> None:
        self._snapshot, self.store, self.interval_s = snapshot, store, interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.flushes = 0
        self.last_flush = time.monotonic()  # the state recovered at start is on disk
        self.flushed_updates = 0
        self.flushed_versions: dict[int, int] = {}
        self.last_bytes = 0
        self.last_seconds = 0.0
        self.error: str | None = None  # the last round's failure (None: it was written)
        self.failures = 0  # rounds that failed, ever
        self.failing_since: float | None = None  # the first failure of the present streak
        self._full = False

    def start(self, applied_updates: int = 0) -> None:
        self.flushed_updates = applied_updates
        self._thread = threading.Thread(target=self._run, name="hogwild-flush", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def flush(self) -> bool:
        """One round now; False if it failed. A failure is recorded (the error, the count, since
        when flushes fail: the status shows them), said on stderr at the start of a streak and
        when it ends, and the next round writes every shard; the store keeps its last round
        whole (one transaction), and the thread goes on trying every ``interval_s``."""
        with self._lock:
            started = time.monotonic()
            try:
                round_ = self._snapshot(self._full)
                if round_ is None:
                    raise StoreError("an update thread did not hand over its shards in time")
                self.last_bytes = self.store.write(round_.items)
            except Exception as exc:  # noqa: BLE001 - a disk full, a bug: recorded, retried
                self._failed(started, exc)
                return False
            if self.failing_since is not None:
                print(
                    f"hogwild ps: flushes to {self.store.file} written again after "
                    f"{started - self.failing_since:.1f} s of failures",
                    file=sys.stderr,
                    flush=True,
                )
            self._full, self.error, self.failing_since = False, None, None
            self.flushes += 1
            self.last_flush = started
            self.flushed_updates = round_.applied_updates
            for shard, version, _, _ in round_.items:
                self.flushed_versions[shard] = version
            self.last_seconds = time.monotonic() - started
            return True

    def _failed(self, started: float, exc: Exception) -> None:
        self.error = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
        self.failures += 1
        self._full = True  # the next round writes every shard
        if self.failing_since is None:
            self.failing_since = started
            print(
                f"hogwild ps: a flush to {self.store.file} failed ({self.error}); serving on, "
                "the loss window grows until a flush succeeds (`hogwild ps status`)",
                file=sys.stderr,
                flush=True,
            )

    def failing_s(self) -> float:
        """Seconds since flushes began to fail (0: the last round was written)."""
        if self.failing_since is None:
            return 0.0
        return round(time.monotonic() - self.failing_since, 3)

    def stop(self, final: bool = True) -> bool:
        """Stop the thread; then a final flush (``final``). True if that flush succeeded."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60.0)
        return self.flush() if final else True

    def window(self, applied_updates: int) -> dict:
        """The loss window: what a crash now would lose."""
        return {
            "seconds": round(time.monotonic() - self.last_flush, 3),
            "updates": max(0, applied_updates - self.flushed_updates),
            "flushes": self.flushes,
            "last_flush_bytes": self.last_bytes,
            "last_flush_s": round(self.last_seconds, 4),
            "error": self.error,
            "failures": self.failures,
            "failing_s": self.failing_s(),
        }
