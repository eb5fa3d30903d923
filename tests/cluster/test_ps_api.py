"""The parameter server over real sockets: rules, staleness, both update APIs, pulls, vector
operations, retries, unreachable servers, receive and acknowledgement modes."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from hogwild_plugins.ps import kernels
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.connection import PSRequestError
from hogwild_plugins.ps.layout import FcLayer, ModelGeometry
from hogwild_plugins.ps.sandblaster.vectors import ShardVectors
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.errors import HogwildError
from hogwild.net.channel import PeerUnreachableError
from hogwild.net.ports import free_port
from hogwild.net.wire import DType, Header, MsgType, job_id, pack_header, unpack_header
from tests.unit.test_ps_kernels import reference

pytestmark = pytest.mark.ps_kernels

N = 5000
FC = FcLayer(layer=4, offset=1000, n_in=37, n_out=41)  # W cut by shard edges at 1024 and 2048
GEOMETRY = ModelGeometry(N, (FC,))
RULES = {"sgd": 0, "momentum": 1, "adagrad": 2, "staleness": 3}


def client_for(server, **kw) -> PSClient:
    return PSClient([str(server.address)], server.options.job, client_id=kw.pop("cid", 1), **kw)


@pytest.mark.parametrize("rule", ["sgd", "momentum", "adagrad", "staleness"])
def test_each_rule_matches_numpy_with_versions_and_staleness(rule):
    rng = np.random.default_rng(1)
    init = rng.standard_normal(N).astype(np.float32)
    opts = {"rule": rule, "lr": 0.5, "momentum": 0.8, "staleness_decay": 0.5, "shard_kib": 4}
    with local_server(GEOMETRY, initial=init, **opts) as server, client_for(server) as client:
        n_shards = client.layout.n_shards
        want, state = init.copy(), np.zeros(N, np.float32)
        for step in range(6):
            delta = rng.standard_normal(N).astype(np.float32)
            basis = np.full(n_shards, max(0, step - 2), np.uint64)  # 0..2 versions stale
            versions = client.push_deltas(delta, basis=basis)
            assert (versions == step + 1).all()
            coef = 0.5 ** min(step, 2) if rule == "staleness" else 1.0
            want, state = reference(RULES[rule], want, state, [(0, delta, coef)], lr=0.5, mu=0.8)
        out = np.empty(N, np.float32)
        assert (client.pull(out) == 6).all()
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        hist = client.status()[0]["staleness_histogram"]
        assert hist == {"0": n_shards, "1": n_shards, "2-3": 4 * n_shards}


@pytest.mark.parametrize("eps", [0.0, -1e-8, 1e-50])  # 1e-50 is 0 in float32
def test_adagrad_without_a_positive_epsilon_is_refused(eps):
    with pytest.raises(HogwildError, match="adagrad_eps must be > 0 and representable in float32"):
        with local_server(GEOMETRY, rule="adagrad", adagrad_eps=eps):
            pass


def test_staler_than_max_staleness_is_refused_and_counted():
    with local_server(GEOMETRY, shard_kib=4, max_staleness=2) as server, client_for(server) as c:
        ones = np.ones(N, np.float32)
        for _ in range(4):
            c.push_deltas(ones, basis=np.zeros(c.layout.n_shards, np.uint64))
        # versions 0, 1, 2 were admitted (staleness 0..2); the 4th push is 3 stale
        assert c.refused == c.layout.n_shards
        out = np.empty(N, np.float32)
        assert (c.pull(out) == 3).all() and (out == 3).all()
        assert c.status()[0]["refused_stale"] == c.layout.n_shards


@pytest.mark.parametrize("rule", ["sgd", "adagrad"])
@pytest.mark.parametrize("decay", [0.0, 0.004], ids=["no-decay", "weight-decay"])
def test_vectors_equal_deltas_with_the_outer_products_done_by_the_client(rule, decay):
    rng = np.random.default_rng(2)
    init = rng.standard_normal(N).astype(np.float32)
    k, lr = 16, 0.05
    acts = rng.standard_normal((k, FC.n_in)).astype(np.float32)
    errs = rng.standard_normal((k, FC.n_out)).astype(np.float32)
    delta = np.zeros(N, np.float32)
    w = init[FC.offset : FC.offset + FC.size]
    delta[FC.offset : FC.offset + FC.size] = (-lr * errs.T @ acts).reshape(-1) - decay * w
    outs = []
    for api in ("vectors", "deltas"):
        with local_server(GEOMETRY, initial=init, rule=rule, shard_kib=4) as server:
            with client_for(server) as client:
                if api == "vectors":
                    versions = client.push_vectors(FC.layer, acts, errs, lr, decay=decay)
                else:
                    versions = client.push_deltas(delta, ranges=[(FC.offset, FC.offset + FC.size)])
                assert list(versions[:3]) == [1, 1, 1] and versions[3:].sum() == 0
                outs.append(np.empty(N, np.float32))
                client.pull(outs[-1])
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    assert not np.array_equal(outs[0], init)


def test_bad_vector_requests_are_refused_by_the_server():
    with local_server(GEOMETRY, shard_kib=4) as server, client_for(server) as client:
        with pytest.raises(Exception, match="not a fully connected layer"):
            client.push_vectors(3, np.ones((2, 37), np.float32), np.ones((2, 41), np.float32), 1)
        wrong = (FcLayer(4, 1000, 36, 41),)  # the client believes in another geometry
        client.layout = dataclasses.replace(client.layout, fc_layers=wrong)
        with pytest.raises(PSRequestError, match="BAD_LAYER.*takes 37 inputs"):
            client.push_vectors(4, np.ones((2, 36), np.float32), np.ones((2, 41), np.float32), 1)
        client.layout = dataclasses.replace(client.layout, fc_layers=(FC,))
        acts, errs = np.ones((2, 37), np.float32), np.ones((2, 41), np.float32)
        with pytest.raises(PSRequestError, match="BAD_VALUE.*weight decay"):
            client.push_vectors(4, acts, errs, 0.1, decay=1.5)


def test_pulls_see_pushes_and_partial_ranges_touch_only_their_shards():
    with local_server(GEOMETRY, shard_kib=4, threads=2) as server, client_for(server) as client:
        delta = np.arange(N, dtype=np.float32)
        versions = client.push_deltas(delta, ranges=[(10, 20), (3000, 4000)])
        assert list(versions) == [1, 0, 1, 1, 0]
        out = np.zeros(N, np.float32)
        assert list(client.pull(out, shards=[0, 2])) == [1, 1]
        assert (out[10:20] == delta[10:20]).all() and out[:10].sum() == 0
        assert (out[3000:3072] == delta[3000:3072]).all()
        assert out[4096:].sum() == 0  # shard 4 was not pulled


def test_a_pinned_buffer_sends_what_it_holds_at_each_push():
    """Pinned ranges go out as long-lived frames over the buffer: each push carries the
    buffer's bytes of that moment (a frame kept from the first push must not replay it)."""
    n = 3 * 32768  # shards of 128 KiB: ranges above the pinned-frame minimum
    with (
        local_server(ModelGeometry(n, ()), shard_kib=128, threads=2) as server,
        client_for(server) as client,
    ):
        buffer = np.zeros(n, np.float32)
        client.pin(buffer)
        expected = np.zeros(n, np.float32)
        ranges = [(0, 32768), (32768, 32768 + 20000), (70000, 70010)]  # whole, large, small
        for step in range(1, 6):
            buffer[:] = np.arange(n, dtype=np.float32) % 7 + step
            client.push_deltas(buffer, ranges=ranges)
            for lo, hi in ranges:
                expected[lo:hi] += buffer[lo:hi]
        assert client.pinned.frames_of(buffer) == 2  # the small range went as a view
        out = np.zeros(n, np.float32)
        client.pull(out)
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    ("cpus", "recv", "expected"),
    [({0}, "auto", "inplace"), ({0, 1}, "auto", "pool"), ({0}, "pool", "pool")],
)
def test_auto_receives_into_pool_blocks_on_two_cpus_or_more_and_in_place_on_one(
    cpus, recv, expected
):
    if not cpus <= os.sched_getaffinity(0):
        pytest.skip(f"needs CPUs {sorted(cpus)}")
    with local_server(GEOMETRY, shard_kib=4, threads=1, cpus=cpus, recv=recv) as server:
        assert server.status()["recv"] == expected
        assert (server.receive_pool is not None) == (expected == "pool")
        with client_for(server) as client:  # and it serves either way
            delta = np.arange(N, dtype=np.float32)
            client.push_deltas(delta)
            out = np.zeros(N, np.float32)
            client.pull(out)
            np.testing.assert_array_equal(out, delta)


def test_auto_keeps_frames_in_place_with_copies_whose_primaries_forward_them():
    from hogwild_plugins.ps.serving.options import ServerOptions
    from hogwild_plugins.ps.serving.server import ParameterServer

    options = ServerOptions(job="t", servers=("127.0.0.1:0",), copies=3, etcd="127.0.0.1:1")
    server = ParameterServer(GEOMETRY, options)  # not started: no etcd needed
    try:
        assert server._recv_mode(8) == "inplace" and server.status()["recv"] == "auto"
    finally:
        server.stop()


def test_with_every_pool_block_in_flight_a_push_is_received_in_place_not_refused():
    with local_server(GEOMETRY, shard_kib=4, threads=1, recv="pool") as server:
        taken = []
        while (handle := server.receive_pool.pool.try_allocate(4096)) is not None:
            taken.append(handle)  # every block of the 4 KiB class (the shards' size)
        with client_for(server) as client:
            delta = np.arange(N, dtype=np.float32)
            client.push_deltas(delta)
            out = np.zeros(N, np.float32)
            client.pull(out)
            np.testing.assert_array_equal(out, delta)
        status = server.status()
        assert status["pool_misses"] >= 4 and status["errors"].get("BUSY", 0) == 0
        for handle in taken:
            server.receive_pool.pool.free(handle)


def test_a_pull_of_a_settled_shard_is_answered_by_the_network_thread_and_sees_every_push():
    with local_server(GEOMETRY, shard_kib=4) as server, client_for(server) as client:
        out, total = np.zeros(N, np.float32), np.zeros(N, np.float32)
        for step in range(50):  # each pull right after a push: queued or at once, never stale
            delta = np.full(N, step + 1, np.float32)
            client.push_deltas(delta)
            total += delta
            assert (client.pull(out) == step + 1).all()
            np.testing.assert_array_equal(out, total)
        deadline = time.monotonic() + 10.0
        while True:  # once the pushes are applied, every shard is read by the network thread
            before = client.status()[0]["pulls_at_once"]
            client.pull(out)
            np.testing.assert_array_equal(out, total)
            if client.status()[0]["pulls_at_once"] == before + client.layout.n_shards:
                break
            assert time.monotonic() < deadline, "pulls of settled shards still went queued"
            time.sleep(0.01)


def test_a_push_to_an_idle_shard_is_applied_by_the_network_thread_and_equals_the_queued_path():
    rng = np.random.default_rng(9)
    deltas = [rng.standard_normal(N).astype(np.float32) for _ in range(30)]
    ends = []
    for direct in (True, False):
        with local_server(GEOMETRY, shard_kib=4, rule="adagrad", direct_pushes=direct) as server:
            with client_for(server) as client:
                out = np.zeros(N, np.float32)
                deadline = time.monotonic() + 10.0
                for delta in deltas:  # a pull after each push: every shard idle before the next
                    client.push_deltas(delta)
                    client.pull(out)
                at_once = client.status()[0]["pushes_at_once"]
                while direct and at_once == 0:  # each push found its thread idle, bar a race
                    client.push_deltas(np.zeros(N, np.float32))
                    at_once = client.status()[0]["pushes_at_once"]
                    assert time.monotonic() < deadline, "no push was applied at once"
                assert (at_once > 0) == direct
                ends.append(out.copy())
    np.testing.assert_array_equal(ends[0], ends[1])  # the same rule, the same order: bit for bit


@pytest.mark.parametrize("ack", ["queued", "applied"])
def test_a_push_applied_by_the_network_thread_is_acknowledged_as_its_ack_mode_says(ack):
    """With ack = "queued" the acknowledgement goes out first, the add right behind it (a pull
    after it still sees it); with "applied", the add first. An add that fails after its
    acknowledgement went out cannot be answered: it is counted, the shard's bucket stops (a pull
    of it is refused STOPPED, naming the failed write: its memory no longer holds what was
    acknowledged), the shard's thread is let go, and the server goes on serving the others."""
    with local_server(GEOMETRY, shard_kib=4, ack=ack) as server, client_for(server) as client:
        engine, order = server.engine, []
        apply_claimed = engine.apply_claimed

        def watched(work):
            order.append(("apply", work.version))
            apply_claimed(work)

        engine.apply_claimed = watched
        reply = server.router._reply

        def replied(identity, answer):
            if answer.header.type == MsgType.ACK:
                order.append(("ack", answer.header.version))
            reply(identity, answer)

        server.router._reply = replied
        out = np.zeros(N, np.float32)
        client.push_deltas(np.ones(N, np.float32), ranges=[(0, 100)])  # shard 0 alone
        client.pull(out)
        assert out[:100].tolist() == [1.0] * 100
        first = [("ack", 1), ("apply", 1)] if ack == "queued" else [("apply", 1), ("ack", 1)]
        assert order == first
        if ack == "applied":
            return

        def broken(*args):
            raise RuntimeError("the add failed")

        add = kernels.apply_delta
        kernels.apply_delta = broken  # the engine's own failure path runs
        try:
            client.push_deltas(np.ones(N, np.float32), ranges=[(0, 100)])  # acknowledged only
            with pytest.raises(PSRequestError, match="STOPPED.*the add failed"):
                client.pull(out, shards=[0])  # answered after the add was tried
        finally:
            kernels.apply_delta = add
        status = server.status()
        assert status["failed_after_ack"] == 1 and status["buckets_stopped"] == 1
        layout = server.layout
        stopped = layout.bucket_of(0)
        shard = next(s for s in range(layout.n_shards) if layout.bucket_of(s) != stopped)
        lo = shard * layout.shard_floats  # a shard of another bucket: still served
        client.push_deltas(np.full(N, 2.0, np.float32), ranges=[(lo, lo + 10)])
        with client_for(server, cid=2) as other:  # what any client pulls after the ack
            other.pull(out, shards=[shard])
        assert out[lo : lo + 10].tolist() == [2.0] * 10
        status = client.status()[0]
        assert status["errors"] == {"INTERNAL": 1, "STOPPED": 1}  # the failure; the pull
        assert any("the add failed" in f for f in status["failures"]), status["failures"]
        shard0 = status["shards"][0]
        assert shard0["applied"] == shard0["version"] == 2  # the failed one counted, not added


def test_a_direct_push_that_fails_after_admission_is_refused_and_leaves_the_shard_serving():
    """Its version was given out: counted as applied (the shard's counts stay aligned), the
    shard's thread let go, the client told INTERNAL; the next push goes through."""
    with local_server(GEOMETRY, shard_kib=4) as server, client_for(server, retries=0) as client:
        free_later = server._free_later

        def broken(frames):
            raise RuntimeError("no buffers")

        server._free_later = broken
        with pytest.raises(PSRequestError, match="INTERNAL"):
            client.push_deltas(np.ones(N, np.float32), ranges=[(0, 100)])
        server._free_later = free_later
        client.push_deltas(np.full(N, 2.0, np.float32), ranges=[(0, 100)])
        out = np.zeros(N, np.float32)
        client.pull(out)
        assert out[:100].tolist() == [2.0] * 100
        shard0 = client.status()[0]["shards"][0]
        assert shard0["applied"] == shard0["version"] == 2


def test_without_direct_pulls_every_pull_queues_and_still_sees_every_push():
    with local_server(GEOMETRY, shard_kib=4, direct_pulls=False) as server:
        with client_for(server) as client:
            out, total = np.zeros(N, np.float32), np.zeros(N, np.float32)
            for step in range(20):
                delta = np.full(N, step + 1, np.float32)
                client.push_deltas(delta)
                total += delta
                assert (client.pull(out) == step + 1).all()
                np.testing.assert_array_equal(out, total)
            assert client.status()[0]["pulls_at_once"] == 0


@pytest.mark.parametrize(
    "direct", [True, False], ids=["network-thread-applies", "update-threads-apply"]
)
def test_push_and_pull_in_one_exchange_sees_its_own_push_every_time(direct):
    """The pulls go out behind the pushes without waiting for the acknowledgements: the server
    must answer them in order, with every push before them applied (queued or at once)."""
    opts = {"shard_kib": 4, "threads": 2, "direct_pushes": direct, "direct_pulls": direct}
    with local_server(GEOMETRY, **opts) as server, client_for(server) as client:
        out, total = np.zeros(N, np.float32), np.zeros(N, np.float32)
        ranges = [(0, 1500), (3100, N)]  # a copy's ranges: some shards partly, shard 2 not at all
        basis = None
        for step in range(60):
            delta = np.full(N, step + 1, np.float32)
            basis = client.push_and_pull(delta, out, basis=basis, ranges=ranges)
            for lo, hi in ranges:
                total[lo:hi] += delta[lo:hi]
            np.testing.assert_array_equal(out, total)
            assert list(basis) == list(client.versions)
        assert list(basis) == [60, 60, 0, 60, 60]
        hist = client.status()[0]["staleness_histogram"]  # each push made against the last pull
        assert hist == {"0": 60 * 4}


def test_a_push_refused_busy_behind_which_its_pull_was_answered_is_pulled_again():
    """The pull right behind a push the server could not take (its work slots all taken) reads
    the shard before the push is sent again: push_and_pull reads that shard once more."""
    with local_server(GEOMETRY, shard_kib=4, direct_pushes=False) as server:
        with client_for(server) as client:
            taken = []
            while (slot := server.engine.reserve()) is not None:
                taken.append(slot)
            assert taken  # every slot is held here: a queued push is refused BUSY

            def give_back():
                for slot in taken:
                    server.engine.unreserve(slot)

            timer = threading.Timer(0.2, give_back)
            timer.start()
            try:
                out = np.zeros(N, np.float32)
                delta = np.full(N, 3.0, np.float32)
                versions = client.push_and_pull(delta, out)
            finally:
                timer.join()
            np.testing.assert_array_equal(out, delta)
            assert list(versions) == [1] * client.layout.n_shards
            assert server.router.errors["BUSY"] >= 1  # the push was refused at least once


def test_a_server_on_an_ipc_address_serves_and_removes_its_socket_file():
    # a short directory: a socket's path is limited to 107 bytes, which a long TMPDIR may pass
    with tempfile.TemporaryDirectory(prefix="hw-", dir="/tmp") as folder:
        path = Path(folder) / "ps.sock"
        with local_server(GEOMETRY, servers=(f"ipc://{path}",), threads=1) as server:
            assert path.is_socket()
            with client_for(server) as client:
                client.push_deltas(np.ones(N, np.float32))
                out = np.zeros(N, np.float32)
                client.pull(out)
                assert (out == 1.0).all()
        assert not path.exists()  # ZeroMQ leaves it; the server's router removes it


def test_a_stopping_server_leaves_the_socket_file_of_a_later_server_on_its_path():
    """ZeroMQ binds an ipc path over an existing file: the first server's stop must not remove
    the file of the second, which still serves on it."""
    with tempfile.TemporaryDirectory(prefix="hw-", dir="/tmp") as folder:
        path = Path(folder) / "ps.sock"
        servers = (f"ipc://{path}",)
        with local_server(GEOMETRY, servers=servers, threads=1) as first:
            with local_server(GEOMETRY, servers=servers, threads=1) as later:
                first.stop()
                assert path.is_socket()
                with client_for(later) as client:
                    out = np.ones(N, np.float32)
                    client.pull(out)
                    assert (out == 0.0).all()
        assert not path.exists()


def test_vector_operations_run_shard_locally_and_versions_follow_writes():
    rng = np.random.default_rng(4)
    init = rng.standard_normal(N).astype(np.float32)
    with local_server(GEOMETRY, initial=init, shard_kib=4) as server, client_for(server) as c:
        v = ShardVectors(c)
        assert v.dot("params", "params") == pytest.approx(float(init @ init), rel=1e-5)
        v.copy("params", "x")
        v.fill("y", 2.0)
        v.axpy(0.5, "y", "x")  # x = init + 1
        v.mul("x", "y", "z")  # z = 2 (init + 1)
        assert v.dot("z", "y") == pytest.approx(float(4 * (init + 1).sum()), rel=1e-4)
        assert (c.versions == 0).all()  # nothing wrote the parameters yet
        v.scale(0.0, "params")
        v.axpy(1.0, "z", "params")
        out = np.empty(N, np.float32)
        assert (c.pull(out) == 2).all()
        np.testing.assert_allclose(out, 2 * (init + 1), rtol=1e-6)


def test_a_resent_request_is_applied_once_and_answered_again():
    with local_server(GEOMETRY, shard_kib=4) as server:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(server.address.endpoint)
        header = Header(
            MsgType.PUSH_DELTAS,
            job=job_id("test"),
            sender=5,
            seq=(9 << 32) | 1,
            target=0,
            shape=(4,),
            dtype=DType.FLOAT32,
            frames=1,
        )
        try:
            frames = [pack_header(header), np.ones(4, np.float32)]
            sock.send_multipart(frames)
            assert sock.poll(5000)
            first = unpack_header(sock.recv_multipart()[0])
            sock.send_multipart(frames)  # a retry of a request already applied
            sock.send_multipart(frames)
            again = []
            for _ in range(2):
                assert sock.poll(5000)
                again.append(unpack_header(sock.recv_multipart()[0]))
            assert all(a.type == MsgType.ACK and a.version == 1 for a in [first, *again])
        finally:
            sock.close(linger=0)
            ctx.term()
        assert server.status()["shards"][0]["applied"] == 1
        assert server.status()["duplicates"] == 2


def test_a_server_that_never_answers_is_an_error_naming_it():
    port = free_port()
    started = time.monotonic()
    with pytest.raises(PeerUnreachableError, match=f"127.0.0.1:{port} did not answer"):
        PSClient([f"127.0.0.1:{port}"], "test", client_id=1, timeout_s=0.3, retries=2)
    assert time.monotonic() - started < 5


def test_a_refused_header_is_answered_as_an_error_of_the_request_that_sent_it():
    with local_server(GEOMETRY, shard_kib=4) as server:
        request = Header(MsgType.PULL, job=job_id(server.options.job), sender=7, seq=4242)
        raw = bytearray(pack_header(request))
        raw[5] = 250  # an unknown message type
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(server.address.endpoint)
        try:
            sock.send_multipart([bytes(raw)])
            assert sock.poll(5000), "no answer to a refused header"
            reply = unpack_header(sock.recv_multipart()[0])
        finally:
            sock.close(linger=0)
            ctx.term()
        assert reply.type == MsgType.ERROR and (reply.sender, reply.seq) == (7, 4242)


def test_wrong_job_is_refused():
    with local_server(GEOMETRY, shard_kib=4) as server:
        with pytest.raises(PSRequestError, match="WRONG_JOB"):
            PSClient([str(server.address)], "another", client_id=1)


@pytest.mark.parametrize(("recv", "ack"), [("pool", "queued"), ("inplace", "applied")])
def test_receive_into_pool_blocks_and_acknowledge_when_applied(recv, ack):
    rng = np.random.default_rng(5)
    with local_server(GEOMETRY, shard_kib=4, recv=recv, ack=ack) as server:
        with client_for(server) as client:
            total = np.zeros(N, np.float32)
            for _ in range(20):
                delta = rng.integers(-4, 5, N).astype(np.float32)
                total += delta
                client.push_deltas(delta)
            acts = np.ones((3, FC.n_in), np.float32)
            client.push_vectors(FC.layer, acts, np.ones((3, FC.n_out), np.float32), 1.0)
            total[FC.offset : FC.offset + FC.size] -= 3.0
            out = np.empty(N, np.float32)
            assert (client.pull(out)[:3] == 21).all()
            np.testing.assert_array_equal(out, total)
        if recv == "pool":
            assert server.receive_pool.pool.in_use() == 0  # every block went back
