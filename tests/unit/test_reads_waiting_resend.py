"""A pull answered ``READS_WAITING`` (its primary's reads wait out its predecessor's lease) is
sent again, with the same number, to the same server, and served afresh there.

Two halves of that path, over a real :class:`~hogwild.net.router.Router` on loopback:

- the router does not keep the refusal as the request's answer
  (:data:`~hogwild.net.router.RETRY_AFRESH`): otherwise every re-send of the pull would get the
  cached ``READS_WAITING`` back until the client's failover deadline, however short the wait;
- the client's connection marks the refused pull held and re-sends it to the same server after
  a pause, without reading the bucket map (:class:`~hogwild_plugins.ps.routing.Rerouting`'s held
  path, fed by :meth:`~hogwild_plugins.ps.connection.Connection._run`).
"""

from __future__ import annotations

import itertools

import pytest
import zmq
from hogwild_plugins.ps.connection import Connection
from hogwild_plugins.ps.layout import ShardLayout
from hogwild_plugins.ps.routes import Routes

from hogwild.net.address import parse_address
from hogwild.net.channel import Request
from hogwild.net.router import Reply, Router, error_reply, json_reply
from hogwild.net.wire import ErrorCode, Header, MsgType, pack_header, unpack_header

pytestmark = pytest.mark.ps_kernels


class RefusesFirst:
    """A server that refuses each pull ``refusals`` times with ``code``, then answers it; it
    records every pull its handler saw, as ``(sender, seq)``. It answers ``HELLO`` with a
    one-bucket layout, as parameter server ``index`` does."""

    dedup_types = frozenset({MsgType.PULL})  # as the parameter server's (a pull is data)
    receives_into_buffers = False

    def __init__(self, code: ErrorCode, refusals: int = 1, index: int = 0) -> None:
        self.code, self.refusals, self.index = code, refusals, index
        self.seen: list[tuple[int, int]] = []
        self.layout: ShardLayout | None = None

    def buffers(self, header):
        return None

    def release(self, buffers) -> None:
        pass

    def handle(self, request):
        h = request.header
        if h.type == MsgType.HELLO:
            return json_reply(h, {"server": self.index, "layout": self.layout.describe()})
        self.seen.append((h.sender, h.seq))
        if sum(s == (h.sender, h.seq) for s in self.seen) <= self.refusals:
            return error_reply(h, self.code, "refused by the test's server")
        return Reply(h.reply(MsgType.DATA, version=3))

    def tick(self, now: float) -> None:
        pass


@pytest.fixture
def serve():
    started = []

    def start(handler: RefusesFirst) -> Router:
        router = Router(parse_address("tcp://127.0.0.1:0"), handler)
        address = router.start()
        started.append(router)
        handler.layout = ShardLayout.compute(1024, 4, 1, [str(address)])
        return router

    yield start
    for router in started:
        router.stop()
        router.close()


_seq = itertools.count(1)


def ask(sock, seq: int) -> Header:
    sock.send_multipart([pack_header(Header(MsgType.PULL, sender=7, target=0, seq=seq))])
    assert sock.poll(3000), f"no answer to pull {seq}"
    return unpack_header(sock.recv_multipart()[0])


@pytest.mark.parametrize(
    ("code", "afresh"), [(ErrorCode.READS_WAITING, True), (ErrorCode.BAD_RANGE, False)]
)
def test_a_pull_refused_reads_waiting_is_served_afresh_when_sent_again(serve, code, afresh):
    """The same seq again reaches the handler after ``READS_WAITING``; after a refusal that a
    retry cannot change (``BAD_RANGE``) the router answers it from its table instead."""
    handler = RefusesFirst(code)
    router = serve(handler)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(router.address.endpoint)
    try:
        seq = next(_seq)
        first = ask(sock, seq)
        assert (first.type, first.code) == (MsgType.ERROR, code)
        again = ask(sock, seq)
    finally:
        sock.close(0)
        ctx.term()
    if afresh:
        assert handler.seen == [(7, seq), (7, seq)]  # the handler saw it a second time
        assert again.type == MsgType.DATA and again.version == 3
    else:
        assert handler.seen == [(7, seq)]  # the recorded refusal answered the copy
        assert (again.type, again.code) == (MsgType.ERROR, code)


class MapReads(Routes):
    """The bucket map of two servers and two buckets, as a client last read it: server 0 its
    primary until the map is read again, server 1 after; counts the reads a re-route asks of
    etcd (there is no etcd here to read)."""

    def __init__(self) -> None:  # (no etcd client: read() names server 1)
        self.n_servers, self.n_buckets = 2, 2
        self.primaries, self.epochs, self.members = [0, 0], [1, 1], {0, 1}
        self.lease_s = 2.0
        self.reads = 0

    def read(self) -> None:
        self.reads += 1
        self.primaries, self.epochs = [1, 1], [2, 2]

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("code", "held"), [(ErrorCode.READS_WAITING, True), (ErrorCode.NOT_PRIMARY, False)]
)
def test_a_connection_sends_a_held_pull_again_to_the_same_server_without_reading_the_map(
    serve, code, held
):
    """``READS_WAITING``: held, re-sent to server 0 with its number, no map read, though a
    read would name server 1 (review I4: with one server any re-route went to server 0);
    ``NOT_PRIMARY`` (the control): the same refusal path reads the map and goes to server 1."""
    first, second = RefusesFirst(code, refusals=2), RefusesFirst(code, refusals=0, index=1)
    routers = [serve(first), serve(second)]
    layout = ShardLayout.compute(1024, 4, 2, [str(r.address) for r in routers])
    first.layout = second.layout = layout  # one job of both
    connection = Connection(
        [str(r.address) for r in routers], "held", client_id=9, timeout_s=2, retries=1,
        failover_s=5,
    )  # fmt: skip
    connection.routes = routes = MapReads()
    answers = []
    try:
        request = Request(0, connection.header(MsgType.PULL, target=0))
        request.on_reply = lambda header, frames: answers.append(header)
        connection.run([request])
    finally:
        connection.close()
    assert [h.type for h in answers] == [MsgType.DATA]
    if held:
        assert len(first.seen) == 3 and len(set(first.seen)) == 1  # one number, three sends
        assert second.seen == [] and request.server == 0 and routes.reads == 0
    else:
        assert len(first.seen) == 1 and len(second.seen) == 1 and request.server == 1
        assert routes.reads >= 1
