"""Slow senders hold up nobody: a parameter server serves its honest clients meanwhile.

Hostile peers speak ZeroMQ's wire protocol (ZMTP 3.0, the NULL mechanism of a loopback server
without keys) by hand over raw TCP, and stop half-way: one in the middle of its greeting, one
after its handshake in the middle of a request's header frame, one after announcing a 1 MiB
array frame of which it sends a few bytes, and others that trickle a byte at a time while the
test runs. Meanwhile an honest client's pushes land exactly and the server answers ``STATUS``.
The half push is held, not applied: once its last bytes come it is acknowledged and lands
exactly once; once the other slow peers give up (their connections closed half-way), the server
still serves.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.net.wire import NO_BASIS, DType, Header, MsgType, pack_header, unpack_header

pytestmark = pytest.mark.ps_kernels

N = 2048
TRICKLERS = 8
GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)


def ready_command() -> bytes:
    """ZMTP 3.0's READY command of a DEALER (the NULL mechanism's handshake)."""
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    return bytes([0x04, len(body)]) + body


def frame_start(size: int, more: bool) -> bytes:
    """A message frame's flags and length (the long form from 256 bytes, as ZMTP requires): its
    body is to follow."""
    more_flag = 0x01 if more else 0x00
    if size < 256:
        return bytes([more_flag, size])
    return bytes([0x02 | more_flag]) + struct.pack(">Q", size)


def connected(address) -> socket.socket:
    sock = socket.create_connection((address.host, address.port), timeout=5.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = sock.recv(n - len(data))
        assert more, "the server closed the connection"
        data += more
    return data


def read_message(sock: socket.socket) -> list[bytes]:
    """One message's frames from the server (its READY command skipped)."""
    frames = []
    while True:
        flags = read_exact(sock, 1)[0]
        size = (
            struct.unpack(">Q", read_exact(sock, 8))[0] if flags & 0x02 else read_exact(sock, 1)[0]
        )
        body = read_exact(sock, size)
        if flags & 0x04:  # a command (READY)
            continue
        frames.append(body)
        if not flags & 0x01:
            return frames


def handshake(address) -> socket.socket:
    """A connection past ZMTP's handshake: greetings exchanged (libzmq reads a peer's greeting
    before what follows it), then this peer's READY."""
    sock = connected(address)
    sock.sendall(GREETING)
    read_exact(sock, len(GREETING))
    sock.sendall(ready_command())
    return sock


def pulled(client: PSClient) -> np.ndarray:
    out = np.empty(N, np.float32)
    client.pull(out)
    return out


def honest_push_lands(client: PSClient) -> None:
    before = pulled(client)
    client.push_deltas(np.ones(N, np.float32))
    np.testing.assert_array_equal(pulled(client), before + 1.0)


def test_slow_senders_hold_up_no_honest_client():
    with local_server(ModelGeometry(N), shard_kib=4, threads=1) as server:
        address = server.address
        shard = server.layout.shard_floats
        push = pack_header(
            Header(MsgType.PUSH_DELTAS, job=server.job, sender=5, seq=1, target=0,
                   dtype=DType.FLOAT32, shape=(shard,), frames=1, flags=NO_BASIS)
        )  # fmt: skip
        deltas = np.full(shard, 2.0, np.float32).tobytes()
        peers: list[socket.socket] = []
        stop = threading.Event()
        trickled = [0] * TRICKLERS

        def trickle(sock: socket.socket, k: int) -> None:
            """A push's header, then a 1 MiB frame's bytes one at a time, until told to stop."""
            try:
                for byte in frame_start(len(push), True) + push + frame_start(1 << 20, False):
                    if stop.wait(0.002):
                        return
                    sock.send(bytes([byte]))
                    trickled[k] += 1
                while not stop.wait(0.01):
                    sock.send(b"\0")
                    trickled[k] += 1
            except OSError:
                pass

        threads = []
        try:
            mid_greeting = connected(address)
            mid_greeting.sendall(GREETING[:20])
            peers.append(mid_greeting)
            mid_header = handshake(address)
            peers.append(mid_header)
            mid_header.sendall(frame_start(len(push), True) + push[:30])
            mid_array = handshake(address)  # a push of 2.0 into shard 0, stopped half-way
            peers.append(mid_array)
            mid_array.sendall(frame_start(len(push), True) + push)
            mid_array.sendall(frame_start(len(deltas), False) + deltas[:100])
            for k in range(TRICKLERS):
                peers.append(handshake(address))
                threads.append(threading.Thread(target=trickle, args=(peers[-1], k), daemon=True))
                threads[-1].start()
            with PSClient([str(address)], server.options.job, client_id=9, timeout_s=5.0) as c:
                for _ in range(3):
                    honest_push_lands(c)
                    assert c.status()[0]["job"] == server.options.job
                    time.sleep(0.1)
                assert min(trickled) > 0, trickled  # they were sending all along
                # the half push was held, not applied: finished now, it lands exactly once
                before = pulled(c)
                mid_array.sendall(deltas[100:])
                mid_array.settimeout(10.0)
                head = unpack_header(read_message(mid_array)[0])
                assert head.type == MsgType.ACK and head.seq == 1, head
                want = before.copy()
                want[:shard] += 2.0
                np.testing.assert_array_equal(pulled(c), want)
                stop.set()
                for thread in threads:
                    thread.join(5.0)
                for sock in peers:  # the others give up half-way
                    sock.close()
                peers.clear()
                time.sleep(0.2)
                honest_push_lands(c)
                assert c.status()[0]["job"] == server.options.job
        finally:
            stop.set()
            for thread in threads:
                thread.join(5.0)
            for sock in peers:
                sock.close()
