"""Buckets a server stopped: a write it acknowledged failed to apply, so it no longer holds them.

An acknowledgement is a promise that the write is in the shard (and, with copies, on every
in-sync copy). When the update that was promised then fails to apply (a bug: the update rule
raised, the memory could not be written), the shard no longer holds what its clients were told.
Carrying on would diverge quietly: later updates land on parameters that lack one, a copy's
snapshot would spread that state, a checkpoint would keep it. So the failure stops the shard's
whole bucket (the unit of placement and replication) on this server:

* every request for a stopped bucket's shards (pushes, pulls, vector operations, and with
  copies a primary's ``PREPARE`` and ``COMMIT``) is refused with ``STOPPED`` naming the bucket,
  the write that failed and why, so the replicas that train through it stop and their driver is
  told (a client does not retry ``STOPPED``);
* it is in the server's status (``stopped_buckets``, with the reason, and ``buckets_stopped``,
  a Prometheus gauge) and said on stderr once;
* with copies, the bucket's role hands the bucket to an in-sync copy (which holds every
  acknowledged write) if it was the primary, and never campaigns for it while it is stopped;
  a snapshot of each failed shard, queued after its failure (so applied after it, in the
  shard's order), replaces its memory, and once none is left the stop is lifted
  (:meth:`BucketStops.replaced`).

Written by the update threads (and the network thread, for a push it applied itself), read by
the network thread on every request: a dictionary whose single assignments and lookups are
atomic under the interpreter lock, and which stays empty (one truth test a request) on a healthy
server.
"""

from __future__ import annotations

import re
import sys
import threading
import time

from hogwild.net.wire import ErrorCode, WireError

__all__ = ["MAX_REASON", "BucketStops"]

MAX_REASON = 400  # characters of a stop's reason kept (the error reply carries it)
_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")  # terminal colours in a numba error's text


class BucketStops:
    """The buckets this server stopped, each with why (see the module docstring).

    Args:
        server: This server's index (named in the refusal).
        on_stop: Called once per stop (from the thread that recorded it) with the bucket: the
            replication hands a primary's bucket over. None: nothing more to do.
        say: Where a stop is said, one line (None: stderr; the simulator keeps it in its
            schedule instead of printing it for every seed).
    """

    def __init__(self, server: int, on_stop=None, say=None) -> None:
        self.server = server
        self.on_stop = on_stop
        self.say = say
        # bucket -> {"reason", "at" (wall clock), "shards": those whose memory failed a write}
        self.buckets: dict[int, dict] = {}
        self.stops = 0  # every stop, lifted or not
        self.lifted = 0
        self._lock = threading.Lock()  # two threads stopping one bucket: one record, one call

    def __getstate__(self) -> dict:
        """A copy (the simulator copies its servers between steps) takes a lock of its own."""
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def stop(self, bucket: int, shard: int, reason: str) -> bool:
        """Stop ``bucket``: ``shard``'s memory failed a write, for ``reason``. False if the bucket
        was stopped already (the shard is added; the first reason stays: it is the failure that
        broke the promise)."""
        reason = " ".join(_ESCAPES.sub("", reason).split())[:MAX_REASON]  # one line, no colours
        with self._lock:
            entry = self.buckets.get(bucket)
            if entry is not None:
                entry["shards"].add(shard)
                return False
            self.buckets[bucket] = {"reason": reason, "at": time.time(), "shards": {shard}}
            self.stops += 1
        line = (
            f"hogwild ps: server {self.server} stopped bucket {bucket}: {reason} "
            "(its requests are refused with STOPPED; see `hogwild ps status`)"
        )
        if self.say is None:
            print(line, file=sys.stderr, flush=True)
        else:
            self.say(line)
        if self.on_stop is not None:
            self.on_stop(bucket)
        return True

    def failed(self, bucket: int, shard: int) -> bool:
        """Whether ``shard`` of ``bucket`` failed a write (a snapshot queued now replaces it)."""
        entry = self.buckets.get(bucket)
        return entry is not None and shard in entry["shards"]

    def replaced(self, bucket: int, shard: int) -> bool:
        """A snapshot queued after ``shard`` failed replaced its memory. True if that lifts the
        bucket's stop (no shard of it holds a failed write any more)."""
        with self._lock:
            entry = self.buckets.get(bucket)
            if entry is None:
                return False
            entry["shards"].discard(shard)
            if entry["shards"]:
                return False
            del self.buckets[bucket]
            self.lifted += 1
        return True

    def stopped(self, bucket: int) -> bool:
        return bucket in self.buckets

    def check(self, bucket: int, shard: int, what: str) -> None:
        """Refuse ``what`` (a request's name) for ``shard`` of a stopped ``bucket``.

        Raises:
            WireError: ``STOPPED``, naming the bucket and why it stopped.
        """
        entry = self.buckets.get(bucket)
        if entry is not None:
            raise WireError(
                f"{what} of shard {shard}: bucket {bucket} is stopped on server {self.server}: "
                f"a write it acknowledged failed to apply ({entry['reason']}); its memory no "
                "longer holds what was acknowledged. Restart the job from a checkpoint (with "
                "copies, an in-sync copy takes the bucket over)",
                ErrorCode.STOPPED,
            )

    def status(self) -> dict:
        """``stopped_buckets`` (bucket -> reason) and the counts, for the server's status."""
        return {
            "stopped_buckets": {str(b): e["reason"] for b, e in sorted(self.buckets.items())},
            "buckets_stopped": len(self.buckets),
            "bucket_stops": self.stops,
        }
