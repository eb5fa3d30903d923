"""A live server fed 100,000 random and mutated frames keeps serving and answers correctly after.

The frames are small (the model has 3 shards of 1,024 floats) so that the whole run takes a few
seconds: valid requests of every type, then mutations of them: random bytes instead of the
header, one header byte flipped, a header field replaced by a random value, frames dropped,
added, truncated or replaced. Each message must get a reply (an error naming what was wrong for
the malformed ones) within a bounded time, the network and update threads must stay alive, and
afterwards a client's push and pull must come out exactly right.
"""

from __future__ import annotations

import multiprocessing as mp
import sys

import numpy as np
import zmq
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.layout import FcLayer, ModelGeometry
from hogwild_plugins.ps.serving.launch import local_server

from bench.support.hostile_frames import mutate, with_seq
from hogwild.net.wire import (
    HEADER,
    DType,
    ErrorCode,
    Header,
    MsgType,
    job_id,
    pack_header,
    unpack_header,
)

MESSAGES = 100_000
CHUNK = 400
GEOMETRY = ModelGeometry(3000, (FcLayer(2, 100, 20, 30),))


def valid_messages(job: int) -> list[list[bytes]]:
    delta = np.ones(100, np.float32).tobytes()
    acts, errs = np.ones((2, 20), np.float32).tobytes(), np.ones((30, 2), np.float32).tobytes()
    return [
        [pack_header(Header(MsgType.PING))],
        [pack_header(Header(MsgType.STATUS, job=job))],
        [pack_header(Header(MsgType.HELLO, job=job))],
        [
            pack_header(Header(MsgType.PULL, job=job, target=1)),
        ],
        [
            pack_header(
                Header(
                    MsgType.PUSH_DELTAS,
                    job=job,
                    target=0,
                    offset=7,
                    shape=(100,),
                    dtype=DType.FLOAT32,
                    frames=1,
                )
            ),
            delta,
        ],
        [
            pack_header(
                Header(
                    MsgType.PUSH_VECTORS,
                    job=job,
                    target=0,
                    aux=2,
                    shape=(2, 20, 30),
                    dtype=DType.FLOAT32,
                    frames=2,
                    a=0.01,
                )
            ),
            acts,
            errs,
        ],
        [
            pack_header(
                Header(
                    MsgType.VECTOR_OP,
                    job=job,
                    target=2,
                    code=1,
                    dtype=DType.UINT8,
                    shape=(13,),
                    frames=1,
                )
            ),
            b"params,params",
        ],
    ]


def fuzz(endpoint: str, job: int, messages: int, seed: int, out) -> None:
    """Send ``messages`` random and mutated messages, a few hundred in flight; count replies.

    Runs in a child process, so that making and sending frames does not compete with the
    server's threads for this process's GIL.
    """
    rng = np.random.default_rng(seed)
    bases = valid_messages(job)
    weights = np.array([4, 1, 1, 8, 10, 4, 8], np.float64)  # status and hello are the costly ones
    picks = rng.choice(len(bases), size=messages, p=weights / weights.sum())
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sent = replies = errors = mute = 0
    try:
        while sent < messages:
            for _ in range(min(CHUNK, messages - sent)):
                base = bases[picks[sent]]
                message = with_seq(base, sent + 1)  # fresh: no duplicate drops
                if rng.integers(0, 8):  # one in eight goes as it is, valid
                    message = mutate(message, rng)
                sock.send_multipart(message)
                sent += 1
            while replies < sent - 50:  # keep at most a few hundred in flight
                if not sock.poll(10_000):
                    out.put(("hang", sent, replies))
                    return
                parts = sock.recv_multipart()
                replies += 1
                head = unpack_header(parts[0])  # every reply is well formed
                if head.type == MsgType.ERROR:
                    errors += 1
                    mute += len(parts) != 2 or not parts[1]  # an error must say what was wrong
        while sock.poll(1000):  # the last ones; some mutated sequence numbers collide
            sock.recv_multipart()
            replies += 1
        out.put(("done", sent, replies, errors, mute))
    finally:
        sock.close(linger=0)
        ctx.term()


def test_a_live_server_survives_100k_random_and_mutated_frames():
    switch = sys.getswitchinterval()
    sys.setswitchinterval(2e-4)  # as `hogwild ps serve` does: the server's threads share a GIL
    try:
        run_fuzz()
    finally:
        sys.setswitchinterval(switch)


def run_fuzz() -> None:
    with local_server(GEOMETRY, job="fuzz", shard_kib=4) as server:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        child = ctx.Process(
            target=fuzz, args=(server.address.endpoint, job_id("fuzz"), MESSAGES, 2024, out)
        )
        child.start()
        try:
            result = out.get(timeout=180)
        finally:
            child.join(30)
            if child.is_alive():
                child.kill()
                child.join()
        assert result[0] == "done", f"the server stopped answering: {result}"
        _, sent, replies, errors, mute = result
        status = server.status()
        assert server.router.alive and not status["failures"]
        assert sent == MESSAGES and replies >= 0.99 * MESSAGES
        assert errors > 0.5 * MESSAGES and mute == 0
        assert sum(status["errors"].values()) + status["duplicates"] >= errors  # re-answers
        assert {"BAD_HEADER", "BAD_FRAMES", "BAD_TARGET", "UNEXPECTED"} <= set(status["errors"])

        # afterwards: a correct request is answered correctly
        with PSClient([str(server.address)], "fuzz", client_id=77) as client:
            client.assign(np.zeros(3000, np.float32))
            delta = np.arange(3000, dtype=np.float32)
            client.push_deltas(delta)
            out_values = np.full(3000, np.nan, np.float32)
            client.pull(out_values)
            np.testing.assert_array_equal(out_values, delta)


def test_error_replies_name_the_field():
    with local_server(GEOMETRY, job="fuzz", shard_kib=4) as server:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(server.address.endpoint)
        try:
            fields = list(HEADER.unpack(pack_header(Header(MsgType.PULL, job=job_id("fuzz")))))
            fields[0] = b"NOPE"
            sock.send_multipart([HEADER.pack(*fields)])
            assert sock.poll(5000)
            head, text = sock.recv_multipart()
            assert unpack_header(head).code == ErrorCode.BAD_HEADER and b"magic" in text
            sock.send_multipart([pack_header(Header(MsgType.PULL, job=job_id("fuzz"), target=9))])
            assert sock.poll(5000)
            head, text = sock.recv_multipart()
            assert unpack_header(head).code == ErrorCode.BAD_TARGET and b"shard 9" in text
        finally:
            sock.close(linger=0)
            ctx.term()
