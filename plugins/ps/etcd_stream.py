"""The watch's stream: etcd's own watch, heard over a kept HTTP(S) connection of its own.

:class:`~hogwild_plugins.ps.etcd_watch.Watch` polls one small range request to see that keys under a
prefix changed. Polled every 50 ms, that is 20 requests a second from every replicated parameter
server for as long as it lives (each about 1.2-1.6 ms of etcd's CPU), and still up to 50 ms
late. etcd can say so itself: its JSON gateway's ``POST /v3/watch`` answers with a chunked
response that stays open and carries one JSON object per line, ``{"result": {"header": ...,
"created": true}}`` first, then ``{"result": {"header": ..., "events": [...]}}`` as keys change.
:class:`WatchStream` holds such a stream open from a thread of its own and says at once that
something changed (``on_event``); the watch then polls only slowly, as the safety net that sees
any net change even if the stream died silently (a member cut off from us: its stream hangs with
no error, and only a poll's timeout notices).

etcd3gw's own streaming watch is not used: it opens without a timeout, parses the response's
chunks as if each were one whole message, and loses its errors in a thread. Here the request
and the response's head have the client's timeout; the body is read as bytes, split into lines
(a message may span chunks, and a chunk hold several), each at most :data:`MESSAGE_LIMIT` bytes,
and every field read is checked. A message that is not what etcd sends, an ``error`` object from
the gateway, or a watch that etcd cancelled for a reason other than compaction goes to
``on_error`` (once until a stream is created again) and the stream is opened again; a stream
that ends, or cannot be opened (refused, timed out, a member answering with an error status),
is opened again after a back-off (:data:`BACKOFF_S` doubling up to :data:`BACKOFF_MAX_S`, reset
only by a stream that served :data:`LIVED_S`; a gateway with no watch, 404, logged once), on the
member that :meth:`~hogwild_plugins.ps.etcd_poll.RangePoller.post` last reached (``member()``),
and logged only: the polls, which run at their fast interval while no stream is up, are what
report an unreachable etcd. Every stream created after the first calls ``on_event`` (changes
may have been missed while none was up); the first asks for the changes from ``start_revision``
on, the revision after the watch's first reading, so none made in between is missed.

:meth:`WatchStream.close` shuts the stream's socket down (which unblocks its reader at once) and
joins the thread; :meth:`WatchStream.restart` shuts it down to have it opened again (on the member
the polls now reach). The socket is registered before its connect and TLS handshake, so both can be
cut short; it keeps TCP keepalive on (:data:`KEEPALIVE`), since a quiet stream sends nothing and a
flow that died silently would otherwise look up forever. The thread owns its connection and
closes it on every exit path; ``on_down`` tells the watch that a stream that was up ended.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable

from hogwild_plugins.ps.etcd_errors import gateway_error
from hogwild_plugins.ps.etcd_keys import b64 as _b64

from hogwild.errors import HogwildError
from hogwild.net.address import parse_address

__all__ = [
    "BACKOFF_MAX_S",
    "BACKOFF_S",
    "KEEPALIVE",
    "LIVED_S",
    "MESSAGE_LIMIT",
    "STREAM_REQUESTS",
    "WatchStream",
    "next_backoff",
]

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 4 << 20
"""The most bytes of one message (a line of the stream): etcd takes requests of up to 1.5 MiB,
so one revision's events, base64 and all, fit; a message larger is refused (an error reported,
the stream opened again from the current revision, a change reported)."""
BACKOFF_S = 0.1
"""The wait before opening a stream again after one ended or could not be opened."""
BACKOFF_MAX_S = 5.0
"""The longest such wait: each failure in a row doubles it (a restart asked for does not); a stream
that lived :data:`LIVED_S` resets it."""
LIVED_S = 5.0
"""How long a stream must have been up for its end to reset the back-off: one that a member or a
proxy closes soon after creating it (one capping streams' lifetime or number) is opened again
ever more slowly, not ten times a second, each creation costing a poll and ``on_change()``."""
KEEPALIVE = ((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),) + tuple(
    (socket.IPPROTO_TCP, getattr(socket, name), value)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))
    if hasattr(socket, name)  # Linux's; elsewhere the system's own keepalive times
)
"""TCP keepalive on the stream's socket, as ``(level, option, value)``: a
quiet stream sends nothing for minutes, so a flow a NAT or firewall forgot, or a peer gone without
its FIN, is found within about 25 s (10 s idle, then 3 probes 5 s apart) and the stream reopened."""
STREAM_REQUESTS = 4
"""The most requests, each up to the timeout, that opening a stream waits on before :meth:`close`
can cut it short: the member's API path (etcd3gw's, asked once), the connection (with its TLS
handshake), the request, and the response's head."""
EVENT_TYPES = frozenset({"PUT", "DELETE"})  # the gateway leaves out PUT, the enum's zero


class StreamError(HogwildError):
    """The stream said something etcd does not say, or etcd cancelled it: reported, reopened."""


class _Ended(Exception):
    """The stream ended or could not be opened: opened again after a back-off, not reported."""


class WatchStream:
    """A thread holding etcd's watch of the keys in ``[key, range_end)`` open.

    Args:
        members: The members' client addresses (``HOST:PORT``).
        api_path: Member ``i``'s gateway path (such as ``/v3/``), as the polls have it.
        timeout_s: The limit of each step of opening a stream (:data:`STREAM_REQUESTS`).
        key, range_end: The watched range, raw bytes (as the range request's, unencoded).
        start_revision: The first revision the first stream reports the changes of (None:
            from the current one).
        member: The member to open the stream on (the one the polls reach now).
        on_event: Called from the thread when the stream reports a change, and when a stream
            is created after the first; it must not block.
        on_error: Called from the thread with a :class:`StreamError`, once until a stream is
            created again; it must not block.
        on_down: Called from the thread when a stream that was up ended (None: nothing), so that
            the polls go fast at once.
        tls: The HTTPS context (the client's certificate, the CA it trusts), or None.
    """

    def __init__(
        self,
        members: list[str],
        api_path: Callable[[int], str],
        timeout_s: float,
        key: bytes,
        range_end: bytes,
        start_revision: int | None,
        member: Callable[[], int],
        on_event: Callable[[], None],
        on_error: Callable[[Exception], None],
        tls: ssl.SSLContext | None = None,
        on_down: Callable[[], None] | None = None,
    ) -> None:
        if start_revision is not None and start_revision < 1:
            raise HogwildError(f"etcd watch stream: start revision {start_revision!r}: expected 1+")
        self.members, self.api_path, self.timeout_s, self.tls = members, api_path, timeout_s, tls
        self._key, self._range_end, self._start = key, range_end, start_revision
        self._member, self._on_event, self._on_error = member, on_event, on_error
        self._on_down = on_down
        self._created_at = 0.0  # when the stream now up was created (monotonic)
        self._no_stream: set[str] = set()  # members whose gateway has no watch (logged once)
        self.up = False  # a stream is created and open: the polls may be slow
        self.on: int | None = None  # the member the stream is opened on, or being opened on
        self.created = 0  # how many streams were created (each after the first reports)
        self._stop = threading.Event()
        self._again = threading.Event()  # a restart asked for: cut the back-off short
        self._lock = threading.Lock()  # the socket in use, against close()/restart()
        self._socket: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name="hogwild-etcd-stream", daemon=True)

    def start(self) -> WatchStream:
        self._thread.start()
        return self

    @property
    def active(self) -> bool:
        return self._thread.is_alive()

    def restart(self) -> None:
        """Have the stream opened again, now, on the member ``member()`` names then."""
        self._again.set()
        self._shut()

    def stop(self) -> None:
        """Have the thread end soon: its stream's socket shut down, its back-off cut short."""
        self._stop.set()
        self._again.set()
        self._shut()

    def close(self) -> None:
        """End the thread (:meth:`stop`); returns once it has ended, within
        :data:`STREAM_REQUESTS` timeouts (opening a stream) and a second."""
        self.stop()
        if threading.current_thread() is not self._thread and self._thread.ident is not None:
            self._thread.join(STREAM_REQUESTS * self.timeout_s + 1.0)

    def _shut(self) -> None:
        with self._lock:
            if self._socket is not None:
                try:  # the plain socket's shutdown (not TLS's unwrap): the reader wakes with EOF
                    socket.socket.shutdown(self._socket, socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by its peer

    # -- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        backoff, reported = BACKOFF_S, False
        while not self._stop.is_set():
            self._again.clear()
            i = self.on = self._member()
            created, failed = self.created, None
            try:
                self._stream(i)
            except StreamError as err:
                failed = err
            except _Ended as ended:
                log.debug("etcd watch stream at %s: %s", self.members[i], ended)
            except Exception as err:  # noqa: BLE001 - a bug here must not end the watch
                log.exception("etcd watch stream at %s failed", self.members[i])
                failed = err
            finally:
                self.up = False
            was_up = self.created > created
            if was_up and self._on_down is not None and not self._stop.is_set():
                self._on_down()  # no stream now: the polls go fast at once, not after a slow wait
            if failed is not None and (was_up or not reported) and not self._stop.is_set():
                self._report(failed)
            reported = failed is not None or (reported and not was_up)
            lived = time.monotonic() - self._created_at if was_up else 0.0
            backoff = next_backoff(backoff, lived, failed is not None)
            if not self._again.wait(backoff):  # a restart asked for cuts it short, undoubled
                backoff = min(2 * backoff, BACKOFF_MAX_S)

    def _stream(self, i: int) -> None:
        """Open a stream on member ``i`` and read it until it ends (returns or raises)."""
        member = self.members[i]
        parsed = parse_address(member)
        try:
            path = self.api_path(i) + "watch"
        except Exception as err:  # noqa: BLE001 - etcd3gw's, from its /version request
            raise _Ended(f"no API path: {type(err).__name__}: {err}"[:400]) from err
        connection = http.client.HTTPConnection(parsed.host, parsed.port, timeout=self.timeout_s)
        try:
            # the socket is made here and registered before its connect and TLS handshake, so
            # that close() and restart() can cut those short too (http.client's connect() would
            # hold it out of reach until both were done)
            sock = self._connect(parsed.host, parsed.port)
            connection.sock = sock  # http.client sends on it (and closes it with itself)
            request = {"key": _b64(self._key), "range_end": _b64(self._range_end)}
            if self.created == 0 and self._start is not None:  # from the first reading on
                request["start_revision"] = self._start
            body = json.dumps({"create_request": request}).encode()
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            answer = connection.getresponse()
            if answer.status != 200:
                text = answer.read(1 << 12).decode("utf-8", "replace")
                detail = (gateway_error(answer.status, text) or (False, text))[1]
                if answer.status in (404, 405) and member not in self._no_stream:
                    self._no_stream.add(member)  # once per member: an operator should know
                    log.warning(
                        "etcd at %s has no watch stream (HTTP %d): polling every %s",
                        member, answer.status, "interval_s (50 ms) instead",
                    )  # fmt: skip
                raise _Ended(f"answered HTTP {answer.status}: {detail}"[:400])
            # our own socket, not connection.sock: that is None once a "Connection: close"
            # answer was read
            sock.settimeout(None)  # a quiet stream is no failure: the polls and keepalive watch
            self._read(member, answer)
        except (OSError, http.client.HTTPException) as err:  # refused, timed out, cut, shut
            raise _Ended(f"{type(err).__name__}: {err}"[:400]) from err
        finally:
            with self._lock:
                closing, self._socket = self._socket, None
            connection.close()
            if closing is not None:
                closing.close()

    def _connect(self, host: str, port: int) -> socket.socket:
        """A connected socket to ``host:port`` (TLS-wrapped and shaken hands with where the
        stream is over HTTPS), registered for :meth:`_shut` before any blocking step."""
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(
                    sock, server_hostname=host, do_handshake_on_connect=False
                )
            sock.settimeout(self.timeout_s)
            for level, option, value in KEEPALIVE:
                sock.setsockopt(level, option, value)
            with self._lock:  # from here on close() and restart() can cut it short
                if self._stop.is_set() or self._again.is_set():
                    raise _Ended("closed")
                self._socket = sock
            sock.connect(address)  # a shutdown aborts it (or, just before it, the check below)
            if self.tls is not None:
                sock.do_handshake()  # a shutdown wakes its read with EOF
            if self._stop.is_set() or self._again.is_set():
                raise _Ended("closed")
        except BaseException:
            with self._lock:
                self._socket = None
            sock.close()
            raise
        return sock

    def _read(self, member: str, answer: http.client.HTTPResponse) -> None:
        """Read the messages of an open stream until it ends."""
        pending = b""
        while not self._stop.is_set():
            data = answer.read1(1 << 16)
            if not data:
                raise _Ended("the stream ended")
            if b"\n" not in data:  # a long message's middle: nothing to split yet
                pending += data
                lines = []
            else:
                *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                if line.strip():
                    self._message(member, line)
            if len(pending) > MESSAGE_LIMIT:
                raise StreamError(
                    f"etcd at {member}: watch stream message of more than {MESSAGE_LIMIT} bytes"
                )

    def _message(self, member: str, line: bytes) -> None:
        """Act on one message, checked field by field."""
        where = f"etcd at {member}: watch stream"
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as err:  # RecursionError: nested too deep
            raise StreamError(f"{where}: message is not JSON ({err}): {line!r:.200}") from None
        if isinstance(message, dict) and "error" in message:
            raise StreamError(f"{where}: the gateway's error {message['error']!r:.300}")
        result = message.get("result") if isinstance(message, dict) else None
        if not isinstance(result, dict) or not isinstance(result.get("header"), dict):
            raise StreamError(f"{where}: message {message!r:.200} is no watch response")
        created, canceled = result.get("created", False), result.get("canceled", False)
        events = result.get("events", [])
        if not isinstance(created, bool) or not isinstance(canceled, bool):
            raise StreamError(f"{where}: created/canceled not booleans in {result!r:.200}")
        if not isinstance(events, list):
            raise StreamError(f"{where}: events {events!r:.200} is no list")
        if canceled:
            if _revision(result.get("compact_revision"), where) > 0:  # history compacted
                self._start = None  # the next stream from the current revision, and meanwhile
                self._on_event()  # a change reported: the compacted ones are unknown
                raise _Ended("cancelled: its start revision was compacted")
            raise StreamError(f"{where}: cancelled: {result.get('cancel_reason')!r:.200}")
        if created:
            if self.up:
                raise StreamError(f"{where}: a second 'created' on one stream")
            self.up, self._created_at = True, time.monotonic()
            self.created += 1
            if self.created > 1:  # changes may have been missed while no stream was up
                self._on_event()
            return
        if not self.up:
            raise StreamError(f"{where}: message {result!r:.200} before 'created'")
        for event in events:
            self._check_event(event, where)
        if events:
            self._on_event()

    def _check_event(self, event, where: str) -> None:
        kv = event.get("kv") if isinstance(event, dict) else None
        if not isinstance(kv, dict) or event.get("type", "PUT") not in EVENT_TYPES:
            raise StreamError(f"{where}: event {event!r:.200} is no PUT or DELETE of a key")
        try:
            key = base64.b64decode(kv.get("key", ""), validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise StreamError(f"{where}: event key {kv.get('key')!r:.100} is not base64") from None
        if not (self._key <= key and (self._range_end == b"\0" or key < self._range_end)):
            raise StreamError(f"{where}: event for key {key!r:.100}, outside the watched range")
        if _revision(kv.get("mod_revision"), where) < 1:
            raise StreamError(f"{where}: event {event!r:.200} has no mod_revision")

    def _report(self, err: Exception) -> None:
        try:
            self._on_error(err)
        except Exception:  # noqa: BLE001
            log.exception("etcd watch stream: on_error failed")


def next_backoff(backoff: float, lived_s: float, failed: bool) -> float:
    """The wait before opening a stream again, after one that was up for ``lived_s`` seconds (0:
    none was created) ended, with an error (``failed``) or not: the back-off goes back to
    :data:`BACKOFF_S` only after a stream that served :data:`LIVED_S` and ended cleanly; else it
    stays (the caller doubles it after waiting it out)."""
    return BACKOFF_S if lived_s >= LIVED_S and not failed else backoff


def _revision(value, where: str) -> int:
    """A revision as the gateway writes it (a decimal string; absent: 0)."""
    if value is None:
        return 0
    try:
        if isinstance(value, bool):
            raise TypeError
        return int(value)
    except (TypeError, ValueError):
        raise StreamError(f"{where}: revision {value!r:.50} is no integer") from None
