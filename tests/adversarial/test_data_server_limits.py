"""A data server's replies to a client that never reads them are bounded.

A reader asks for up to :data:`~hogwild.data.server.MAX_REPLY_BYTES` of images a ``BATCH``; the
server's router keeps at most its ``reply_hwm`` replies (128) waiting for one client and drops
the rest (a client that reads retries them), so a client that asks and never reads holds at most
128 replies in the server, not every reply it asked for. After it, the server answers
``STATUS`` and a batch holds exactly the records asked for.
"""

from __future__ import annotations

import time

import numpy as np
import zmq

from hogwild.data.idx import write_idx
from hogwild.data.resident import Delivery, load_source
from hogwild.data.server import MAX_REPLY_BYTES, DataServer
from hogwild.net.address import parse_address
from hogwild.net.router import reply_hwm
from hogwild.net.wire import DType, Header, MsgType, pack_header, unpack_header
from tests.adversarial.hostile import RawClient

N_TRAIN = 1500  # one batch of all of them: a reply of 1.1 MiB of images
WINDOW = 16  # requests in flight, within the server's queue (32 a thread)


def test_replies_to_a_data_client_that_never_reads_are_bounded(tmp_path):
    rng = np.random.default_rng(11)
    for prefix, n in (("train", N_TRAIN), ("t10k", 10)):
        images = rng.integers(0, 256, (n, 28, 28), np.uint8)
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte", images)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n, np.uint8))
    server = DataServer(Delivery(load_source(str(tmp_path))), parse_address("127.0.0.1:0"))
    address = server.start()
    try:
        hwm = server.router.reply_hwm
        assert hwm == 128 and N_TRAIN * 28 * 28 <= MAX_REPLY_BYTES
        idx = np.arange(N_TRAIN, dtype=np.int64)
        header = Header(MsgType.BATCH, job=server.data_id, target=0, dtype=DType.INT64,
                        shape=(N_TRAIN,), frames=1)  # fmt: skip
        asked = 2 * hwm + 40
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 1)
        sock.setsockopt(zmq.RCVBUF, 65536)
        sock.connect(address.endpoint)
        try:
            deadline = time.monotonic() + 120
            for seq in range(1, asked + 1):
                sock.send_multipart([pack_header(header._replace(seq=seq)), idx.tobytes()])
                while server.counts["batches"] < seq - WINDOW:  # within its queue: none BUSY
                    assert time.monotonic() < deadline, server.counts
                    time.sleep(0.005)
            while server.counts["batches"] < asked:  # every reply built, none of them read
                assert time.monotonic() < deadline, server.counts
                time.sleep(0.05)
            assert server.counts["busy"] == 0
            time.sleep(0.2)  # the last one handed to its pipe
            got = 0
            while sock.poll(1000):
                parts = sock.recv_multipart()
                assert unpack_header(parts[0]).type == MsgType.DATA
                got += 1
        finally:
            sock.close(linger=0)
            ctx.term()
        assert 0 < got <= hwm + 16, got  # the high-water mark, and what the TCP buffers held
        # it goes on serving: a status, and a batch exactly as asked
        with RawClient(address.endpoint) as raw:
            raw.send([pack_header(Header(MsgType.STATUS, job=server.data_id))])
            assert unpack_header(raw.reply()[0]).type == MsgType.JSON
            few = np.array([7, 0, N_TRAIN - 1], np.int64)
            raw.send([pack_header(header._replace(shape=(3,), seq=0)), few.tobytes()])
            parts = raw.reply()
        images = np.empty((3, 28, 28, 1), np.uint8)
        labels = np.empty(3, np.int32)
        server.delivery.source.splits["train"].reader.read(few, images, labels)
        assert bytes(parts[1]) == images.tobytes()
        np.testing.assert_array_equal(np.frombuffer(parts[2], np.int32), labels)
    finally:
        server.stop()
    assert reply_hwm(1 << 20) == hwm  # the bound docs/security.md states: 128 replies a client
