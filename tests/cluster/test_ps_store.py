"""The ``ps`` parameter store against live parameter servers on loopback.

The store contract (:mod:`tests.store_contract`) holds with the servers as home (SGD with
``ps.lr = 1``, so a push adds exactly the copy's progress); a job started against servers that
already hold a model joins it instead of resetting it; and a single-node job trained through
``hogwild ps serve`` on MNIST reaches 98 % in one epoch, with its fully connected layers pushed
as activation and error vectors (Adam section 3.2.6; on loopback the default is deltas, cheaper
where the servers share the workers' cores) and the rest as deltas.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hogwild_plugins.ps.serving.launch import ServeProcess

import hogwild
from bench.support.paper_job import PAPER_JOB
from hogwild.model.network import build_network
from tests.store_contract import StoreUnderTest, run_contract


@pytest.fixture
def server():
    """A server of Adam's model without the default job's dropout (its fully connected layers are
    numbered as the clients' are: the training test's client trains that model)."""
    with ServeProcess(["--port", "0", "--threads", "1", *PAPER_JOB]) as process:
        address = process.start()
        yield address
        assert process.stop() in (0, 143)


@pytest.fixture(scope="module")
def network():
    return build_network(hogwild.load_config().model, 10)


def ps_config(address: str, **overrides):
    return hogwild.load_config(
        overrides={
            "train.parameters": "ps",
            "ps.servers": address,
            "train.update_every": 1,
            "train.fc_push": "deltas",
            **overrides,
        }
    )


@pytest.mark.parametrize("nodes", [[0, 0], [0]], ids=["two-workers", "one-worker"])
def test_the_store_contract_holds_with_the_servers_as_home(server, network, nodes):
    run_contract(network, ps_config(server, **{"train.n_push": 32}), nodes)


def test_a_job_joins_the_model_the_servers_hold(server, network):
    config = ps_config(server)
    first = StoreUnderTest(config, network, [0])
    (side,) = first.open_workers()
    try:
        start = np.zeros(network.n_params, np.float32)
        first.store.load(start, start)  # fresh servers take the job's model...
        side.params += 0.5
        side.trained(64, None)
        side.finish()
    finally:
        first.close([side])
    second = StoreUnderTest(config, network, [0, 0])
    workers = second.open_workers()
    try:
        other = np.full(network.n_params, 9.0, np.float32)
        second.store.load(other, other)  # ... a running model is joined, not reset
        assert second.store.joined_version > 0
        np.testing.assert_allclose(second.store.snapshot()[0], 0.5)
        for side in workers:
            np.testing.assert_allclose(side.params, 0.5)
        assert "the parameter servers" in second.store.summary()
    finally:
        second.close(workers)


def test_a_job_trained_through_hogwild_ps_serve_reaches_98_percent_in_one_epoch(
    server, mnist_dir, tmp_path
):
    metrics = tmp_path / "metrics.jsonl"
    out = subprocess.run(
        [sys.executable, "-m", "hogwild.cli", "train", "--data", str(mnist_dir), "--ps", server,
         "--epochs", "1", "--workers", "2", "--metrics", str(metrics), "--no-progress",
         "--train.fc_push=vectors", *PAPER_JOB],  # Adam's model without the default's dropout
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    start, final = records[0], records[-1]
    assert start["parameters"]["store"] == "ps" and start["parameters"]["servers"] == [server]
    assert start["parameters"]["fc_push"] == "vectors" and start["parameters"]["per"] == "worker"
    assert final["examples"] == 60000
    assert final["test_accuracy"] >= 0.98, final


def test_a_served_process_stops_when_its_owner_is_killed():
    """An owner SIGKILLed (a test's timeout, a benchmark killed) takes its servers down. The
    server was forked from the owner's role server (not started as a fresh interpreter), which
    ends after it."""
    import signal
    import subprocess
    import sys

    import psutil

    owner = subprocess.Popen(
        [sys.executable, "-c", (
            "import time\n"
            "from hogwild_plugins.ps.serving.launch import ServeProcess, role_server_pid\n"
            "p = ServeProcess(['--port', '0', '--threads', '1'])\n"
            "p.start()\n"
            "print(p.process.pid, role_server_pid(), flush=True)\n"
            "time.sleep(120)\n"
        )],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pids = owner.stdout.readline().split()
        assert len(pids) == 2 and pids[1] != "None", pids  # the role server runs
        server, role_server = (psutil.Process(int(pid)) for pid in pids)
        assert server.ppid() == role_server.pid  # forked from it
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        server.wait(20)  # raises psutil.TimeoutExpired if the server outlives its owner
        role_server.wait(20)  # ... or the role server outlives both
    finally:
        owner.kill()
        owner.wait()
