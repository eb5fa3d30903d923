"""A job whose parameter server stopped a bucket stops at once, saying why, and is not restarted.

A write the server acknowledged then failed to apply (provoked: the shard's memory made
unwritable, so the update rule's kernel raises) stops its bucket there; with one copy nothing
else serves it. The client's ``STOPPED`` is a :class:`~hogwild.errors.StoppedError`: a real
``hogwild train --ps-servers`` process, whether its first pull or a worker's later request meets
it, exits with :data:`~hogwild.errors.EXIT_STOPPED` and one line naming the server, the bucket
and the failure. Run as a role of the local launcher, the driver's supervision reads that line
and stops the job with it, restarts left or not, rather than restart a role no restart helps.
With copies, a client re-routes ``STOPPED`` to the bucket's next primary; when none takes the
bucket over (the stopped primary had no caught-up copy, so it keeps its record), the client
gives up with the ``STOPPED`` refusal, not as if the server were gone.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.connection import PSRequestError
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.cluster.launcher import RoleExit
from hogwild.cluster.local import LocalLauncher, RoleProcess
from hogwild.cluster.roles import RoleSpec
from hogwild.cluster.supervisor import (
    Recover,
    RestartPolicy,
    RoleExited,
    StopJob,
    Supervised,
    Supervisor,
)
from hogwild.config import load_config
from hogwild.errors import EXIT_STOPPED, RoleFailedError, StoppedError
from hogwild.model.network import model_network
from tests.adversarial.copies import N, primary_and_copy, two_copies

pytestmark = pytest.mark.ps_kernels

JOB = "stopjob"  # the config file's stem: the job's name on the wire
CONFIG = """\
[model]
input = [1, 28, 28]
layers = [{type = "fc", units = 10}, {type = "softmax"}]
[train]
workers = 1
"""
COMPILED_WITHIN_S = 240.0  # a trainer's kernels from cold numba caches on a loaded 2-core machine
ids = (f"s{i}" for i in itertools.count())


def write_config(directory: Path) -> tuple[Path, ModelGeometry]:
    path = directory / f"{JOB}.toml"
    path.write_text(CONFIG)
    network = model_network(load_config(str(path)).model)
    return path, ModelGeometry.from_network(network)


def stop_bucket_0(server, client: PSClient) -> None:
    """Make shard 0's memory unwritable and push: acknowledged, then failed: bucket 0 stops."""
    server.shards[server.local[0]].values.flags.writeable = False
    client.push_deltas(np.ones(server.layout.n_params, np.float32))
    deadline = time.monotonic() + 30
    while not server.stops.buckets:
        assert time.monotonic() < deadline, "the failed write stopped nothing"
        time.sleep(0.01)


def train_argv(config: Path, address, epochs: int) -> list[str]:
    return [
        "train", "--config", str(config), "--ps-servers", str(address), "--no-progress",
        "--epochs", str(epochs),
    ]  # fmt: skip


def test_the_client_raises_stopped_as_a_stopped_error_naming_server_bucket_and_failure(
    tmp_path: Path,
):
    _, geometry = write_config(tmp_path)
    with local_server(geometry, job=JOB, threads=1) as server:
        with PSClient([str(server.address)], JOB, client_id=7, timeout_s=3.0) as client:
            stop_bucket_0(server, client)
            out = np.zeros(server.layout.n_params, np.float32)
            with pytest.raises(StoppedError) as raised:
                client.pull(out, shards=[0])
    assert isinstance(raised.value, PSRequestError)  # still the request's error
    text = str(raised.value)
    assert f"parameter server {server.address}: STOPPED" in text
    assert "bucket 0 is stopped on server 0" in text and "failed to apply" in text


@pytest.mark.parametrize("when", ["before", "during"])
def test_a_training_process_that_meets_stopped_exits_with_one_line(tmp_path: Path, mnist_dir, when):
    """``before``: the bucket is stopped before the trainer starts (its first pull meets it);
    ``during``: once the trainer's pushes land (a worker's request meets it)."""
    config, geometry = write_config(tmp_path)
    with local_server(geometry, job=JOB, threads=1) as server:
        with PSClient([str(server.address)], JOB, client_id=7, timeout_s=3.0) as client:
            if when == "before":
                stop_bucket_0(server, client)
            argv = train_argv(config, server.address, epochs=50)
            process = subprocess.Popen(
                [sys.executable, "-m", "hogwild.cli", *argv, "--data", str(mnist_dir)],
                stderr=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                text=True,
            )
            try:
                if when == "during":
                    deadline = time.monotonic() + COMPILED_WITHIN_S
                    while server.book.version(0) < 2:  # the trainer's pushes landed
                        assert process.poll() is None, process.stderr.read()
                        assert time.monotonic() < deadline, "the trainer pushed nothing"
                        time.sleep(0.02)
                    server.shards[server.local[0]].values.flags.writeable = False
                _, stderr = process.communicate(timeout=COMPILED_WITHIN_S)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    assert process.returncode == EXIT_STOPPED, stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("hogwild: error:")]
    assert "STOPPED" in line and "bucket 0 is stopped on server 0" in line, line
    assert "failed to apply" in line and "Traceback" not in stderr
    if when == "during":  # met by a worker (stopped at its second exchange of ~940 an epoch;
        # a loaded machine may let the trainer run on into a later epoch before the stop lands)
        assert re.match(r"hogwild: error: worker \d+, while training epoch \d+: ", line), line
        assert server.stops.stops == 1


def test_the_driver_stops_the_job_on_a_stopped_role_and_does_not_restart_it(
    tmp_path: Path, mnist_dir
):
    """A real role process of the local launcher meets the stop; the supervision (restarts left)
    stops the job with the role's line rather than restart it."""
    config, geometry = write_config(tmp_path)
    with local_server(geometry, job=JOB, threads=1) as server:
        with PSClient([str(server.address)], JOB, client_id=7, timeout_s=3.0) as client:
            stop_bucket_0(server, client)
        launcher = LocalLauncher(load_config(str(config)), str(tmp_path / "run"))
        argv = (*train_argv(config, server.address, epochs=1), "--data", str(mnist_dir))
        spec = RoleSpec("replica", 0, argv)
        policy = RestartPolicy(limit=3, kept=str(tmp_path / "checkpoints"))

        def start_again(restart):
            raise AssertionError(f"restarted {restart.name}: no restart helps a stopped bucket")

        supervisor = Supervisor(policy, launcher, lambda i: None, start_again, lambda *a: None)
        with launcher:
            # (started as the launcher starts a role, without waiting for a ready line: a
            # trainer prints none)
            launcher.roles[spec.name] = RoleProcess(spec, launcher.log_dir, server=launcher.server)
            supervisor.supervise(spec.name, spec.kind, spec.index)
            deadline = time.monotonic() + COMPILED_WITHIN_S
            while launcher.roles[spec.name].process.poll() is None:
                assert time.monotonic() < deadline, "the role did not stop"
                time.sleep(0.05)
            with pytest.raises(RoleFailedError) as stopped:
                supervisor.recover()
    message = str(stopped.value)
    assert "replica 0 on localhost was stopped by its parameter server" in message
    assert f"parameter server {server.address}: STOPPED" in message
    assert "bucket 0 is stopped on server 0" in message and "failed to apply" in message
    assert "not restarted" in message and "checkpoints is kept" in message
    assert policy.restarts == {}


def test_a_stopped_exit_is_not_restarted_while_restarts_remain_and_others_still_are():
    policy = RestartPolicy(limit=2, kept="")
    for name, kind, index in (("replica 0", "replica", 0), ("replica 1", "replica", 1)):
        policy.handle(Supervised(name, kind, index, next(ids)))
    said = "parameter server 10.0.0.1:7000: STOPPED: PUSH of shard 3: bucket 1 is stopped"
    policy.handle(RoleExited(RoleExit("replica 0", "h", EXIT_STOPPED, said=said), next(ids)))
    policy.validate_state()
    assert not policy.restartable("replica 0") and policy.restartable("replica 1")
    assert not policy.awaiting_restart("replica 0")
    [stop] = policy.handle(Recover(next(ids)))
    policy.validate_state()
    assert isinstance(stop, StopJob)
    assert stop.reason == (
        f"replica 0 on h was stopped by its parameter server: {said} (not restarted: the "
        "server refuses the bucket until it is restarted); the job is stopped"
    )
    # another status is restarted as before
    other = RestartPolicy(limit=2, kept="")
    other.handle(Supervised("replica 0", "replica", 0, next(ids)))
    other.handle(RoleExited(RoleExit("replica 0", "h", 2), next(ids)))
    [restart] = other.handle(Recover(next(ids)))
    assert restart.name == "replica 0" and restart.count == 1


def test_with_copies_a_stopped_primary_no_copy_took_over_from_is_reported_stopped():
    with two_copies("stuck", client_id=9, timeout_s=10.0) as (servers, client):
        client.push_deltas(np.ones(N, np.float32))  # every bucket served, both copies in sync
        primary, copy = primary_and_copy(servers, 0)
        bucket = primary.layout.bucket_of(0)
        role = primary.replication.roles[bucket]
        copy.stop()  # the primary drops it (ps.min_copies = 1 of 2) and writes on alone
        client.push_deltas(np.ones(N, np.float32), ranges=[(0, 1024)])
        assert role.record.in_sync == (primary.options.index,)
        primary.shards[primary.local[0]].values.flags.writeable = False  # its application raises
        client.connection.failover_s = 2.0
        with pytest.raises(StoppedError):  # (answered STOPPED by its round, then as below)
            client.push_deltas(np.ones(N, np.float32), ranges=[(0, 1024)])
        # no caught-up copy to hand the bucket to: it stepped down, keeping its record
        assert primary.stops.stopped(bucket) and not primary.replication.serving(0)
        assert role.record.primary == primary.options.index
        with pytest.raises(StoppedError) as raised:  # refused at once, and again until given up
            client.push_deltas(np.ones(N, np.float32), ranges=[(0, 1024)])
    text = str(raised.value)
    assert f"parameter server {primary.address}: STOPPED" in text
    assert f"bucket {bucket} is stopped on server {primary.options.index}" in text
    assert text.endswith("(no other server took the bucket over within 2 s)")
