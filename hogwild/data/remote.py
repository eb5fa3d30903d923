"""Reading a split through a job's data servers (Adam section 3.1), moving on when one goes quiet.

:class:`RemoteReader` is a reader like those :class:`~hogwild.data.feed.WorkerFeed` takes -- a
``shape`` and ``read(indices, out, labels_out)`` -- over the data servers of
:mod:`hogwild.data.server`, plus :meth:`RemoteReader.for_epoch`: a view whose reads ask for that
epoch's variants (a feed takes it as the epoch's ``variants``). Images arrive augmented, in the
model's layout: ``shape`` is ``(C, h, w)`` and ``out`` gets ``[n, C, h, w]``, so a feed made with
``channels_first=False`` and no augmentation of its own passes them through untouched.

Each read goes to one server, the next in turn after the last one that answered (a reader starts
at ``start``, e.g. its worker's index, so the workers of a job spread over the servers), as
pipelined ``BATCH`` requests of at most :data:`REQUEST_BYTES` whose replies are received straight
into ``out`` and ``labels_out`` (no copy beyond ZeroMQ's). A server that does not answer within
``timeout_s`` (the request sent once more on a fresh socket), that answers garbage, or that fails
on a valid request is left out of the turn and the read goes to the next server: an epoch goes on
while a server is down. A server left out is asked again (a ``describe`` with a short timeout)
after ``recheck_s``, and tried anyway, last, when every other one failed; a read that no server
served is a :class:`~hogwild.errors.DataError` naming each server and what happened. A server
that serves other data (another data id) is a :class:`~hogwild.errors.DataError` at once: that is
a misconfiguration, not an outage.

A reader is used by one thread at a time (its feed's prefetch thread). Nothing received is
unpickled; every wait has a timeout; :meth:`RemoteReader.close` closes every socket.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

from hogwild.data.labels import check_labels
from hogwild.errors import DataError, HogwildError
from hogwild.net.address import parse_address
from hogwild.net.channel import Cancelled, Peers, PeerUnreachableError, ProtocolError, Request
from hogwild.net.wire import MAX_ARRAY_BYTES, DType, ErrorCode, Header, MsgType

__all__ = [
    "REQUEST_BYTES",
    "RemoteReader",
    "all_silent",
    "describe_server",
    "describe_servers",
]

REQUEST_BYTES = 1 << 20
"""Most image bytes one ``BATCH`` request asks for; a larger read is several, pipelined."""
RECHECK_S = 10.0
PROBE_TIMEOUT_S = 0.5
WAIT_ROUND_S = 1.0  # between a start's rounds of asking its data servers (data.wait_s)
MAX_JSON_BYTES = 1 << 20
SPLIT_CODES = {"train": 0, "test": 1}
_DESCRIBE = json.dumps({"op": "describe"}).encode()


class _Unavailable(Exception):
    """This server cannot serve now (silent, garbled or failing): try another."""


def _new_sender() -> int:
    return int.from_bytes(os.urandom(4), "little") or 1


class DataServerSilentError(DataError):
    """A data server did not answer at all (none there yet, or gone): unlike a wrong reply, an
    answer may still come."""


def describe_server(
    address: str, *, keys: str | None = None, timeout_s: float = 2.0, retries: int = 1
) -> dict:
    """One data server's ``describe`` reply (the shape delivered, counts, classes, data id...).

    Raises:
        DataError: It did not answer in time, or its reply is not a valid description.
    """
    header = Header(MsgType.CONTROL, dtype=DType.UINT8, shape=(len(_DESCRIBE),), frames=1)
    where = f"data server {address}"
    try:
        with Peers(
            [address], sender=_new_sender(), timeout_s=timeout_s, retries=retries, keys=keys
        ) as peers:
            reply, frames = peers.request(0, header, [_DESCRIBE])
    except PeerUnreachableError:
        raise DataServerSilentError(
            f"{where} did not answer within {timeout_s:g} s ({retries} retries); is "
            f"`hogwild data serve` running there{' with these keys' if keys else ''}?"
        ) from None
    except ProtocolError as exc:
        raise DataError(f"{where}: {exc}") from None
    text = bytes(memoryview(frames[0])) if frames else b""
    if reply.type == MsgType.ERROR:
        raise DataError(f"{where} refused a describe request: {text.decode('utf-8', 'replace')}")
    if reply.type != MsgType.JSON or len(text) > MAX_JSON_BYTES:
        raise DataError(f"{where}: no JSON description in its reply ({reply.type.name})")
    try:
        described = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise DataError(f"{where}: its description is not JSON ({exc})") from None
    return _checked(described, where)


def _checked(d, where: str) -> dict:
    def ints(value, n: int) -> bool:
        return (
            isinstance(value, list) and len(value) == n and all(isinstance(v, int) for v in value)
        )

    problems = []
    if not isinstance(d, dict) or d.get("role") != "data":
        raise DataError(f"{where} is not a data server (its description: {str(d)[:200]})")
    if not isinstance(d.get("data_id"), int) or not 0 < d["data_id"] < 2**64:
        problems.append("data_id")
    for key in ("shape", "stored_shape"):  # an image must fit a frame
        if not ints(d.get(key), 3) or min(d[key]) < 1 or math.prod(d[key]) > MAX_ARRAY_BYTES:
            problems.append(key)
    splits = d.get("splits")
    if not isinstance(splits, dict) or not all(
        isinstance(splits.get(s), int) and splits[s] >= 0 for s in SPLIT_CODES
    ):
        problems.append("splits")
    if not isinstance(d.get("classes"), list) or not d["classes"]:
        problems.append("classes")
    if not isinstance(d.get("max_records"), int) or d["max_records"] < 1:
        problems.append("max_records")
    if not isinstance(d.get("seed"), int) or not (d.get("augment") is None or
                                                  isinstance(d["augment"], dict)):  # fmt: skip
        problems.append("seed/augment")
    if problems:
        raise DataError(f"{where}: its description lacks a valid {', '.join(problems)}")
    return d


def describe_servers(
    servers: Sequence[str],
    *,
    keys: str | None = None,
    timeout_s: float = 2.0,
    wait_s: float = 0.0,
) -> dict:
    """The description of the data every answering server serves (the parent's check).

    Args:
        wait_s: While none answers and every one is silent (a wrong answer will not change),
            ask them all again every :data:`WAIT_ROUND_S` for this long (a data server lost with
            its host and started again: a replica restarted meanwhile waits for it instead of
            failing its start, and its restarts, at once).

    Returns:
        The first answering server's description, plus ``"answering"``: the servers that did.

    Raises:
        DataError: None answered within ``wait_s`` (each named, with why), or two serve
            different data.
    """
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        found, failures, silent = _ask_each(servers, keys, timeout_s, retries=1)
        if found or not silent or time.monotonic() + WAIT_ROUND_S > deadline:
            break
        if not said:
            print(f"hogwild: no data server answered ({', '.join(servers)}); waiting up to "
                  f"{wait_s:g} s (data.wait_s)", file=sys.stderr, flush=True)  # fmt: skip
            said = True
        time.sleep(WAIT_ROUND_S)
    if not found:
        waited = f" (waited {wait_s:g} s, data.wait_s)" if said else ""
        raise DataError(f"no data server answered{waited}: " + "; ".join(failures))
    first_address, first = found[0]
    for address, d in found[1:]:
        if d["data_id"] != first["data_id"]:
            raise DataError(
                f"data servers {first_address} and {address} serve different data ("
                + "; ".join(
                    f"{a}: {x['source']}, {x['splits']}, augment {x['augment']}, seed {x['seed']}"
                    for a, x in ((first_address, first), (address, d))
                )
                + "); start every data server of a job with the same source and the job's config"
            )
    return {**first, "answering": [a for a, _ in found]}


def all_silent(servers: Sequence[str], *, keys: str | None = None) -> bool:
    """Whether none of ``servers`` answers a ``describe`` now (each asked once, for
    :data:`PROBE_TIMEOUT_S`): a server answering wrongly is not silent (waiting will not change
    it). The driver asks before it restarts a replica (:mod:`hogwild.cluster.supervisor`). A
    failure that is no data error (keys that cannot be read, an address refused before
    anything is sent: a :class:`~hogwild.errors.HogwildError`) is not silence either: waiting
    will not change it, and it must not stop the driver, which asks while the job runs."""
    try:
        found, _, silent = _ask_each(servers, keys, PROBE_TIMEOUT_S, retries=0)
    except HogwildError:
        return False
    return bool(servers) and not found and silent


def _ask_each(
    servers: Sequence[str], keys: str | None, timeout_s: float, retries: int
) -> tuple[list[tuple[str, dict]], list[str], bool]:
    """One round of ``describe`` to each server: the ``(address, description)`` of those that
    answered, why each other one did not, and whether every one that did not was silent (no
    answer at all, rather than a wrong one)."""
    found, failures, silent = [], [], True
    for address in servers:
        try:
            described = describe_server(address, keys=keys, timeout_s=timeout_s, retries=retries)
        except DataError as exc:
            failures.append(str(exc))
            silent = silent and isinstance(exc, DataServerSilentError)
        else:
            found.append((address, described))
    return found, failures, silent


class RemoteReader:
    """One split of a job's data, read from its data servers (see the module docstring).

    Args:
        servers: ``HOST:PORT`` of every data server (each serves the whole data set).
        split: ``"train"`` or ``"test"``.
        start: The server asked first (the worker's index spreads a job's workers).
        data_id: The data the job was planned with (0: what the first server describes).
        timeout_s: Seconds a request waits for its reply before it is re-sent once; silent
            after that, the server is left out of the turn.
        keys: CURVE key directory (servers beyond loopback).
        recheck_s: Seconds before a server left out is asked again.

    Attributes:
        shape: (C, h, w) of a delivered image.
        failovers: Reads a server failed and another one served (or tried to).

    Raises:
        DataError: No server answered a describe request, the data is not the job's, or the
            split is empty.
    """

    def __init__(self, servers: Sequence[str], split: str, *, start: int = 0, data_id: int = 0,
                 timeout_s: float = 2.0, keys: str | None = None,
                 recheck_s: float = RECHECK_S) -> None:  # fmt: skip
        if split not in SPLIT_CODES:
            raise ValueError(f"split {split!r}: expected one of {sorted(SPLIT_CODES)}")
        if not servers:
            raise DataError("no data servers given")
        self.addresses = [str(parse_address(a)) for a in servers]
        self.split, self.timeout_s, self.keys = split, timeout_s, keys or None
        self.recheck_s = recheck_s
        n = len(self.addresses)
        self._down_until = [0.0] * n
        self._peers: list[Peers | None] = [None] * n
        self._sender = _new_sender()
        self._cancelled = False
        self.failovers = 0
        failures = []
        for i in ((start + k) % n for k in range(n)):
            try:
                described = describe_server(self.addresses[i], keys=keys, timeout_s=timeout_s)
                break
            except DataError as exc:
                failures.append(str(exc))
                self._down_until[i] = time.monotonic() + recheck_s
        else:
            raise DataError("no data server answered: " + "; ".join(failures))
        self.data_id = data_id or described["data_id"]
        self._check_id(i, described["data_id"])
        self.description = described
        self.shape = tuple(described["shape"])
        self.n_classes = len(described["classes"])
        self.count = described["splits"][split]
        if not self.count:
            raise DataError(f"data server {self.addresses[i]} has no {split!r} examples")
        image_bytes = math.prod(self.shape)
        self.per_request = max(1, min(described["max_records"], REQUEST_BYTES // image_bytes))
        self._next = start % n

    def __len__(self) -> int:
        return self.count

    def _check_id(self, i: int, data_id: int) -> None:
        if data_id != self.data_id:
            raise DataError(
                f"data server {self.addresses[i]} serves other data (id {data_id:#x}) than this "
                f"job was planned with ({self.data_id:#x}): start every data server with the "
                "same source and the job's config"
            )

    def for_epoch(self, epoch: int) -> EpochReads:
        """Reads of ``epoch``'s variants (a feed's ``variants`` for that epoch)."""
        return EpochReads(self, epoch)

    def read(self, indices, out: np.ndarray, labels_out: np.ndarray, epoch: int = 0):
        """Read records ``indices`` (epoch ``epoch``'s variants) into ``out[:n]`` ``[n, C, h, w]``
        and their labels into ``labels_out[:n]`` (int32).

        Raises:
            IndexError: An index outside the split. DataError: No server could serve the read.
        """
        from hogwild.data.feed import checked_indices

        idx = checked_indices(indices, self.count)
        n = idx.shape[0]
        size = math.prod(self.shape)
        if out.dtype != np.uint8 or not out.flags.c_contiguous or out[:1].size not in (0, size):
            raise ValueError(f"out must be C-contiguous uint8 [n, {list(self.shape)}]")
        if labels_out.dtype != np.int32 or not labels_out.flags.c_contiguous:
            raise ValueError("labels_out must be C-contiguous int32")
        if n:
            self._read(idx, out[:n].reshape(n, size), labels_out[:n], epoch)
        return out[:n], labels_out[:n]

    def _read(self, idx: np.ndarray, rows: np.ndarray, labels: np.ndarray, epoch: int) -> None:
        if self._cancelled:  # before any probe of a server left out, which waits for its answer
            raise Cancelled(f"the {self.split} reader was cancelled: its owner is stopping")
        failures = []
        for server in self._turn():
            try:
                self._read_from(server, idx, rows, labels, epoch)
            except _Unavailable as exc:
                failures.append(f"{self.addresses[server]}: {exc}")
                self._leave_out(server)
                self.failovers += 1
                continue
            self._down_until[server] = 0.0
            self._next = (server + 1) % len(self.addresses)
            return
        raise DataError(
            f"no data server could serve {len(idx)} {self.split} records (epoch {epoch}): "
            + "; ".join(failures)
        )

    def _turn(self) -> list[int]:
        """Servers to try, in order: those in the turn (from the next one), then those left out."""
        n, now = len(self.addresses), time.monotonic()
        order = [(self._next + k) % n for k in range(n)]
        for i in order:
            if self._down_until[i] and now >= self._down_until[i]:
                self._probe(i)
        return [i for i in order if not self._down_until[i]] + [
            i for i in order if self._down_until[i]
        ]

    def _probe(self, i: int) -> None:
        try:
            described = describe_server(
                self.addresses[i],
                keys=self.keys,
                timeout_s=min(self.timeout_s, PROBE_TIMEOUT_S),
                retries=0,
            )
        except DataError:
            self._down_until[i] = time.monotonic() + self.recheck_s
            return
        self._check_id(i, described["data_id"])
        self._down_until[i] = 0.0

    def _leave_out(self, i: int) -> None:
        self._down_until[i] = time.monotonic() + self.recheck_s
        if self._peers[i] is not None:
            self._peers[i].close()  # a fresh socket next time: nothing stale is queued
            self._peers[i] = None

    def _read_from(self, i: int, idx, rows, labels, epoch: int) -> None:
        if self._peers[i] is None:
            self._peers[i] = Peers([self.addresses[i]], sender=self._sender,
                                   timeout_s=self.timeout_s, retries=1, keys=self.keys)  # fmt: skip
            if self._cancelled:  # cancel() ran before this client existed: it is refused too
                self._peers[i].cancel()
        n, per = len(idx), self.per_request
        code = SPLIT_CODES[self.split]
        received, errors, requests = set(), [], []
        for lo in range(0, n, per):
            hi = min(lo + per, n)
            want = (hi - lo, *self.shape)

            def sink(h: Header, lo=lo, hi=hi, want=want):
                if h.shape != want or h.dtype != DType.UINT8 or h.frames != 2 or h.aux != epoch:
                    return None
                received.add(lo)
                return [rows[lo:hi], labels[lo:hi]]

            def check(h: Header, frames: list, lo=lo, want=want) -> None:
                if h.type == MsgType.ERROR:
                    text = bytes(memoryview(frames[0])).decode("utf-8", "replace") if frames else ""
                    errors.append((h.code, text))
                elif h.type != MsgType.DATA or lo not in received:
                    errors.append((None, f"a {h.type.name} reply of {list(h.shape)} (epoch "
                                         f"{h.aux}) to a BATCH of {want}"))  # fmt: skip

            header = Header(MsgType.BATCH, job=self.data_id, target=code, aux=epoch,
                            dtype=DType.INT64, shape=(hi - lo,), frames=1)  # fmt: skip
            requests.append(Request(0, header, [idx[lo:hi]], on_reply=check, sink=sink))
        try:
            self._peers[i].exchange(requests)
        except PeerUnreachableError:
            raise _Unavailable(f"no reply within {self.timeout_s:g} s, sent twice") from None
        except ProtocolError as exc:
            raise _Unavailable(str(exc)) from None
        for code_, text in errors:
            if code_ in (None, ErrorCode.INTERNAL):
                raise _Unavailable(text)
            raise DataError(f"data server {self.addresses[i]} refused a batch: {text}")
        try:  # a label is an index the kernels write at: garbage, not training data
            check_labels(labels, self.n_classes, f"its {self.split} batch", idx)
        except DataError as exc:
            raise _Unavailable(str(exc)) from None

    def cancel(self) -> None:
        """End a read in progress on another thread now, and refuse every later one
        (:class:`~hogwild.net.channel.Cancelled`): the owner is stopping, and a read from a
        server that died must not hold its exit for the timeouts. The one call another thread
        may make; :meth:`close` still releases the sockets."""
        self._cancelled = True
        for peers in list(self._peers):
            if peers is not None:
                peers.cancel()

    def close(self) -> None:
        """Close every socket."""
        for i, peers in enumerate(self._peers):
            if peers is not None:
                peers.close()
                self._peers[i] = None

    def __enter__(self) -> RemoteReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EpochReads:
    """One epoch's reads of a :class:`RemoteReader`: ``read(indices, out, labels_out)``."""

    def __init__(self, reader: RemoteReader, epoch: int) -> None:
        self.reader, self.epoch, self.shape = reader, epoch, reader.shape

    def __len__(self) -> int:
        return self.reader.count

    def read(self, indices, out: np.ndarray, labels_out: np.ndarray):
        return self.reader.read(indices, out, labels_out, epoch=self.epoch)
