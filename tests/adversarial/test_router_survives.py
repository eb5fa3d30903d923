"""Nothing that escapes a handler may end a :class:`~hogwild.net.router.Router`'s network thread.

A handler's reply that cannot be encoded, a reply from another thread that does not decode (a
non-finite scalar), a handler whose ``tick`` fails: each is answered with an ``INTERNAL`` error
where a client waits for it, counted, and the thread goes on serving the next request.
"""

from __future__ import annotations

import itertools
import math

import pytest
import zmq

from hogwild.net.address import parse_address
from hogwild.net.router import Reply, Router
from hogwild.net.wire import DType, ErrorCode, Header, MsgType, pack_header, unpack_header

pytestmark = pytest.mark.ps_kernels


class Hostile:
    """A handler that does what a buggy server might: a ``PING`` with ``target`` 1 gets a reply
    whose field does not fit its slot, ``target`` 2 a NaN scalar from a replier thread, and its
    ``tick`` fails every tenth call; any other ``PING`` is acknowledged."""

    dedup_types = frozenset({MsgType.PING})  # routed back by sender and sequence number
    receives_into_buffers = False

    def __init__(self) -> None:
        self.router: Router | None = None
        self.ticks = 0

    def buffers(self, header):
        return None

    def release(self, buffers) -> None:
        pass

    def handle(self, request):
        h = request.header
        if h.target == 1:
            return Reply(h.reply(MsgType.ACK, version=2**64))  # does not fit u64
        if h.target == 2:
            replier = self.router.replier()
            replier.send(h.reply(MsgType.ACK, a=math.nan))
            replier.close()
            return None
        return Reply(h.reply(MsgType.ACK, version=7))

    def tick(self, now: float) -> None:
        self.ticks += 1
        if self.ticks % 10 == 0:
            raise RuntimeError("tick failed")


_seq = itertools.count(1)


def ask(sock, target: int) -> Header:
    header = Header(MsgType.PING, sender=5, target=target, seq=next(_seq))
    sock.send_multipart([pack_header(header)])
    assert sock.poll(3000), f"no answer to the PING of target {target}"
    return unpack_header(sock.recv_multipart()[0])


def test_the_network_thread_survives_its_handler():
    handler = Hostile()
    router = Router(parse_address("tcp://127.0.0.1:0"), handler)
    handler.router = router
    address = router.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address.endpoint)
    try:
        for _ in range(3):
            bad = ask(sock, 1)
            assert (bad.type, bad.code) == (MsgType.ERROR, ErrorCode.INTERNAL)
            nan = ask(sock, 2)
            assert (nan.type, nan.code) == (MsgType.ERROR, ErrorCode.INTERNAL)
            ok = ask(sock, 0)
            assert (ok.type, ok.version) == (MsgType.ACK, 7)
        while handler.ticks < 25:  # two failed ticks at least
            ok = ask(sock, 0)
            assert ok.type == MsgType.ACK
        assert router.alive and router.failure is None
        assert router.errors["INTERNAL"] >= 6 + 2
    finally:
        sock.close(linger=0)
        ctx.term()
        router.stop()
        router.close()


def test_frames_beyond_those_announced_are_refused_as_they_come():
    """A header announcing one frame followed by a thousand: refused ``BAD_FRAMES`` naming the
    count announced, and the next message is read from its own start."""
    handler = Hostile()
    router = Router(parse_address("tcp://127.0.0.1:0"), handler)
    address = router.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address.endpoint)
    try:
        header = Header(MsgType.PING, sender=6, seq=next(_seq), dtype=DType.UINT8, shape=(4,),
                        frames=1)  # fmt: skip
        sock.send_multipart([pack_header(header), *([b"abcd"] * 1000)])
        assert sock.poll(3000)
        parts = sock.recv_multipart()
        reply = unpack_header(parts[0])
        assert (reply.type, reply.code) == (MsgType.ERROR, ErrorCode.BAD_FRAMES)
        assert b"more than 1 frame(s)" in parts[1] and b"announced 1" in parts[1]
        ok = ask(sock, 0)
        assert (ok.type, ok.version) == (MsgType.ACK, 7)
    finally:
        sock.close(linger=0)
        ctx.term()
        router.stop()
        router.close()
