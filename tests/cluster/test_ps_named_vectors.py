"""Pushes into named vectors and the ``asum``/``amax`` reductions, over real sockets.

A push ``into`` a named vector must land in that vector only (not in the parameters, not in any
other vector), leave every version unchanged, and be applied in order with what follows it on
the shard (a reduction sent right after sees it); a bad name is refused by the server naming it;
servers keeping copies replicate it as they replicate vector operations (each write a version).
The reductions are checked against numpy, and the status carries the update rule's parameters.
"""

from __future__ import annotations

import numpy as np
import pytest
import zmq
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.sandblaster.vectors import ShardVectors
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.errors import HogwildError
from hogwild.net.ports import free_ports
from hogwild.net.wire import (
    NO_BASIS,
    DType,
    ErrorCode,
    Header,
    MsgType,
    job_id,
    pack_header,
    unpack_header,
)

pytestmark = pytest.mark.ps_kernels

N = 5000
GEOMETRY = ModelGeometry(N)  # shard_kib=4: five shards of 1024 floats, the last 904


def client_for(server, **kw) -> PSClient:
    return PSClient([str(server.address)], server.options.job, client_id=kw.pop("cid", 1), **kw)


def read_vector(client: PSClient, name: str) -> np.ndarray:
    """A named vector's values (copied into the parameters and pulled: bumps the versions)."""
    ShardVectors(client).copy(name, "params")
    out = np.empty(client.layout.n_params, np.float32)
    client.pull(out)
    return out


@pytest.mark.parametrize(("recv", "ack"), [("inplace", "queued"), ("pool", "applied")])
def test_a_named_push_lands_in_its_vector_only_without_a_version_and_in_order(recv, ack):
    rng = np.random.default_rng(7)
    init = rng.standard_normal(N).astype(np.float32)
    ranges = [(10, 20), (1000, 3100)]  # the second crosses two shard edges
    with local_server(GEOMETRY, initial=init, shard_kib=4, recv=recv, ack=ack) as server:
        with client_for(server) as c:
            v = ShardVectors(c)
            v.fill("other", 5.0)
            want = np.zeros(N, np.float32)
            ones = np.ones(N, np.float32)
            for k in range(1, 21):
                delta = rng.standard_normal(N).astype(np.float32)
                versions = c.push_deltas(delta, ranges=ranges, into="grad")
                for lo, hi in ranges:
                    want[lo:hi] += delta[lo:hi]
                assert (versions == 0).all()
                c.push_deltas(ones, ranges=[(4990, 5000)], into="count")
                # sent right after the pushes' acknowledgements, applied after the pushes
                assert v.asum("count") == 10.0 * k
                assert v.dot("grad", "grad") == pytest.approx(float(want @ want), rel=1e-6)
            assert (c.versions == 0).all()
            assert [s["version"] for s in c.status()[0]["shards"]] == [0] * 5
            assert v.asum("other") == 5.0 * N and v.amax("other") == 5.0  # untouched
            params = np.empty(N, np.float32)
            assert (c.pull(params) == 0).all()
            np.testing.assert_array_equal(params, init)  # not in the parameters
            np.testing.assert_array_equal(read_vector(c, "grad"), want)  # exactly the sum
        if recv == "pool":
            assert server.receive_pool.pool.in_use() == 0  # both frames' blocks went back


def test_asum_and_amax_match_numpy_and_status_shows_the_rule():
    rng = np.random.default_rng(8)
    init = (rng.standard_normal(N) * 3).astype(np.float32)
    opts = {"rule": "momentum", "lr": 0.25, "momentum": 0.8, "shard_kib": 4}
    with local_server(GEOMETRY, initial=init, **opts) as server, client_for(server) as c:
        wide = np.abs(init.astype(np.float64))
        v = ShardVectors(c)
        assert v.asum("params") == pytest.approx(float(wide.sum()), rel=1e-12)
        assert v.amax("params") == float(wide.max())
        per_shard = c.vector_op("amax", "params")
        assert per_shard.shape == (5,) and per_shard.max() == float(wide.max())
        assert (c.versions == 0).all()  # reductions write nothing
        status = c.status()[0]
        assert (status["rule"], status["lr"], status["momentum"]) == ("momentum", 0.25, 0.8)
        assert {"staleness_decay", "max_staleness", "adagrad_eps"} <= set(status)


def send_raw(server, header: Header, frames: list) -> tuple[Header, str]:
    """One request on a bare DEALER socket; the reply's header and text."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(server.address.endpoint)
    try:
        sock.send_multipart([pack_header(header), *frames])
        assert sock.poll(5000), "no answer"
        reply = sock.recv_multipart()
    finally:
        sock.close(linger=0)
        ctx.term()
    return unpack_header(reply[0]), (reply[1].decode() if len(reply) > 1 else "")


def test_bad_named_pushes_are_refused_naming_what_is_wrong():
    delta = np.ones(N, np.float32)
    with local_server(GEOMETRY, shard_kib=4) as server, client_for(server) as c:
        for name in ("params", "a b", "x" * 65, ""):
            with pytest.raises(HogwildError, match="vector name"):
                c.push_deltas(delta, into=name)
        with pytest.raises(HogwildError, match="takes no basis"):
            c.push_deltas(delta, basis=c.versions, into="grad")
        base = Header(
            MsgType.PUSH_DELTAS,
            job=job_id("test"),
            sender=9,
            target=1,
            offset=4,
            shape=(8,),
            dtype=DType.FLOAT32,
            frames=2,
            flags=NO_BASIS,
        )
        d = np.ones(8, np.float32)
        cases = [
            (base._replace(aux=8), [d, b"bad name"], ErrorCode.BAD_NAME, "'bad name'"),
            (base._replace(aux=6), [d, b"params"], ErrorCode.BAD_NAME, "'params'"),
            (base._replace(aux=4), [d, b"gr,d"], ErrorCode.BAD_NAME, "'gr,d'"),
            (base._replace(aux=5), [d, b"grad"], ErrorCode.BAD_FRAMES, "4 bytes, expected 5"),
            (base, [d, b"grad"], ErrorCode.BAD_NAME, "name of 0 bytes"),
            (base._replace(aux=4, version=2), [d, b"grad"], ErrorCode.BAD_HEADER, "no basis"),
            (base._replace(aux=4, a=1.0), [d, b"grad"], ErrorCode.BAD_HEADER, "no scalars"),
            (base._replace(aux=4, offset=1020), [d, b"grad"], ErrorCode.BAD_RANGE, "[1020"),
            (base._replace(aux=4, frames=1), [d], ErrorCode.BAD_HEADER, "aux = 4"),
        ]
        for i, (header, frames, code, text) in enumerate(cases):
            reply, message = send_raw(server, header._replace(seq=i + 1), frames)
            assert (reply.type, reply.code) == (MsgType.ERROR, code), (i, message)
            assert text in message, (i, message)
        assert ShardVectors(c).asum("grad") == 0.0  # nothing landed
        assert [s["version"] for s in c.status()[0]["shards"]] == [0] * 5


def test_replicated_servers_take_named_pushes_and_vector_operations(etcd_server):
    servers = tuple(f"127.0.0.1:{port}" for port in free_ports(2))
    common = dict(servers=servers, copies=2, etcd=etcd_server.address, shard_kib=4, lease_s=1)
    with (
        local_server(GEOMETRY, index=0, **common),
        local_server(GEOMETRY, index=1, **common),
        PSClient(servers, "test", client_id=1, etcd=etcd_server.address) as c,
    ):
        c.push_deltas(np.ones(N, np.float32))  # the parameters are replicated
        before = c.versions.copy()
        c.push_deltas(np.ones(N, np.float32), into="grad")  # replicated: a version each
        v = ShardVectors(c)
        assert v.asum("grad") == N and v.asum("params") == N
        assert (c.versions >= before + 1).all()
