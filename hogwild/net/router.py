"""The server side of the transport: a network thread with a ROUTER socket, and its repliers.

:class:`Router` binds one ROUTER socket (loopback unless CURVE keys are given:
:func:`hogwild.net.address.check_bind`) and runs the network thread. For every message it:

1. receives the client's identity and the header frame, and decodes it
   (:func:`hogwild.net.wire.unpack_header`: every field checked before it is used);
2. drops or re-answers a duplicate (a client's retry: :class:`hogwild.net.dedup.RequestWindow`),
   for the message types the handler names, of the handler's job (its ``job`` id, if it has
   one: another job's requests are refused by the handler and never fill the table);
3. receives the array frames: in place (ZeroMQ's own message buffers, no copy) or, when the
   handler provides buffers for them (:meth:`Handler.buffers`), straight into those
   (``recv_into``: one copy, e.g. into blocks of a :class:`hogwild.shm.pool.BufferPool`);
4. hands the request to the handler, which answers at once (a :class:`Reply`, whose ``then``
   the thread runs right after sending it: work the reply need not wait for) or later from
   another thread through a :class:`Replier`.

Whatever is wrong with a message (a malformed header, a frame count or size that does not match,
a request the handler refuses) gets an ``ERROR`` reply naming what was wrong, is counted by
error code, and the thread goes on serving. Repliers live in the handler's threads: each owns an
``inproc`` PUSH socket into the network thread, which routes the reply to the client that sent
the request (by sender id and incarnation, so that a client that re-sent from a fresh socket gets
the answer there) and records it for duplicates. Only the network thread touches the ROUTER.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import zmq

from hogwild.errors import HogwildError
from hogwild.net.address import Address, check_bind
from hogwild.net.auth import ServerSecurity, secure_server, sender_role
from hogwild.net.dedup import RequestWindow, Seen
from hogwild.net.send import send_message
from hogwild.net.wire import (
    DType,
    ErrorCode,
    Header,
    MsgType,
    WireError,
    pack_header,
    peek_request,
    unpack_header,
)

__all__ = [
    "Handler",
    "Incoming",
    "Replier",
    "Reply",
    "Router",
    "error_reply",
    "json_reply",
    "reply_hwm",
]

POLL_MS = 50
DRAIN = 256  # messages handled per socket before looking at the other one
MAX_ERROR_TEXT = 1000
MAX_ROUTES = 65536
REPLY_HWM = 1000
"""Replies that wait for one client at most by default (ZeroMQ's send high-water mark of the
ROUTER socket; a full pipe drops the reply, a client that reads retries it)."""
REPLY_BUDGET_BYTES = 128 * 2**20
"""Bytes of replies that may wait for one client that does not read: a server whose replies are
large takes :func:`reply_hwm` of them, not :data:`REPLY_HWM`."""
MIN_REPLY_HWM = 32  # at least this many, whatever their size: a client pipelines requests


def reply_hwm(largest_reply: int) -> int:
    """The send high-water mark that keeps replies of ``largest_reply`` bytes waiting for one
    client within :data:`REPLY_BUDGET_BYTES` (between :data:`MIN_REPLY_HWM` and
    :data:`REPLY_HWM`)."""
    fit = REPLY_BUDGET_BYTES // max(1, largest_reply)
    return max(MIN_REPLY_HWM, min(REPLY_HWM, fit))


_ids = itertools.count()
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)
_ERROR_NAMES = {int(c): c.name for c in ErrorCode}


# Refusals a retry of the same request may find otherwise: not remembered as its answer.
RETRY_AFRESH = frozenset(
    {
        ErrorCode.BUSY,
        ErrorCode.NOT_PRIMARY,
        ErrorCode.FENCED,
        ErrorCode.NEED_SYNC,
        ErrorCode.STOPPED,
        ErrorCode.READS_WAITING,
    }
)


@dataclass
class Incoming:
    """A received request: the client's identity, its checked header, its array frames."""

    identity: bytes
    header: Header
    frames: list
    received_at: float
    role: str | None = None  # the sender's role (its key's name in the roster); None: none


@dataclass
class Reply:
    """A reply the handler gives at once; ``then``, if given, is the handler's work that the
    network thread does right after sending it (the reply overlaps it on the wire)."""

    header: Header
    frames: Sequence = ()
    then: Callable[[], None] | None = None


class Handler(Protocol):
    """What a server plugs into the :class:`Router`."""

    dedup_types: frozenset[MsgType]
    receives_into_buffers: bool  # False: whole messages are received at once, frames in place

    def buffers(self, header: Header) -> list | None:
        """Writable buffers to receive the request's frames into, or None for in place."""

    def release(self, buffers: list) -> None:
        """Take back buffers from :meth:`buffers` whose request was refused."""

    def handle(self, request: Incoming) -> Reply | None:
        """Act on a request: a reply now, or None (a :class:`Replier` answers later).

        Raises:
            WireError: The request is refused; its ``code`` and message go back to the client.
        """

    def tick(self, now: float) -> None:
        """Called from the network thread about every :data:`POLL_MS` milliseconds."""


def error_reply(request: Header | None, code: ErrorCode, message: str) -> Reply:
    """An ``ERROR`` reply with ``code`` and ``message`` (UTF-8, cut to 1000 bytes)."""
    text = (message or code.name).encode("utf-8", "replace")[:MAX_ERROR_TEXT]
    base = request or Header(type=MsgType.ERROR)
    header = base.reply(
        MsgType.ERROR, code=int(code), dtype=DType.UINT8, shape=(len(text),), frames=1
    )
    return Reply(header, [text])


def json_reply(request: Header, data: dict) -> Reply:
    """A ``JSON`` reply to ``request``: ``data`` as one compact UTF-8 frame."""
    text = json.dumps(data, separators=(",", ":")).encode("utf-8")
    header = request.reply(MsgType.JSON, dtype=DType.UINT8, shape=(len(text),), frames=1)
    return Reply(header, [text])


class Replier:
    """A handler thread's way to answer: ``send`` goes through the network thread."""

    def __init__(self, context: zmq.Context, endpoint: str) -> None:
        self._socket = context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 0)  # never drop or block a reply while the router lives
        self._socket.connect(endpoint)

    def send(self, header: Header, frames: Sequence = ()) -> None:
        try:
            send_message(self._socket, [pack_header(header)], frames, zmq.NOBLOCK)
        except zmq.Again:
            pass  # the network thread is gone (shutting down): the client will retry

    def close(self) -> None:
        self._socket.close(linger=0)


def _bound_file(address: Address) -> tuple[str, int, int] | None:
    """The file a bind to an ipc ``address`` made (absolute path, device, inode); None for
    other transports, an abstract socket (``@name``) or a wildcard (``*``: ZeroMQ names it)."""
    if address.transport != "ipc" or address.host.startswith("@") or address.host == "*":
        return None
    path = os.path.abspath(address.host)
    try:
        found = os.stat(path)
    except OSError:
        return None
    return path, found.st_dev, found.st_ino


class Router:
    """A ROUTER socket served by a network thread.

    Args:
        address: Where to bind (port 0: a free port, see :attr:`address` after :meth:`start`).
        handler: What acts on requests.
        keys: A CURVE key directory (required beyond loopback).
        max_frame_bytes: Frames larger than this make ZeroMQ drop the connection.
        reply_hwm: Replies waiting for one client at most (:data:`REPLY_HWM`; see
            :func:`reply_hwm` for servers of large replies).
    """

    def __init__(
        self,
        address: Address,
        handler: Handler,
        *,
        keys: str | None = None,
        max_frame_bytes: int = 64 * 2**20 + 4096,
        reply_hwm: int = REPLY_HWM,
    ) -> None:
        check_bind(address, keys)
        self.address, self.handler, self.keys = address, handler, keys or None
        self.context = zmq.Context()
        self._reply_endpoint = f"inproc://hogwild-replies-{next(_ids)}"
        self._router = self.context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a full pipe drops, never blocks
        self._router.setsockopt(zmq.SNDHWM, reply_hwm)
        self.reply_hwm = reply_hwm
        self._security: ServerSecurity | None = None
        self._roles = False  # a roster's server: every header's sender role is read
        self._socket_file: tuple[str, int, int] | None = None  # ipc: path, device, inode
        self._pull = self.context.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.bind(self._reply_endpoint)
        self.window = RequestWindow()
        self._routes: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None
        self.survived = 0  # failures that escaped a message's handling (counted, not fatal)
        self._said_at = -1.0
        self.received = 0
        self.errors: Counter[str] = Counter()

    def start(self) -> Address:
        """Bind and start the network thread; the bound address (the real port if it was 0)."""
        try:
            if self.keys:
                self._security = secure_server(self.context, self._router, self.keys)
                self._roles = self._security.roles
            if self.address.transport == "tcp" and self.address.port == 0:
                host = self.address.endpoint.rpartition(":")[0]  # tcp://HOST or tcp://[V6]
                port = self._router.bind_to_random_port(host)
                self.address = self.address.with_port(port)
            else:
                self._router.bind(self.address.endpoint)
                self._socket_file = _bound_file(self.address)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise HogwildError(f"cannot listen on {self.address}: {exc}") from exc
        self._thread = threading.Thread(target=self._run, name="hogwild-net", daemon=True)
        self._thread.start()
        return self.address

    def replier(self) -> Replier:
        """A new replier (one per thread; close it before :meth:`stop`)."""
        return Replier(self.context, self._reply_endpoint)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the network thread and close its sockets (the port is free afterwards)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._close_sockets()

    def close(self) -> None:
        """After :meth:`stop` and once every replier is closed: end the ZeroMQ context."""
        self._close_sockets()
        if not self.context.closed:
            self.context.term()

    def _close_sockets(self) -> None:
        for sock in (self._router, self._pull):
            if not sock.closed:
                sock.close(linger=0)
        if self._security is not None:
            self._security.close()
            self._security = None
        if self._socket_file is not None:
            # ZeroMQ leaves a bound ipc endpoint's file behind: without this every server
            # started on ipc would leave one in /tmp (or wherever its address points). Only
            # our own file goes: a later bind to the same path replaces it with another.
            path, device, inode = self._socket_file
            self._socket_file = None
            with contextlib.suppress(OSError):
                found = os.stat(path)
                if (found.st_dev, found.st_ino) == (device, inode):
                    os.unlink(path)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ the network thread

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                try:
                    events = dict(poller.poll(POLL_MS))
                    if self._pull in events:
                        self._forward_replies()
                    if self._router in events:
                        self._serve_requests()
                    self.handler.tick(time.monotonic())
                except zmq.ContextTerminated:
                    raise
                except Exception as exc:  # noqa: BLE001 - nothing a message causes ends the thread
                    self._survive(exc)
        except BaseException as exc:  # noqa: BLE001 - reported through .failure and status
            self.failure = exc
            raise

    def _survive(self, exc: Exception) -> None:
        """A failure that escaped a message's handling (a handler's bug, a reply that cannot be
        encoded): counted as ``INTERNAL``, said on stderr (at most once a second), and the rest
        of a half-received message dropped so the next receive starts at a message's start."""
        self.errors[ErrorCode.INTERNAL.name] += 1
        self.survived += 1
        now = time.monotonic()
        if now - self._said_at >= 1.0:
            self._said_at = now
            print(f"hogwild: network thread: {type(exc).__name__}: {exc} (counted; serving on)",
                  file=sys.stderr)  # fmt: skip
        with contextlib.suppress(zmq.ZMQError):
            self._discard(self._router.getsockopt(_RCVMORE))

    def _forward_replies(self) -> None:
        for _ in range(DRAIN):
            try:
                parts = self._pull.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            head = parts[0].bytes
            try:
                header = unpack_header(head)  # ours: built by pack_header
            except WireError as exc:  # a handler's bug (a non-finite scalar): the client learns
                request = peek_request(head)
                if request is None:
                    raise
                failed = error_reply(request, ErrorCode.INTERNAL, f"the server's reply: {exc}")
                header, parts = failed.header, [None, *failed.frames]
                head = pack_header(header)
            identity = self._routes.get((header.sender, header.seq >> 32))
            if header.type == MsgType.ERROR:
                self.errors[_ERROR_NAMES.get(header.code, str(header.code))] += 1
            self._record(header, head, parts[1:])
            if identity is not None:
                send_message(self._router, [identity, head], parts[1:])

    def _record(self, header: Header, head: bytes, frames: Sequence) -> None:
        """Keep small replies (acknowledgements, errors) to answer a retry with; forget the rest,
        and the refusals that a retry may find changed (busy; not, or not yet, the primary)."""
        if header.type == MsgType.ERROR and header.code in RETRY_AFRESH:
            self.window.finish(header.sender, header.seq, None)  # its retry is a new request
        elif header.type in (MsgType.ACK, MsgType.ERROR):
            reply = [head, *(bytes(memoryview(f)) for f in frames)]
            self.window.finish(header.sender, header.seq, reply)
        else:
            self.window.finish(header.sender, header.seq, None)

    def _reply(self, identity: bytes, reply: Reply) -> None:
        header = reply.header
        try:
            head = pack_header(header)
        except WireError as exc:  # a handler's bug: a field that does not fit its slot
            try:
                reply = error_reply(header, ErrorCode.INTERNAL, f"the server's reply: {exc}")
                head = pack_header(reply.header)
            except WireError:  # the request's own fields do not fit: an unnumbered error
                reply = error_reply(None, ErrorCode.INTERNAL, f"the server's reply: {exc}")
                head = pack_header(reply.header)
            header = reply.header
        if header.type == MsgType.ERROR:
            self.errors[_ERROR_NAMES.get(header.code, str(header.code))] += 1
        self._record(header, head, reply.frames)
        send_message(self._router, [identity, head], reply.frames)

    def _serve_requests(self) -> None:
        sock, whole = self._router, not getattr(self.handler, "receives_into_buffers", False)
        for n in range(DRAIN):
            if n and not sock.getsockopt(zmq.EVENTS) & _POLLIN:
                return  # cheaper than the zmq.Again of a receive that finds nothing
            # The identity and the header as bytes (no zmq.Frame objects for a few bytes); the
            # array frames in place at once, unless they go into the handler's buffers.
            try:
                identity = sock.recv(_NOBLOCK)
            except zmq.Again:
                return
            self.received += 1
            if not sock.getsockopt(_RCVMORE):
                continue  # an identity alone: nothing to answer
            role = None
            if self._roles:  # the header as a frame, which carries its sender's authenticated role
                frame = sock.recv(copy=False)
                head, role = frame.bytes, sender_role(frame)
            else:
                head = sock.recv()
            more = sock.getsockopt(_RCVMORE)
            try:
                header = unpack_header(head)
            except WireError as exc:
                self._discard(more)
                self._reply(identity, error_reply(peek_request(head), exc.code, str(exc)))
                continue
            if header.type in self.handler.dedup_types and header.job == self._job(header.job):
                seen, cached = self.window.check(header.sender, header.seq)
                route = (header.sender, header.seq >> 32)
                self._routes[route] = identity
                self._routes.move_to_end(route)
                if len(self._routes) > MAX_ROUTES:
                    self._routes.popitem(last=False)
                if seen is not Seen.NEW:
                    self._discard(more)
                    if seen is Seen.DONE and cached is not None:
                        sock.send_multipart([identity, *cached])
                    continue
            got = []
            if whole:  # frame by frame, after the header: none kept beyond those it announced
                while more and len(got) < header.frames:
                    got.append(sock.recv(copy=False))
                    more = sock.getsockopt(_RCVMORE)
                if more:
                    self._discard(more)
                    problem = (f"more than {len(got)} frame(s) after the header, which announced "
                               f"{header.frames} ({header.type.name})")  # fmt: skip
                    self._reply(identity, error_reply(header, ErrorCode.BAD_FRAMES, problem))
                    continue
            self._receive_and_handle(identity, header, got, more, role)

    def _job(self, job: int) -> int:
        """The handler's job id (its ``job`` attribute), or ``job`` itself for a handler that
        names none: a request of another job never enters the request table or the routes."""
        return getattr(self.handler, "job", job)

    def _receive_and_handle(
        self, identity: bytes, header: Header, got: list, more: int, role: str | None = None
    ) -> None:
        buffers = None
        if more:  # the frames are still in the socket: into the handler's buffers, or in place
            try:
                buffers = self.handler.buffers(header)
            except WireError as exc:
                self._discard(more)
                self._reply(identity, error_reply(header, exc.code, str(exc)))
                return
            except Exception as exc:  # noqa: BLE001 - a bug must not stop the server: report it
                self._discard(more)
                self._reply(identity, error_reply(header, ErrorCode.INTERNAL, repr(exc)))
                return
            frames, more, problem = self._receive_frames(header, buffers, more)
        else:
            frames, problem = got, ""
            if len(got) != header.frames:
                problem = (
                    f"{len(got)} frame(s) after the header, which announced {header.frames} "
                    f"({header.type.name})"
                )
        if problem:
            self._discard(more)
            if buffers:
                self.handler.release(buffers)
            self._reply(identity, error_reply(header, ErrorCode.BAD_FRAMES, problem))
            return
        try:
            reply = self.handler.handle(Incoming(identity, header, frames, time.monotonic(), role))
        except WireError as exc:
            if buffers:
                self.handler.release(buffers)
            reply = error_reply(header, exc.code, str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug must not stop the server: report it
            if buffers:
                self.handler.release(buffers)
            reply = error_reply(header, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        if reply is not None:
            try:
                self._reply(identity, reply)
            finally:
                if reply.then is not None:
                    self._after_reply(reply.then)

    def _after_reply(self, then: Callable[[], None]) -> None:
        """The handler's work after its reply went out. It can no longer be answered with an
        error: a failure is counted as INTERNAL and said on stderr, and the thread goes on."""
        try:
            then()
        except Exception as exc:  # noqa: BLE001 - a bug must not stop the server: report it
            self.errors[ErrorCode.INTERNAL.name] += 1
            print(f"hogwild: work after a reply failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr)  # fmt: skip

    def _receive_frames(self, header: Header, buffers, more: int) -> tuple[list, int, str]:
        sock, frames = self._router, []
        while more and len(frames) < header.frames:
            if buffers is not None:
                buf = buffers[len(frames)]
                n, want = sock.recv_into(buf), memoryview(buf).nbytes
                if n != want:
                    problem = f"frame {len(frames) + 1}: {n} bytes, expected {want}"
                    return frames, sock.getsockopt(zmq.RCVMORE), problem
                frames.append(buf)
            else:
                frames.append(sock.recv(copy=False))
            more = sock.getsockopt(zmq.RCVMORE)
        if more or len(frames) != header.frames:
            got = f"more than {len(frames)}" if more else str(len(frames))
            problem = (
                f"{got} frame(s) after the header, which announced {header.frames} "
                f"({header.type.name})"
            )
            return frames, more, problem
        return frames, 0, ""

    def _discard(self, more: int) -> None:
        while more:
            self._router.recv(copy=False)
            more = self._router.getsockopt(zmq.RCVMORE)
