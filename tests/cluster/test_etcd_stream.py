"""The watch's stream of etcd's own watch (:mod:`hogwild_plugins.ps.etcd_stream`), against a real
etcd on loopback, reached directly or through a TCP relay of the test's own that can cut every
connection, and against a tiny real HTTP server standing in for a member whose stream says what
etcd never does or stays silent: a change is heard from the stream long before the slow poll
could have seen it, a first stream reports the changes made since the first reading, a cut
stream falls back to the fast polls and comes back (reporting a change, since some may have been
missed), a malformed message is reported and the watch goes on, and cancel() ends a watch whose
stream is blocked in its read."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time

import pytest
from hogwild_plugins.ps.etcd import Etcd
from hogwild_plugins.ps.etcd_stream import (
    BACKOFF_S,
    LIVED_S,
    StreamError,
    WatchStream,
    next_backoff,
)

from tests.cluster.test_etcd_poll import FakeGatewayHandler, LoopbackGateway

pytestmark = pytest.mark.kernel_free

WAIT_S = 10.0  # the most a test waits for what should take well under a second
SLOW_S = 30.0  # the polls' interval while a stream is up: a change heard sooner is the stream's


def wait_for(condition, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return bool(condition())


class Relay:
    """A TCP relay on loopback to ``target`` (``HOST:PORT``); :meth:`cut` closes every
    connection it carries, as a member restarting or a broken link does, and
    :meth:`silence_streams` drops every byte of the watch streams open now, both ways, their
    connections left open, as a NAT that forgot a quiet flow does."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = []
        self._flows: list[dict] = []  # per connection: whether it carries a stream, is silenced
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:  # closed
                return
            far = socket.create_connection(self._target)
            flow = {"stream": False, "silent": False}
            with self._lock:
                self._sockets += [near, far]
                self._flows.append(flow)
                for source, sink in ((near, far), (far, near)):
                    pump = threading.Thread(target=_pump, args=(source, sink, flow), daemon=True)
                    pump.start()
                    self._threads.append(pump)

    def cut(self) -> None:
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            self._sockets.clear()

    def silence_streams(self) -> None:
        with self._lock:
            for flow in self._flows:
                flow["silent"] = flow["stream"]

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        self._listener.close()
        self._accepting.join(WAIT_S)
        self.cut()
        for pump in self._threads:
            pump.join(WAIT_S)


def _pump(source: socket.socket, sink: socket.socket, flow: dict) -> None:
    try:
        while data := source.recv(1 << 16):
            flow["stream"] = flow["stream"] or b"/watch " in data  # its request line
            if not flow["silent"]:
                sink.sendall(data)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def test_a_change_is_heard_from_the_stream_and_a_cut_stream_comes_back(etcd: Etcd) -> None:
    relay = Relay(etcd.members[0])
    client = Etcd(relay.address, prefix=etcd.prefix, timeout_s=2.0)
    changes, errors = [], []
    changed = threading.Event()

    def on_change() -> None:
        changes.append(time.monotonic())
        changed.set()

    try:
        watch = client.watch("map/", on_change, slow_interval_s=SLOW_S, on_error=errors.append)
        assert wait_for(lambda: watch.streaming)
        etcd.put("other", {"outside": "the watched prefix"})
        etcd.put("map/0", {"primary": "a"})  # only the stream can tell within the slow interval
        assert changed.wait(WAIT_S)
        assert len(changes) == 1  # the key outside the prefix was no change

        relay.cut()  # the stream (and the polls' kept connection) cut from under the watch
        assert wait_for(lambda: len(changes) == 2)  # a new stream: changes may have been missed
        assert wait_for(lambda: watch.streaming)
        changed.clear()
        etcd.put("map/0", {"primary": "b"})
        assert changed.wait(WAIT_S)
        watch.cancel()
        assert not watch.active and errors == [], errors
    finally:
        client.close()
        relay.close()


def test_a_silently_dead_stream_is_found_by_the_polls_and_opened_again(etcd: Etcd, caplog) -> None:
    relay = Relay(etcd.members[0])
    client = Etcd(relay.address, prefix=etcd.prefix, timeout_s=2.0)
    changes, errors = [], []
    try:
        watch = client.watch("map/", lambda: changes.append(1), slow_interval_s=0.2,
                             on_error=errors.append)  # fmt: skip
        assert wait_for(lambda: watch.streaming)
        relay.silence_streams()  # the stream's flow dead, its socket open, the polls' alive
        etcd.put("map/0", {"primary": "a"})
        assert wait_for(lambda: changes)  # seen by a safety poll
        # the next poll finds the stream still silent about it: a new stream, on a new flow
        assert wait_for(lambda: watch._stream.created == 2 and watch.streaming)
        assert [r for r in caplog.records if "missed a change" in r.getMessage()]
        before = len(changes)
        etcd.put("map/0", {"primary": "b"})
        assert wait_for(lambda: len(changes) > before)
        watch.cancel()
        assert not watch.active and errors == [], errors
    finally:
        client.close()
        relay.close()


def test_the_first_stream_reports_the_changes_since_the_first_reading_or_that_some_were_lost(
    etcd: Etcd,
) -> None:
    _, revision = etcd.get_prefix("")
    etcd.put("k", {"v": 1})  # after the reading, before the stream
    heard, errors = threading.Event(), []
    start = etcd.prefix.encode()
    end = start[:-1] + bytes([start[-1] + 1])
    stream = WatchStream(
        etcd.members, lambda i: etcd._clients[i].api_path, 2.0, start, end, revision + 1,
        lambda: 0, heard.set, errors.append,
    ).start()  # fmt: skip
    try:
        assert heard.wait(WAIT_S) and stream.up and stream.created == 1 and errors == []
    finally:
        stream.close()
    assert not stream.active

    # a first reading whose revision etcd compacted since: a change reported, and a stream from
    # the current revision on (not one refused again and again)
    latest = etcd.put("k", {"v": 2})
    etcd._post("/kv/compaction", {"revision": latest})
    heard.clear()
    stream = WatchStream(
        etcd.members, lambda i: etcd._clients[i].api_path, 2.0, start, end, revision + 1,
        lambda: 0, heard.set, errors.append,
    ).start()  # fmt: skip
    try:
        assert heard.wait(WAIT_S) and wait_for(lambda: stream.up and stream.created == 2)
        for value in range(3):  # heard from one stream, which stays up
            heard.clear()
            etcd.put("k", {"v": value})
            assert heard.wait(WAIT_S)
        assert stream.up and stream.created == 2 and errors == []
    finally:
        stream.close()


class StreamGateway(LoopbackGateway):
    """An HTTP server on loopback answering range requests with one fixed reply and each watch
    with a chunked stream of the next lines of ``streams`` (a list of line lists), held open
    afterwards until the client closes it or the gateway is closed."""

    RANGE = json.dumps({"header": {"revision": "5"}, "count": "0"}).encode()

    def __init__(self, streams: list[list[bytes]]) -> None:
        self.streams, self.opened = streams, 0
        self.ended = threading.Event()  # set when a held stream's client went away
        self._closing = threading.Event()
        gateway = self

        class Handler(FakeGatewayHandler):
            def do_GET(self) -> None:
                self._answer(200, b'{"etcdserver":"3.4.23","etcdcluster":"3.4.0"}')

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                if not self.path.endswith("/watch"):
                    self._answer(200, gateway.RANGE)
                    return
                lines = gateway.streams[min(gateway.opened, len(gateway.streams) - 1)]
                gateway.opened += 1
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for line in lines:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line) + 1, line + b"\n"))
                    self.wfile.flush()
                self.connection.settimeout(0.05)
                while not gateway._closing.is_set():  # held open, as a quiet stream is
                    try:
                        if not self.connection.recv(1):
                            break
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                gateway.ended.set()
                self.close_connection = True

        self._listen(Handler)

    def __exit__(self, *exc) -> None:
        self._closing.set()  # held streams end, so that the server's shutdown does not wait
        super().__exit__(*exc)


CREATED = b'{"result":{"header":{"revision":"5"},"created":true}}'
EVENT = b'{"result":{"header":{"revision":"6"},"events":[{"kv":{"key":"L3AvYQ==","mod_revision":"6"}}]}}'  # noqa: E501  /p/a


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (b"{not json", "is not JSON"),
        (b'{"result":{"header":{"revision":"6"},"events":{"kv":1}}}', "is no list"),
        (b'{"result":{"header":{},"events":[{"kv":{"key":"L3gvYQ==","mod_revision":"6"}}]}}',
         "outside the watched range"),  # /x/a
        (b"[" * 100_000, "is not JSON"),  # nested past the parser's recursion limit
        (b'{"error":{"grpc_code":14,"message":"unavailable"}}', "the gateway's error"),
    ],
    ids=["not-json", "events-no-list", "outside-range", "nested-too-deep", "gateway-error"],
)  # fmt: skip
def test_a_malformed_stream_message_is_reported_and_the_watch_goes_on(bad, said) -> None:
    with StreamGateway([[CREATED, bad], [CREATED, EVENT]]) as member:
        client = Etcd(member.address, prefix="/p/", timeout_s=2.0)
        changes, errors, threads = [], [], set()

        def on_error(err: Exception) -> None:
            errors.append(err)
            threads.add(threading.current_thread().name)

        try:
            watch = client.watch("", lambda: changes.append(1), slow_interval_s=SLOW_S,
                                 on_error=on_error)  # fmt: skip
            assert wait_for(lambda: errors)
            assert threads == {"hogwild-etcd-watch"}  # the polling thread's, as on_change's
            assert isinstance(errors[0], StreamError) and said in str(errors[0])
            assert member.address in str(errors[0])
            # opened again: created and an event, each a change to report (one call may
            # answer both: they come together)
            assert wait_for(lambda: changes and member.opened == 2 and watch.streaming)
            watch.cancel()
            assert len(errors) == 1 and not watch.active
        finally:
            client.close()


def test_cancel_ends_a_watch_whose_stream_is_blocked_in_its_read() -> None:
    with StreamGateway([[CREATED]]) as member:
        client = Etcd(member.address, prefix="/p/", timeout_s=30.0)  # a join would wait 2 min
        changes = []
        try:
            watch = client.watch("", lambda: changes.append(1), slow_interval_s=SLOW_S)
            assert wait_for(lambda: watch.streaming)  # its reader blocked: the stream is quiet
            started = time.monotonic()
            watch.cancel()
            assert time.monotonic() - started < WAIT_S and not watch.active
            assert member.ended.wait(WAIT_S)  # its connection closed, not left to the server
            assert changes == []
        finally:
            client.close()


def test_close_cuts_a_stream_short_in_its_tls_handshake() -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, then never answers
    member = f"127.0.0.1:{listener.getsockname()[1]}"
    stream = WatchStream(
        [member], lambda i: "/v3/", 30.0, b"/p/", b"/p0", None, lambda: 0, lambda: None,
        lambda err: None, tls=ssl.create_default_context(),
    ).start()  # fmt: skip
    try:
        listener.settimeout(WAIT_S)
        peer, _ = listener.accept()
        peer.settimeout(WAIT_S)
        assert peer.recv(1)  # its ClientHello: the handshake waits for our answer
        started = time.monotonic()
        stream.close()  # a join would wait out 4 timeouts of 30 s
        assert time.monotonic() - started < WAIT_S and not stream.active
        peer.close()
    finally:
        stream.close()
        listener.close()


def test_the_back_off_resets_only_after_a_stream_that_lived() -> None:
    assert next_backoff(0.8, 0.0, failed=False) == 0.8  # none created: it keeps growing
    assert next_backoff(0.8, 0.1, failed=False) == 0.8  # created, then closed at once
    assert next_backoff(0.8, LIVED_S, failed=True) == 0.8  # lived, but erred
    assert next_backoff(0.8, LIVED_S, failed=False) == BACKOFF_S
