"""Fencing zombie replicas with real servers: once the driver replaced an incarnation of a replica
(:class:`hogwild.cluster.fences.ReplicaFences`), every server refuses what that incarnation sends
(``REPLACED``, counted, with the reason), also after a failover and after a server's restart, while
the replica's next incarnation and every other client go on."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.connection import PSRequestError
from hogwild_plugins.ps.etcd import Etcd
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.routes import Routes, etcd_prefix
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.cluster.fences import ReplicaFences
from hogwild.net.control import ControlClient, ControlRefused
from hogwild.net.fencing import fencing_token
from hogwild.net.ports import free_port
from hogwild.net.wire import ErrorCode
from tests.cluster.test_ps_failover import JOB, N_PARAMS, wait_in_sync

pytestmark = pytest.mark.ps_kernels

N = 3000
GEOMETRY = ModelGeometry(N, ())


def _refused(call) -> PSRequestError:
    with pytest.raises(PSRequestError) as caught:
        call()
    return caught.value


def test_a_fenced_incarnation_is_refused_and_the_next_one_is_not():
    with local_server(GEOMETRY, shard_kib=4, rule="sgd", lr=1.0) as server:
        address = str(server.address)
        clients = {
            "zombie": PSClient([address], "test", client_id=1, token=fencing_token(0, 0)),
            "other": PSClient([address], "test", client_id=2, token=fencing_token(1, 0)),
            "driver": PSClient([address], "test", client_id=3),  # token 0: never fenced
        }
        fences = ReplicaFences("test", [address], timeout_s=2.0, retries=1)
        try:
            ones = np.ones(N, np.float32)
            for client in clients.values():
                client.push_deltas(ones)
            assert fences.replace(0) == 1
            assert fences.replace(0) == 1  # taken for dead twice before its restart: one fence
            error = _refused(lambda: clients["zombie"].push_deltas(ones))
            assert error.code == ErrorCode.REPLACED
            assert "replica 0 incarnation 0 was replaced" in str(error)
            assert "incarnation 1" in str(error)
            _refused(lambda: clients["zombie"].pull(np.empty(N, np.float32)))  # reads too
            fences.started(0, 1)
            clients["successor"] = PSClient(
                [address], "test", client_id=4, token=fencing_token(0, 1)
            )
            for name in ("successor", "other", "driver"):
                clients[name].push_deltas(ones)
            values = np.empty(N, np.float32)
            clients["driver"].pull(values)
            np.testing.assert_array_equal(values, np.full(N, 6.0, np.float32))  # those taken
            status = clients["driver"].status()[0]
            assert status["fences"] == {"0": 1}
            assert status["replaced_refused"] == 2 * status["n_shards"]  # a request per shard
            assert fences.replace(0) == 2  # the successor's own death: the next incarnation
        finally:
            fences.close()
            for client in clients.values():
                client.close()


def test_a_server_that_missed_the_fence_is_asked_again_until_it_takes_it():
    """Cut off (here: not there yet) when the driver fenced, and back without a restart."""
    address = f"127.0.0.1:{free_port('127.0.0.1')}"
    fences = ReplicaFences("test", [address], timeout_s=0.3, retries=0, retry_s=0.0)
    try:
        assert fences.replace(0) == 1 and fences.unanswered == {address}
        fences.retry(time.monotonic())  # still nobody there: asked again later
        assert fences.unanswered == {address}
        with local_server(GEOMETRY, shard_kib=4, servers=(address,)) as server:
            fences.retry(time.monotonic())
            assert not fences.unanswered
            with PSClient([address], "test", client_id=1, token=fencing_token(0, 0)) as zombie:
                error = _refused(lambda: zombie.push_deltas(np.ones(N, np.float32)))
                assert error.code == ErrorCode.REPLACED
            assert server.status()["fences"] == {"0": 1}
    finally:
        fences.close()


def test_a_fence_request_is_checked():
    with local_server(GEOMETRY, shard_kib=4) as server:
        with ControlClient(str(server.address), "test", timeout_s=2.0, retries=1) as control:
            for body in ({"replica": -1, "incarnation": 1}, {"replica": 0, "incarnation": "1"},
                         {"replica": 0}):  # fmt: skip
                with pytest.raises(ControlRefused, match="field"):
                    control.call("fence", **body)
            with pytest.raises(ControlRefused, match="'fence' only"):
                control.call("stop")
            assert control.call("fence", replica=3, incarnation=2) == {"fence": 2}
            assert control.call("fence", replica=3, incarnation=1) == {"fence": 2}  # never back
        with ControlClient(str(server.address), "other", timeout_s=2.0, retries=0) as stranger:
            with pytest.raises(ControlRefused, match="WRONG_JOB|not this server's job|job"):
                stranger.call("fence", replica=0, incarnation=1)


ZOMBIE = textwrap.dedent(
    """
    import sys
    import numpy as np
    from hogwild_plugins.ps.client import PSClient
    from hogwild_plugins.ps.connection import PSRequestError
    from hogwild.net.fencing import fencing_token

    servers, job, etcd, n = sys.argv[1].split(","), sys.argv[2], sys.argv[3], int(sys.argv[4])
    client = PSClient(servers, job, client_id=77, etcd=etcd, token=fencing_token(0, 0))
    try:
        while True:
            client.push_deltas(np.full(n, 1e-6, np.float32))
            print("pushed", flush=True)
    except PSRequestError as exc:
        print(exc, file=sys.stderr, flush=True)
        sys.exit(3)
    finally:
        client.close()
    """
)


def test_a_paused_replica_replaced_by_the_driver_is_refused_by_every_copy(trio, etcd_server):
    """A replica's process paused (SIGSTOP) past the driver's patience, fenced while paused:
    when it wakes, its next push is refused, and it stops with the reason; the fence holds on the
    bucket's next primary after a failover, and on a server that restarts (told again)."""
    zombie = subprocess.Popen(
        [sys.executable, "-c", ZOMBIE, ",".join(trio.addresses), JOB, etcd_server.address,
         str(N_PARAMS)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    fences = ReplicaFences(JOB, trio.addresses, timeout_s=2.0, retries=1)
    etcd = Etcd(etcd_server.address, prefix=etcd_prefix(JOB))
    probe = PSClient(trio.addresses, JOB, client_id=78, etcd=etcd_server.address,
                     token=fencing_token(0, 0))  # fmt: skip
    try:
        assert zombie.stdout.readline().strip() == "pushed", zombie.stderr.read()
        zombie.send_signal(signal.SIGSTOP)
        assert fences.replace(0) == 1  # every server, before the portions go to another
        assert not fences.unanswered
        zombie.send_signal(signal.SIGCONT)
        out, err = zombie.communicate(timeout=60)
        assert zombie.returncode == 3, err
        assert "REPLACED" in err and "replica 0 incarnation 0 was replaced" in err
        statuses = probe.status()
        assert all(s["fences"] == {"0": 1} for s in statuses)
        assert sum(s["replaced_refused"] for s in statuses) >= 1

        routes = Routes(etcd_server.address, JOB, 3, probe.layout.n_buckets)
        wait_in_sync(routes, etcd, 3)
        routes.read()
        primary = routes.primaries[0]
        trio.processes[primary].kill()  # bucket 0 fails over to a copy, fenced already
        error = _refused(lambda: probe.push_deltas(np.zeros(N_PARAMS, np.float32)))
        assert error.code == ErrorCode.REPLACED
        trio.start(primary)  # comes back with no fences: the driver tells it again
        fences.tell(trio.addresses[primary])
        with ControlClient(trio.addresses[primary], JOB, timeout_s=2.0, retries=1) as control:
            assert control.call("fence", replica=0, incarnation=0) == {"fence": 1}
        fences.started(0, 1)
        with PSClient(trio.addresses, JOB, client_id=79, etcd=etcd_server.address,
                      token=fencing_token(0, 1)) as successor:  # fmt: skip
            successor.push_deltas(np.zeros(N_PARAMS, np.float32))
    finally:
        if zombie.poll() is None:
            zombie.send_signal(signal.SIGCONT)
            zombie.kill()
            zombie.communicate()
        probe.close()
        etcd.close()
        fences.close()
