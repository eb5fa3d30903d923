"""The client side of the transport: one DEALER per server, pipelined requests, bounded retries.

:class:`Peers` connects one ZeroMQ DEALER socket to each server and runs batches of
:class:`Request` s through them (:meth:`Peers.exchange`): it numbers every request (the sender id
and a per-connection sequence number whose high 32 bits are a random incarnation, so a restarted
client never reuses a number a server still remembers), keeps at most ``window`` of them in flight
per server, and hands each reply to its request's ``on_reply``. Array frames go out with
``copy=False`` (no copy of the caller's buffer: it must stay unchanged until ``exchange``
returns); a ``DATA`` reply's frames are received straight into the buffers the request's ``sink``
names (``recv_into``: one copy, from ZeroMQ's message into the caller's array).

Every wait is bounded: a request without a reply after ``timeout_s`` is sent again (with the same
number, on a fresh socket; the server drops or re-answers duplicates), at most ``retries`` times,
after which :class:`PeerUnreachableError` names the server's address. A ``BUSY`` reply (full
queues) is re-sent after a short pause without counting as a retry, within the same overall
deadline. Not thread-safe: one thread uses a :class:`Peers` at a time, except for
:meth:`Peers.cancel`, which another thread calls to end that thread's wait (its owner stops: the
replies are no longer wanted) within :data:`ALIVE_EVERY_S`.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import zmq

from hogwild.errors import HogwildError
from hogwild.net.address import Address, check_connect, parse_address
from hogwild.net.auth import secure_client
from hogwild.net.send import send_message
from hogwild.net.wire import (
    RESEND,
    ErrorCode,
    Header,
    MsgType,
    WireError,
    pack_header,
    unpack_header,
)

__all__ = ["Cancelled", "PeerUnreachableError", "Peers", "ProtocolError", "Request"]

BUSY_PAUSE_S = 0.002
ALIVE_EVERY_S = 0.2  # how often a wait asks whether it was cancelled or the peer still lives
_NOBLOCK = int(zmq.NOBLOCK)
_POLLIN = int(zmq.POLLIN)


def _new_prefix(old: int | None) -> int:
    """A random high 32 bits for a run of request numbers, other than ``old``'s."""
    while True:
        prefix = int.from_bytes(os.urandom(4), "little") << 32
        if prefix != old:
            return prefix


class PeerUnreachableError(HogwildError):
    """A server did not answer within the timeout, after every retry."""

    def __init__(self, address: str, message: str) -> None:
        super().__init__(message)
        self.address = address


class Cancelled(HogwildError):
    """The client's owner stopped it (:meth:`Peers.cancel`, or :meth:`Peers.close`): its wait
    ended unanswered, or a request after the close was refused."""


class ProtocolError(HogwildError):
    """A server's reply does not fit its request (wrong type, frame count or size)."""


@dataclass
class Request:
    """One request of a batch.

    Attributes:
        server: Index of the server (into the addresses :class:`Peers` was made with).
        header: The request's header; ``sender`` and ``seq`` are filled in on sending (a ``seq``
            already set is kept: a request re-sent to another server after a failover must
            carry the number it first had, for that server to recognise it).
        frames: Array frames (anything with the buffer protocol), sent without copying.
        on_reply: Called with the reply's header and frames (bytes-like) when it arrives.
        sink: For replies with frames: given the reply header, the writable buffers its frames
            are received into (None: receive them as zmq frames and pass them to ``on_reply``).
    """

    server: int
    header: Header
    frames: Sequence = ()
    on_reply: Callable[[Header, list], None] | None = None
    sink: Callable[[Header], list[memoryview]] | None = None
    attempts: int = 0
    sent_at: float = 0.0
    first_sent: float = 0.0
    resend_at: float = 0.0
    reply: Header | None = field(default=None, repr=False)


class Peers:
    """One DEALER per server, with numbered, pipelined, retried requests.

    Args:
        addresses: ``HOST:PORT`` (or ZeroMQ endpoints) of the servers.
        sender: This client's id (the header's ``sender``).
        timeout_s: Seconds a request waits for its reply before it is sent again.
        retries: How many times a request is sent again before the server counts as unreachable.
        keys: A CURVE key directory (required for servers beyond loopback).
        window: Most requests in flight per server.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        sender: int,
        timeout_s: float = 5.0,
        retries: int = 3,
        keys: str | None = None,
        window: int = 64,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        if not addresses:
            raise HogwildError("no server addresses given")
        self.addresses: list[Address] = [parse_address(a) for a in addresses]
        for address in self.addresses:
            check_connect(address, keys)
        self.sender, self.timeout_s, self.retries = sender, timeout_s, retries
        self.alive = alive  # asked every ALIVE_EVERY_S while waiting: False ends the wait
        self.keys, self.window = keys or None, max(1, window)
        self._incarnation = _new_prefix(None)  # the high 32 bits of this client's numbers
        self._next = 1
        self._context = zmq.Context()
        self._sockets: list[zmq.Socket | None] = [None] * len(self.addresses)
        self._poller = zmq.Poller()
        self._first_wait_ms = int(min(timeout_s, ALIVE_EVERY_S) * 1000) + 1
        self.resent = 0
        self._cancelled = threading.Event()
        self._closed = False
        for i in range(len(self.addresses)):
            self._connect(i)

    # ------------------------------------------------------------------ sockets

    def _connect(self, i: int) -> None:
        old = self._sockets[i]
        if old is not None:
            self._poller.unregister(old)
            old.close(linger=0)
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.keys:
            secure_client(sock, self.keys, self.addresses[i].endpoint)
        sock.connect(self.addresses[i].endpoint)
        self._sockets[i] = sock
        self._poller.register(sock, zmq.POLLIN)

    def close(self) -> None:
        """Close every socket and the context (nothing lingers); a later request is refused
        with :class:`Cancelled`."""
        self._closed = True
        for sock in self._sockets:
            if sock is not None:
                self._poller.unregister(sock)
                sock.close(linger=0)
        self._sockets = [None] * len(self.addresses)
        if not self._context.closed:
            self._context.term()

    def __enter__(self) -> Peers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cancel(self) -> None:
        """End the wait in progress, and refuse every later one, with :class:`Cancelled`.

        The one call another thread may make: the owner is stopping and no longer wants the
        replies (a worker's exchange thread blocked on a server that died must not hold up
        the worker's exit for its whole timeout and retries). Idempotent.
        """
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancelled.is_set()

    def _check_cancelled(self) -> None:
        if self._closed:
            raise Cancelled(f"requests to {self.addresses[0]} refused: the client is closed")
        if self._cancelled.is_set():
            raise Cancelled(f"requests to {self.addresses[0]} cancelled: the client is stopping")

    # ------------------------------------------------------------------ requests

    def request(self, server: int, header: Header, frames: Sequence = ()) -> tuple[Header, list]:
        """One request and its reply (header and frames, ``ERROR`` replies included)."""
        out: list = []
        self.exchange([Request(server, header, frames, lambda h, f: out.append((h, f)))])
        return out[0]

    def exchange(self, requests: Iterable[Request]) -> None:
        """Send every request (pipelined) and wait until each has its reply.

        Raises:
            PeerUnreachableError: A request went unanswered through every retry.
            ProtocolError: A reply that does not fit its request.
            Cancelled: :meth:`cancel` was called (before or during the wait).
        """
        self._check_cancelled()
        inflight: list[dict[int, Request]] = [{} for _ in self.addresses]
        if type(requests) is list and len(requests) == 1:
            # One request (a synchronous push or pull): send it and wait once for replies,
            # without the general loop's bookkeeping; anything but its reply within that wait
            # (a timeout, a busy server, only a late duplicate) goes on through the general
            # loop below, which it is now part of.
            req = requests[0]
            self._launch(req, time.monotonic())
            inflight[req.server][req.header.seq] = req
            for sock, _ in self._poller.poll(self._first_wait_ms):
                self._drain(self._sockets.index(sock), inflight)
            if not inflight[req.server]:
                return
            requests = ()
        waiting = [deque() for _ in self.addresses]
        for req in requests:
            waiting[req.server].append(req)
        while True:
            now = time.monotonic()
            for i, queue in enumerate(waiting):
                while queue and len(inflight[i]) < self.window:
                    req = queue.popleft()
                    self._launch(req, now)
                    inflight[i][req.header.seq] = req
            if not any(inflight):
                return
            deadline = self._next_due(inflight)
            if deadline <= now:
                self._resend_due(inflight, now)
                deadline = self._next_due(inflight)
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000) + 1)
            if self._cancelled.is_set():
                for i, per in enumerate(inflight):
                    if per:  # a fresh socket drops the queued frames, the caller's buffers
                        self._connect(i)
                self._check_cancelled()
            if self.alive is not None and not self.alive():
                raise PeerUnreachableError(
                    str(self.addresses[0]), f"{self.addresses[0]}: its process is gone"
                )
            wait_ms = min(wait_ms, int(ALIVE_EVERY_S * 1000))
            for sock, _ in self._poller.poll(wait_ms):
                self._drain(self._sockets.index(sock), inflight)

    def _next_due(self, inflight: list[dict[int, Request]]) -> float:
        """When the first request in flight is due to be sent again (timeout, or busy pause)."""
        return min(
            (r.resend_at or r.sent_at + self.timeout_s) for per in inflight for r in per.values()
        )

    def next_seq(self) -> int:
        """A new request number (a request whose header has none is given one on sending): a
        random high 32 bits naming this run of numbers, the low ones counting from 1. At the
        wrap (2**32 requests) the count starts again under a new random prefix: under the same
        one, each number after the wrap would be lower than those a server remembers of this
        client and be answered as a late copy, never applied (a server's request log takes
        another prefix as another run of numbers, new)."""
        seq = self._incarnation | self._next
        self._next = (self._next + 1) & 0xFFFFFFFF
        if self._next == 0:
            self._incarnation = _new_prefix(self._incarnation)
            self._next = 1
        return seq

    def _launch(self, req: Request, now: float) -> None:
        """Number ``req`` (a re-routed request keeps its number) and send it the first time."""
        if not req.header.seq:
            req.header = req.header._replace(sender=self.sender, seq=self.next_seq())
        req.first_sent = now
        self._send(req, now)

    def _send(self, req: Request, now: float) -> None:
        try:
            send_message(self._sockets[req.server], [pack_header(req.header)], req.frames, _NOBLOCK)
        except zmq.Again:
            pass  # the socket's queue is full: the timeout sends it again
        req.sent_at, req.resend_at = now, 0.0

    def _resend_due(self, inflight: list[dict[int, Request]], now: float) -> None:
        for i, per in enumerate(inflight):
            busy = [r for r in per.values() if r.resend_at and r.resend_at <= now]
            for req in busy:
                self._check_deadline(req, now)
                self._send(req, now)
            expired = [
                r for r in per.values() if not r.resend_at and now >= r.sent_at + self.timeout_s
            ]
            if not expired:
                continue
            worst = max(r.attempts for r in expired)
            if worst >= self.retries:
                # A fresh socket drops the queued messages, whose frames are the caller's
                # buffers (zero-copy): a server back later must not get them with new bytes.
                self._connect(i)
                raise PeerUnreachableError(
                    str(self.addresses[i]),
                    f"parameter server {self.addresses[i]} did not answer "
                    f"{len(expired)} request(s) within {self.timeout_s:g} s, "
                    f"{self.retries} retries each; is it running and reachable"
                    f"{' with these keys' if self.keys else ''}?",
                )
            self._connect(i)  # a fresh socket drops whatever the old one still queued
            self.resent += len(per)
            # in the order first sent (``per`` keeps it): not by number, which a wrap of the
            # numbers (a new random prefix, lower half the time) would reorder
            for req in list(per.values()):
                req.attempts += 1
                req.header = req.header._replace(flags=req.header.flags | RESEND)
                self._send(req, now)

    def _check_deadline(self, req: Request, now: float) -> None:
        if now - req.first_sent > self.timeout_s * (self.retries + 1):
            raise PeerUnreachableError(
                str(self.addresses[req.server]),
                f"parameter server {self.addresses[req.server]} stayed busy (full queues) for "
                f"{now - req.first_sent:.1f} s",
            )

    def _drain(self, i: int, inflight: list[dict[int, Request]]) -> None:
        sock = self._sockets[i]
        while True:
            # Once every request has its reply, stop without the failed receive that would say
            # so; but read a late duplicate that is already there (the poller would otherwise
            # report the socket readable again at once, while other servers are waited for).
            if not inflight[i] and not sock.getsockopt(zmq.EVENTS) & _POLLIN:
                return
            try:
                head = sock.recv(flags=zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            more = sock.getsockopt(zmq.RCVMORE)
            try:
                header = unpack_header(head)
            except WireError as exc:
                self._discard(sock, more)
                raise ProtocolError(f"server {self.addresses[i]} sent a bad header: {exc}") from exc
            req = inflight[i].get(header.seq)
            if req is None or header.type < MsgType.ACK:
                self._discard(sock, more)  # a late reply to a request already answered
                continue
            if header.type == MsgType.ERROR and header.code == ErrorCode.BUSY:
                self._discard(sock, more)
                req.resend_at = time.monotonic() + BUSY_PAUSE_S
                continue
            frames = self._receive_frames(sock, i, req, header, more)
            del inflight[i][header.seq]
            req.reply = header
            if req.on_reply is not None:
                req.on_reply(header, frames)

    def _receive_frames(self, sock, i: int, req: Request, header: Header, more: int) -> list:
        frames: list = []
        buffers = req.sink(header) if (req.sink and header.type == MsgType.DATA) else None
        while more:
            if buffers is not None and len(frames) < len(buffers):
                buf = buffers[len(frames)]
                n = sock.recv_into(buf)
                more = sock.getsockopt(zmq.RCVMORE)
                if n != memoryview(buf).nbytes:
                    self._discard(sock, more)
                    raise ProtocolError(
                        f"server {self.addresses[i]}: a reply frame of {n} bytes where "
                        f"{memoryview(buf).nbytes} were expected ({header})"
                    )
                frames.append(buf)
            else:
                frames.append(sock.recv(copy=False))
                more = sock.getsockopt(zmq.RCVMORE)
        if len(frames) != header.frames:
            raise ProtocolError(
                f"server {self.addresses[i]}: {len(frames)} frames after a header announcing "
                f"{header.frames} ({header.type.name})"
            )
        return frames

    @staticmethod
    def _discard(sock: zmq.Socket, more: int) -> None:
        while more:
            sock.recv(copy=False)
            more = sock.getsockopt(zmq.RCVMORE)
