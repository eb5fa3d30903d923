"""The watch's own transport (:mod:`hogwild_plugins.ps.etcd_poll`) against a real etcd on
loopback and a tiny real HTTP server of the test's own standing in for a member that answers
with an error: a poll goes to a member that answers, passes over one that is unavailable (as the
client's requests do, through the one classifier of both), keeps a member's error typed and
naming it, asks a member that closed a kept connection once more, refuses an oversized or
malformed reply, and when no member answers the failure names each one."""

from __future__ import annotations

import base64
import json
import queue
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hogwild_plugins.ps.etcd import (
    Etcd,
    EtcdClusterLost,
    EtcdUnavailable,
)
from hogwild_plugins.ps.etcd_errors import EtcdReplyError
from hogwild_plugins.ps.etcd_poll import REPLY_LIMIT, RangePoller
from hogwild_plugins.ps.etcd_tls import make_etcd_tls

from hogwild.errors import HogwildError
from hogwild.net.ports import free_ports

pytestmark = pytest.mark.kernel_free

LEARNER = 503, b'{"error":"etcdserver: rpc not supported for learner","code":14}'


def _range(key: str) -> dict:
    return {"key": base64.b64encode(key.encode()).decode(), "count_only": True}


class FakeGatewayHandler(BaseHTTPRequestHandler):
    """A fake etcd gateway's request handler: kept HTTP/1.1 connections (a connection the client
    forgot ends its thread after ``timeout``), answers sized by Content-Length, no log."""

    protocol_version = "HTTP/1.1"
    timeout = 5.0

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class LoopbackGateway:
    """A fake gateway's HTTP server on 127.0.0.1 (``address``), served by a thread of its own
    from ``__enter__`` to ``__exit__``; a subclass makes it with :meth:`_listen`."""

    def _listen(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class Gateway(LoopbackGateway):
    """An HTTP server on loopback answering each POST with ``status`` and ``body`` (and
    ``/version`` as etcd 3.5 does); it counts the connections and POSTs it took. With
    ``close_after`` it closes each connection after one reply without saying so, as a member
    that restarts between two polls does. It has no watch stream (``/v3/watch`` answers 404,
    uncounted), so a watch on it polls at its fast interval. Once ``hold`` is set, the next POST
    sets ``holding`` and is answered ``held_body`` only when ``hold`` is set in turn. With
    ``stall`` set, every POST waits for it (10 s at most) before its answer, as a follower
    forwarding to a stopped leader does."""

    def __init__(self, status: int, body: bytes, close_after: bool = False) -> None:
        self.status, self.body, self.close_after = status, body, close_after
        self.stall: threading.Event | None = None
        self.delay_s = 0.0  # each POST answered this late, as a slow member does
        self.connections = self.posts = 0
        self.hold: threading.Event | None = None
        self.holding, self.held_body = threading.Event(), b""
        gateway = self

        class Handler(FakeGatewayHandler):
            def setup(self) -> None:
                super().setup()
                gateway.connections += 1

            def do_GET(self) -> None:
                self._answer(200, b'{"etcdserver":"3.5.0","etcdcluster":"3.5.0"}')

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                if self.path.endswith("/watch"):  # no stream here: the watch goes on polling
                    self._answer(404, b"Not Found\n")
                    return
                gateway.posts += 1
                hold, body = gateway.hold, gateway.body
                time.sleep(gateway.delay_s)
                if gateway.stall is not None:
                    gateway.stall.wait(10.0)
                if hold is not None and not gateway.holding.is_set():
                    gateway.holding.set()
                    hold.wait(10.0)
                    body = gateway.held_body
                self._answer(gateway.status, body)
                self.close_connection = gateway.close_after

        self._listen(Handler)


def test_a_poll_reaches_the_member_that_answers_and_names_every_member_when_none_does(
    etcd: Etcd,
) -> None:
    dead = [f"127.0.0.1:{port}" for port in free_ports(2)]  # nothing listens there
    etcd.put("k", {"v": 1})
    live = etcd.members[0]
    asked = []

    def api_path(i: int) -> str:  # the live member's, asked through etcd3gw when first needed
        asked.append(i)
        return etcd._clients[0].api_path

    poller = RangePoller([dead[0], live], api_path, 1.0)
    try:
        kept = None
        for _ in range(3):  # the dead member is passed over, the live one's connection kept
            reply = poller.post("/kv/range", _range(f"{etcd.prefix}k"))
            assert int(reply["count"]) == 1 and "header" in reply
            assert kept in (None, poller._connections[1]) and poller._connections[0] is None
            kept = poller._connections[1]
        assert 1 in asked
        # a request the member refuses is the member's error, typed, naming it
        with pytest.raises(HogwildError, match=f"etcd at {live}: /kv/range failed: HTTP 400"):
            poller.post("/kv/range", {"key": "not base64 !"})
    finally:
        poller.close()
    assert poller._connections == [None, None]

    alone = RangePoller([dead[0]], lambda i: "/v3/", 1.0)
    with pytest.raises(EtcdUnavailable, match=f"etcd at {dead[0]} cannot be reached"):
        alone.post("/kv/range", _range("k"))
    both = RangePoller(dead, lambda i: "/v3/", 1.0)
    with pytest.raises(EtcdClusterLost, match=f"{dead[0]}: .*; {dead[1]}: "):
        both.post("/kv/range", _range("k"))


def test_an_unavailable_member_is_passed_over_and_the_watch_polls_where_its_reading_went(
    etcd: Etcd,
) -> None:
    live = etcd.members[0]
    with Gateway(*LEARNER) as learner:  # a learner's 503 names no missing leader
        poller = RangePoller([learner.address, live], lambda i: "/v3/", 1.0)
        try:
            assert "header" in poller.post("/kv/range", _range(f"{etcd.prefix}k"))
            assert poller._current == 1 and learner.posts == 1
        finally:
            poller.close()
        both = Etcd(f"{learner.address},{live}", prefix=etcd.prefix, timeout_s=1.0)
        changed = threading.Event()
        try:  # the first reading passes the learner over; the polls start where it went
            watch = both.watch("", changed.set, interval_s=0.02)
            assert learner.posts == 2
            etcd.put("k", {"v": 1})
            assert changed.wait(10.0)
            watch.cancel()
            assert learner.posts == 2
        finally:
            both.close()


def test_an_error_reply_keeps_its_status_and_a_timed_out_member_is_down() -> None:
    with Gateway(502, b"Bad Gateway\n") as proxy:
        poller = RangePoller([proxy.address], lambda i: "/v3/", 1.0)
        client = Etcd(proxy.address, prefix="/p/", timeout_s=1.0)
        try:
            for ask in (lambda: poller.post("/kv/range", {}), lambda: client.get("k")):
                with pytest.raises(HogwildError, match="/kv/range failed: HTTP 502: Bad Gateway"):
                    ask()
            proxy.status, proxy.body = 504, b"context deadline exceeded"
            for ask in (lambda: poller.post("/kv/range", {}), lambda: client.get("k")):
                with pytest.raises(EtcdUnavailable, match="HTTP 504: context deadline exceeded"):
                    ask()
        finally:
            poller.close()
            client.close()


def test_a_kept_tls_connection_the_member_closed_is_asked_once_more(tmp_path) -> None:
    # Over TLS a member closing a kept connection without its close_notify surfaces as
    # SSLEOFError, not as a plain disconnection: it too is asked again on a new connection
    tls = make_etcd_tls(tmp_path / "tls", ["127.0.0.1"])
    reply = {"header": {"revision": "7"}, "count": "0"}
    with Gateway(200, json.dumps(reply).encode(), close_after=True) as member:
        served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        served.load_cert_chain(str(tls.server_cert), str(tls.server_key))
        member._server.socket = served.wrap_socket(member._server.socket, server_side=True)
        poller = RangePoller([member.address], lambda i: "/v3/", 1.0, tls=tls.ssl_context())
        try:
            for _ in range(3):
                assert poller.post("/kv/range", {}) == reply
            assert (member.connections, member.posts) == (3, 3)
        finally:
            poller.close()


def test_a_kept_connection_the_member_closed_is_asked_once_more_and_big_replies_refused() -> None:
    reply = {"header": {"revision": "7"}, "count": "0"}
    with Gateway(200, json.dumps(reply).encode(), close_after=True) as member:
        poller = RangePoller([member.address], lambda i: "/v3/", 1.0)
        try:
            for _ in range(3):
                assert poller.post("/kv/range", {}) == reply
            assert (member.connections, member.posts) == (3, 3)
            member.body = b'{"pad":"' + b"x" * REPLY_LIMIT + b'"}'
            with pytest.raises(HogwildError, match=f"{member.address}: .* {REPLY_LIMIT} bytes"):
                poller.post("/kv/range", {})
            assert poller._connections == [None]
        finally:
            poller.close()


@pytest.mark.parametrize(
    ("body", "said"),
    [(b"{}", "no 'revision'"), (b'{"header":{"revision":"3"},"kvs":["x"]}', "malformed")],
)
def test_the_watch_reports_a_reply_that_is_no_range_reply(body: bytes, said: str) -> None:
    errors: queue.Queue = queue.Queue()
    with Gateway(200, body) as member:
        client = Etcd(member.address, prefix="/p/", timeout_s=1.0)
        try:
            client.watch("", lambda: None, interval_s=0.02, on_error=errors.put)
            assert said in str(errors.get(timeout=10.0))
        finally:
            client.close()


def test_no_change_is_reported_once_cancel_was_called() -> None:
    range_reply = {"header": {"revision": "1"}, "count": "0"}
    changes, errors = [], []
    with Gateway(200, json.dumps(range_reply).encode()) as member:
        client = Etcd(member.address, prefix="/p/", timeout_s=5.0)
        try:
            watch = client.watch("", lambda: changes.append(1), interval_s=0.01,
                                 on_error=errors.append)  # fmt: skip
            member.held_body = json.dumps(
                {"header": {"revision": "2"}, "count": "1", "kvs": [{"mod_revision": "2"}]}
            ).encode()
            release = threading.Event()
            member.hold = release
            assert member.holding.wait(10.0)  # a poll is in flight: it will see a change
            canceller = threading.Thread(target=watch.cancel)
            canceller.start()
            while not watch._stop.is_set():  # cancel() has begun: the change comes too late
                canceller.join(0.001)
            release.set()
            canceller.join(10.0)
            assert not canceller.is_alive() and not watch.active
            assert (changes, errors) == ([], [])
        finally:
            client.close()


KEEPALIVE = json.dumps({"result": {"header": {"revision": "3"}, "ID": "7", "TTL": "1"}}).encode()
RANGE = json.dumps({"header": {"revision": "3"}}).encode()  # no kvs: the key is absent
LEADER_CHANGED = 503, b'{"error":"etcdserver: leader changed","code":14}'


def _until(done, within_s: float = 5.0) -> bool:
    """Whether ``done()`` came true within ``within_s`` (a handler thread counts a POST the
    client already gave up on a moment later)."""
    deadline = time.monotonic() + within_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    return done()


def test_the_polls_go_back_to_their_near_member_once_it_answers_again() -> None:
    answer = json.dumps({"header": {"revision": "5"}, "count": "0"}).encode()
    with Gateway(*LEARNER) as near, Gateway(200, answer) as other:
        members = [near.address, other.address]

        def poller(return_s: float) -> RangePoller:
            return RangePoller(
                members, lambda i: "/v3/", 2.0, first=0, near=0, near_return=(return_s, 0.5, 12)
            )

        staying, returning = poller(3600.0), poller(0.0)
        try:
            for each in (staying, returning):
                each.post("/kv/range", _range("k"))  # the near member unavailable: the other
                assert each.current == 1
            near.status, near.body = 200, answer  # back
            asked = near.posts
            staying.post("/kv/range", _range("k"))
            assert staying.current == 1 and near.posts == asked  # not before return_s
            returning.post("/kv/range", _range("k"))
            assert returning.current == 0 and near.posts == asked + 1
        finally:
            staying.close()
            returning.close()


@pytest.mark.parametrize("body", [b"<html>502 Bad Gateway</html>", b"[1]"])
def test_a_near_member_answering_junk_is_left_for_the_next_each_return(body: bytes) -> None:
    # A proxy's page (HTTP 502, no etcd error object) or a JSON list from the near member is that
    # member's fault: every return to it fails, is counted as a failed return (the wait doubles),
    # and the poll, and the client's read, are answered by the healthy other member.
    answer = json.dumps({"header": {"revision": "5"}, "count": "0"}).encode()
    status = 502 if body.startswith(b"<") else 200
    with Gateway(status, body) as near, Gateway(200, answer) as other:
        members = [near.address, other.address]
        poller = RangePoller(members, lambda i: "/v3/", 2.0, first=1, near=0,
                             near_return=(0.0, 0.5, 12))  # fmt: skip
        client = Etcd(",".join(members), prefix="/j/", near="127.0.0.1")
        try:
            for backoff in (2, 4):
                assert poller.post("/kv/range", _range("k"))["count"] == "0"
                assert poller.current == 1 and poller._near_backoff == backoff
            client._current, client._away_since = 1, 0.0  # away from it since long ago
            for backoff in (2, 4):
                assert client.get("k") == (None, 0) and client._current == 1
                assert client._near_backoff == backoff
                client._away_since = 0.0  # the (longer) wait is over
            assert near.posts == 4
        finally:
            poller.close()
            client.close()
    with Gateway(502, b"<html>") as junk, Gateway(502, b"<html>") as more:
        poller = RangePoller([junk.address, more.address], lambda i: "/v3/", 2.0)
        try:  # every member junk: the members' fault, named, not a lost cluster
            with pytest.raises(EtcdReplyError, match="no error reply of etcd's"):
                poller.post("/kv/range", _range("k"))
        finally:
            poller.close()
