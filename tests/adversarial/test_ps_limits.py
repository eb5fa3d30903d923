"""A parameter server's memory has stated bounds that no client can push it past.

- Named vectors: at most ``ps.max_vectors`` per shard (and never more than one snapshot frame
  holds); a write that would make one more is refused naming the limit, and a name only read (a
  ``dot`` of names never written) allocates nothing and reads as zeros.
- The request table (the replies kept for retries) is filled only by requests of this job: a
  flood of other jobs' numbered requests leaves it empty.
- Replies a client does not read: at most ``reply_hwm`` of them (128 shards of 1 MiB) wait in
  the server for each client.

After each, the server answers ``STATUS`` and an honest push lands exactly. One server serves
the module.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.sandblaster.vectors import ShardVectors
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.errors import HogwildError
from hogwild.net.wire import NO_BASIS, DType, Header, MsgType, pack_header, unpack_header

pytestmark = pytest.mark.ps_kernels

N = 2048
GEOMETRY = ModelGeometry(N)  # shard_kib=4: two shards of 1024 floats
MAX_VECTORS = 4


@pytest.fixture(scope="module")
def server():
    with local_server(GEOMETRY, shard_kib=4, max_vectors=MAX_VECTORS) as server:
        yield server


@pytest.fixture
def client(server):
    with PSClient([str(server.address)], server.options.job, client_id=9, timeout_s=2.0) as c:
        yield c


def named(server) -> list[int]:
    return [len(shard.vectors) for shard in server.shards]


def honest_push_lands(client: PSClient) -> None:
    before = np.empty(N, np.float32)
    client.pull(before)
    client.push_deltas(np.ones(N, np.float32))
    after = np.empty(N, np.float32)
    client.pull(after)
    np.testing.assert_array_equal(after, before + 1.0)


def test_named_vectors_stop_at_the_limit_and_reads_allocate_nothing(server, client):
    v = ShardVectors(client)
    for k in range(MAX_VECTORS):
        v.fill(f"v{k}", float(k))
    assert named(server) == [MAX_VECTORS, MAX_VECTORS]
    with pytest.raises(HogwildError, match=f"{MAX_VECTORS} named vectors"):
        v.fill("one_more", 1.0)
    with pytest.raises(HogwildError, match=f"{MAX_VECTORS} named vectors"):
        client.push_deltas(np.ones(N, np.float32), into="one_more")
    for k in range(200):  # reads of names never written: zeros, nothing kept
        assert v.dot(f"ghost{k}", "v3") == 0.0
        assert v.amax(f"ghost{k}") == 0.0
    v.copy("ghost", "v1")  # reading a ghost into a vector that exists: allowed, zeros
    assert v.asum("v1") == 0.0
    assert named(server) == [MAX_VECTORS, MAX_VECTORS]
    assert v.asum("v2") == 2.0 * N  # the vectors there are intact
    status = client.status()[0]
    assert [s["vectors"] for s in status["shards"]] == [MAX_VECTORS, MAX_VECTORS]
    assert status["max_vectors"] == MAX_VECTORS
    honest_push_lands(client)


def test_with_copies_a_shards_vectors_fit_one_snapshot_frame():
    """A copy catches up from one frame of a shard's named vectors: with copies, no more are
    allowed than that frame holds (64 of 1 MiB shards), whatever ``ps.max_vectors`` says."""
    from hogwild_plugins.ps.serving.options import ServerOptions
    from hogwild_plugins.ps.serving.server import ParameterServer

    from hogwild.net.wire import MAX_ARRAY_BYTES

    servers = ("127.0.0.1:7001", "127.0.0.1:7002")  # never started: nothing is bound

    def allowed(copies: int) -> int:
        options = ServerOptions(job="frames", servers=servers, copies=copies, max_vectors=100,
                                shard_kib=1024, etcd="127.0.0.1:2379")  # fmt: skip
        server = ParameterServer(ModelGeometry(4 * 262144), options)
        assert server.layout.shard_floats * 4 * server.max_vectors <= MAX_ARRAY_BYTES or copies == 1
        return server.max_vectors

    assert allowed(copies=2) == MAX_ARRAY_BYTES // 2**20 == 64
    assert allowed(copies=1) == 100  # one copy: no snapshot to fit


def test_the_request_table_takes_only_this_jobs_requests(server, client):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address.endpoint)
    held = len(server.router.window)
    delta = np.ones(16, np.float32).tobytes()
    try:
        for first in range(1, 501, 50):  # in windows of 50, as a client sends
            for sender in range(first, first + 50):
                header = Header(MsgType.PUSH_DELTAS, job=12345, sender=sender, seq=sender,
                                shape=(16,), dtype=DType.FLOAT32, frames=1,
                                flags=NO_BASIS)  # fmt: skip
                sock.send_multipart([pack_header(header), delta])
            for _ in range(50):
                assert sock.poll(3000)
                assert unpack_header(sock.recv_multipart()[0]).type == MsgType.ERROR
    finally:
        sock.close(linger=0)
        ctx.term()
    assert len(server.router.window) == held  # nothing of the other job's was kept
    assert client.status()[0]["errors"]["WRONG_JOB"] >= 500
    honest_push_lands(client)


def test_replies_to_a_client_that_never_reads_are_bounded():
    """A reader that asks and never reads holds at most the router's ``reply_hwm`` replies in
    the server (the rest are dropped: a client that reads retries them); 1 MiB pulls here."""
    geometry = ModelGeometry(4 * 262144)  # four shards of 1 MiB
    with local_server(geometry, threads=1) as big:
        hwm = big.router.reply_hwm
        assert hwm == 128  # 128 MiB of replies
        asked = 2 * hwm + 40
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 1)
        sock.setsockopt(zmq.RCVBUF, 65536)
        sock.connect(big.address.endpoint)
        job = big.job
        try:
            for seq in range(1, asked + 1):
                sock.send(pack_header(Header(MsgType.PULL, job=job, sender=77, seq=seq,
                                             target=seq % 4)))  # fmt: skip
            deadline = time.monotonic() + 30
            while big.router.received < asked:  # every request taken, none of its replies read
                assert time.monotonic() < deadline, big.router.received
                time.sleep(0.05)
            got = 0
            while sock.poll(1000):
                sock.recv_multipart()
                got += 1
        finally:
            sock.close(linger=0)
            ctx.term()
    assert 0 < got <= hwm + 16, got  # the high-water mark, and what the TCP buffers held


def test_a_request_without_the_job_id_learns_nothing(server, client):
    """``PING`` and ``STATUS`` of job 0 (anyone's): a bare acknowledgement and a refusal; the
    job's name, layout and config go only to those who name the job."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address.endpoint)
    try:
        sock.send(pack_header(Header(MsgType.PING, seq=1)))
        assert sock.poll(3000)
        ping = sock.recv_multipart()
        sock.send(pack_header(Header(MsgType.STATUS, seq=2)))
        assert sock.poll(3000)
        status = sock.recv_multipart()
    finally:
        sock.close(linger=0)
        ctx.term()
    head = unpack_header(ping[0])
    assert (head.type, head.version, len(ping)) == (MsgType.ACK, 0, 1)
    head = unpack_header(status[0])
    assert head.type == MsgType.ERROR and len(status) == 2
    assert server.options.job.encode() not in status[1] and b"--job" in status[1]
    assert client.status()[0]["job"] == server.options.job  # the job's own clients: all of it
