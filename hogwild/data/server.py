"""Adam's data server (section 3.1): batches of a data set held in memory, streamed over the
transport to the replicas, which ask for them ahead of need.

A :class:`DataServer` serves a :class:`~hogwild.data.resident.Delivery` (the source in memory, its
augmented variants rendered ahead of demand: :mod:`hogwild.data.resident`) through a
:class:`~hogwild.net.router.Router`. Protocol (:mod:`hogwild.net.wire`):

- ``BATCH``: ``job`` = the data's id (``describe`` gives it), ``target`` = the split (0 train,
  1 test), ``aux`` = the epoch (0 for test), one int64 frame of record indices ``[n]``; every
  other field 0. The reply is ``DATA`` with dtype uint8 and shape ``[n, C, h, w]`` (the model's
  layout, as delivered), ``aux`` the epoch, and two frames: the images, then int32 labels ``[n]``.
- ``CONTROL``: one UTF-8 JSON frame, ``{"op": "describe"}`` (shape as delivered, counts per split,
  classes, augmentation, seed, the data's id, the most records per request) or
  ``{"op": "status"}`` (requests, bytes, rates, the render-ahead state); a ``JSON`` reply.
- ``PING`` (an ``ACK`` whose version is the data's id) and ``STATUS`` (the status JSON).

The network thread checks every field of every request; a bad one gets an ``ERROR`` reply naming
it, and the server goes on serving. Serve threads fill the batches (numpy gathers and ``nogil``
numba kernels) and answer through the router's repliers; a full queue answers ``BUSY``, which the
client retries. A retried ``BATCH`` is served again (reads are idempotent).
"""

from __future__ import annotations

import json
import math
import queue
import threading
import time

import numpy as np

from hogwild.data.remote import REQUEST_BYTES
from hogwild.data.resident import SPLITS, Delivery
from hogwild.net.address import Address, check_bind
from hogwild.net.rates import RateMeter
from hogwild.net.router import Incoming, Reply, Router, error_reply, json_reply, reply_hwm
from hogwild.net.wire import (
    RESEND,
    WIRE_VERSION,
    DType,
    ErrorCode,
    Header,
    MsgType,
    WireError,
    frame_array,
)

__all__ = ["DataServer"]

QUEUE_PER_THREAD = 32
MAX_CONTROL_BYTES = 4096
_ZERO_FIELDS = ("version", "offset", "code", "lease", "a", "b")


MAX_REPLY_BYTES = 8 * 2**20
"""Image bytes one ``BATCH`` reply carries at most. A reader asks for 1 MiB at a time
(:data:`~hogwild.data.remote.REQUEST_BYTES`), and the router keeps the replies of 128 such
requests for a client (:func:`~hogwild.net.router.reply_hwm`); a client that asks for the most
and never reads holds at most 128 x 8 MiB in the server per connection."""


class DataServer:
    """One data server (see the module docstring); the :class:`Router`'s handler.

    Args:
        delivery: What to serve; started by :meth:`start`, closed by :meth:`stop`.
        address: Where to listen (port 0: a free one; see :attr:`address` after :meth:`start`).
        keys: CURVE key directory (required beyond loopback).
        threads: Serve threads.
    """

    dedup_types = frozenset({MsgType.BATCH})
    receives_into_buffers = False

    def __init__(
        self, delivery: Delivery, address: Address, *, keys: str | None = None, threads: int = 2
    ) -> None:
        check_bind(address, keys)  # before anything starts
        self.delivery, self.address, self.keys = delivery, address, keys or None
        self.data_id, self.n_threads = delivery.data_id, max(1, threads)
        self.max_records = max(1, MAX_REPLY_BYTES // math.prod(delivery.shape))
        self.router: Router | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=self.n_threads * QUEUE_PER_THREAD)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._count_lock = threading.Lock()
        self.counts = dict.fromkeys(("batches", "records", "bytes", "control", "busy"), 0)
        self.failures: list[str] = []
        self.started_at = time.monotonic()
        self.rates = RateMeter(2, self.started_at)  # records, bytes

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Address:
        """Compile the data kernels it runs, start rendering, the serve threads and the network
        thread.

        Returns:
            The address it listens on (with the real port when it was 0).
        """
        from hogwild.data.feed import compile_data_kernels
        from hogwild.locks import compile_lock

        # Only the kernels this server runs: one serving stored idx images as they are runs none,
        # and loading numba for nothing would be most of its start-up. Data servers starting
        # together: the first compiles, the others load what it wrote. A lock of their own: the
        # parameter servers' kernels are other code, compiled meanwhile.
        render, gather = self.delivery.renders, self.delivery.source.kind == "cache"
        if render or gather:
            with compile_lock(kernels="data-kernels"):
                compile_data_kernels(render=render, gather=gather)
        try:
            self.router = Router(self.address, self, keys=self.keys,
                                 reply_hwm=reply_hwm(REQUEST_BYTES))  # fmt: skip
            for i in range(self.n_threads):
                replier = self.router.replier()
                thread = threading.Thread(
                    target=self._serve, args=(replier,), name=f"hogwild-data-{i}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
            self.delivery.start()
            self.address = self.router.start()
        except BaseException:
            self.stop()
            raise
        return self.address

    def stop(self) -> None:
        """Stop listening and every thread, close the sockets and the source (idempotent)."""
        if self.router is not None:
            self.router.stop()
        self._stop.set()
        for thread in self._threads:
            thread.join(5.0)
        if self.router is not None and not any(t.is_alive() for t in self._threads):
            self.router.close()  # ends the ZeroMQ context: every replier is closed by now
        self.router = None
        self.delivery.close()

    @property
    def alive(self) -> bool:
        return self.router is not None and self.router.alive

    def __enter__(self) -> DataServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self, replier) -> None:
        """A serve thread: fill the queued batches and send them through ``replier``."""
        try:
            while not self._stop.is_set():
                try:
                    header, split, idx, _frames = self._queue.get(timeout=0.1)
                except queue.Empty:
                    continue
                n = len(idx)
                images = np.empty((n, *self.delivery.shape), np.uint8)
                labels = np.empty(n, np.int32)
                try:
                    self.delivery.fill(split, header.aux, idx, images, labels)
                except Exception as exc:  # noqa: BLE001 - a failed read is reported, not fatal
                    text = f"{type(exc).__name__}: {exc}"
                    reply = error_reply(header, ErrorCode.INTERNAL, text)
                    replier.send(reply.header, reply.frames)
                    self.failures = (self.failures + [text[:200]])[-5:]
                    continue
                out = header.reply(MsgType.DATA, dtype=DType.UINT8, shape=images.shape, frames=2)
                replier.send(out._replace(aux=header.aux), [images, labels])
                with self._count_lock:
                    self.counts["batches"] += 1
                    self.counts["records"] += n
                    self.counts["bytes"] += images.nbytes + labels.nbytes
        finally:
            replier.close()

    # ------------------------------------------------------------------ the handler

    def buffers(self, header: Header) -> list | None:
        return None  # frames are used in place

    def release(self, buffers: list) -> None:
        pass

    def tick(self, now: float) -> None:
        self.rates.tick(now, lambda: (self.counts["records"], self.counts["bytes"]))

    def handle(self, request: Incoming) -> Reply | None:
        header = request.header
        if header.type == MsgType.BATCH:
            split, idx = self._check_batch(header, request.frames)
            try:
                self._queue.put_nowait((header, split, idx, request.frames))
            except queue.Full:
                with self._count_lock:
                    self.counts["busy"] += 1
                raise WireError("the data server's queue is full; retry", ErrorCode.BUSY) from None
            return None
        if header.type not in (MsgType.PING, MsgType.STATUS, MsgType.CONTROL):
            raise WireError(
                f"a data server does not take {header.type.name} messages (BATCH, CONTROL, PING "
                "and STATUS only)",
                ErrorCode.UNEXPECTED,
            )
        self._check_job(header, allow_any=True)
        self._check_zero(header, ("target", "aux", *_ZERO_FIELDS))
        if header.type != MsgType.CONTROL:
            if header.frames or header.dtype != DType.NONE:
                raise WireError(f"{header.type.name} takes no frames", ErrorCode.BAD_FRAMES)
            if header.type == MsgType.PING:
                return Reply(header.reply(MsgType.ACK, version=self.data_id))
            return json_reply(header, self.status())
        with self._count_lock:
            self.counts["control"] += 1
        op = self._control_op(header, request.frames)
        return json_reply(header, self.describe() if op == "describe" else self.status())

    def _check_job(self, header: Header, allow_any: bool = False) -> None:
        if header.job != self.data_id and not (allow_any and header.job == 0):
            raise WireError(
                f"job id {header.job:#x} is not the id of the data this server serves "
                f"({self.data_id:#x}, from a describe request)",
                ErrorCode.WRONG_JOB,
            )

    def _check_zero(self, header: Header, names: tuple[str, ...]) -> None:
        for name in names:
            if getattr(header, name):
                raise WireError(
                    f"{name} must be 0 in a {header.type.name} request to a data server, got "
                    f"{getattr(header, name)}",
                    ErrorCode.BAD_VALUE,
                )
        if header.flags & ~RESEND:
            raise WireError(f"flags {header.flags:#x}: only RESEND is allowed", ErrorCode.BAD_VALUE)

    def _check_batch(self, header: Header, frames: list) -> tuple[str, np.ndarray]:
        self._check_job(header)
        split = SPLITS[header.target] if header.target < len(SPLITS) else None
        if split is None or not self.delivery.source.count(split):
            counts = ", ".join(
                f"{i} = {s} ({self.delivery.source.count(s)})" for i, s in enumerate(SPLITS)
            )
            raise WireError(
                f"target {header.target}: no such split here (splits: {counts} records)",
                ErrorCode.BAD_TARGET,
            )
        if header.dtype != DType.INT64 or len(header.shape) != 1 or header.frames != 1:
            raise WireError(
                f"a BATCH request carries one int64 frame of record indices [n], got "
                f"{header.dtype.name} {list(header.shape)} in {header.frames} frame(s)",
                ErrorCode.BAD_FRAMES,
            )
        n = header.shape[0]
        if n > self.max_records:
            raise WireError(
                f"{n} records asked for; at most {self.max_records} images of "
                f"{list(self.delivery.shape)} per request",
                ErrorCode.BAD_RANGE,
            )
        self._check_zero(header, _ZERO_FIELDS)
        if split == "test" and header.aux:
            raise WireError(f"epoch (aux) {header.aux}: must be 0 for the test split",
                            ErrorCode.BAD_VALUE)  # fmt: skip
        idx = frame_array(frames[0], DType.INT64, (n,), "record indices")
        count = self.delivery.source.count(split)
        if idx.min() < 0 or idx.max() >= count:
            bad = int(idx[(idx < 0) | (idx >= count)][0])
            raise WireError(
                f"record index {bad} is outside 0..{count - 1} of the {split} split",
                ErrorCode.BAD_RANGE,
            )
        return split, idx

    def _control_op(self, header: Header, frames: list) -> str:
        if header.dtype != DType.UINT8 or len(header.shape) != 1 or header.frames != 1:
            raise WireError("CONTROL carries one UTF-8 JSON frame", ErrorCode.BAD_FRAMES)
        if header.shape[0] > MAX_CONTROL_BYTES:
            raise WireError(
                f"a CONTROL frame of {header.shape[0]} bytes; at most {MAX_CONTROL_BYTES}",
                ErrorCode.BAD_FRAMES,
            )
        raw = frame_array(frames[0], DType.UINT8, header.shape, "CONTROL frame").tobytes()
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            problem = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise WireError(
                f"the CONTROL frame is not UTF-8 JSON: {problem}", ErrorCode.BAD_VALUE
            ) from None
        ops = ("describe", "status")
        if not isinstance(doc, dict) or set(doc) != {"op"} or doc["op"] not in ops:
            raise WireError(
                f'CONTROL {raw[:200]!r}: expected {{"op": "describe"}} or {{"op": "status"}}',
                ErrorCode.BAD_VALUE,
            )
        return doc["op"]

    # ------------------------------------------------------------------ control replies

    def describe(self) -> dict:
        """What this server delivers (the ``describe`` reply)."""
        return {**self.delivery.describe(), "max_records": self.max_records, "wire": WIRE_VERSION}

    def status(self) -> dict:
        """Counters: requests, bytes, rates, where batches came from, the render-ahead state."""
        router = self.router
        with self._count_lock:
            counts = dict(self.counts)
        records_per_s, bytes_per_s = self.rates.rates
        return {
            "role": "data",
            "address": str(self.address),
            "source": self.delivery.source.path,
            "data_id": self.data_id,
            "uptime_s": round(time.monotonic() - self.started_at, 1),
            "threads": self.n_threads,
            "queue_depth": self._queue.qsize(),
            **counts,
            "records_per_s": round(records_per_s, 1),
            "mb_per_s": round(bytes_per_s / 2**20, 2),
            **self.delivery.state(),
            "received": router.received if router else 0,
            "duplicates": router.window.duplicates if router else 0,
            "errors": dict(router.errors) if router else {},
            "failures": list(self.failures),
        }
