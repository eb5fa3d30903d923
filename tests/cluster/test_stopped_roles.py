"""A partitioned replica and a synchronous group's member that meet ``STOPPED`` stop the job.

The other roles that train through a parameter server, as ``test_stopped_bucket_job`` covers
a ``hogwild train --ps-servers`` process: real role processes of the local launcher, an
in-process parameter server whose shard 0 is made unwritable so that an acknowledged write fails
to apply and stops bucket 0, and the driver's supervision (restarts left) that reads the role's
one line and stops the job with it rather than restart a role no restart helps.

* A partitioned replica (``hogwild cluster replica`` with ``model.partitions = 2``): the
  driver's ``train`` (sent here as the driver sends it) starts its partitions' exchange; a
  partition's request meets ``STOPPED``, the partition exits
  :data:`~hogwild.errors.EXIT_STOPPED` with its line, and the replica exits the same, naming the
  partition and carrying the partition's line (the arena's ``said`` row brings it to the
  replica), without a traceback.
* A Sandblaster group's member (``hogwild cluster member``): its coordinator's board (served
  here by the coordinator's real board service) makes it fetch the parameters, which meets
  ``STOPPED``; it exits :data:`~hogwild.errors.EXIT_STOPPED` with one line naming itself, the
  server, the bucket and the failure.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.sandblaster import Board, PortionScheduler
from hogwild_plugins.ps.sandblaster.batch import BatchTimeout
from hogwild_plugins.ps.sandblaster.board_service import BoardService
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.cluster.local import LocalLauncher
from hogwild.cluster.roles import RoleSpec
from hogwild.cluster.supervisor import RestartPolicy, Supervisor
from hogwild.config import config_from_dict
from hogwild.errors import EXIT_STOPPED, RoleFailedError
from hogwild.model.network import build_network
from hogwild.net.control import ControlClient, ControlServer
from tests.cluster.test_stopped_bucket_job import stop_bucket_0

pytestmark = pytest.mark.ps_kernels

JOB = "stoproles"
LAYERS = [{"type": "fc", "units": 10}, {"type": "softmax"}]
SUBSET = 2000  # examples the replica trains: several exchanges of each partition
EXITED_WITHIN_S = 240.0  # kernels from cold numba caches on a loaded 2-core machine


def job_config(**sections) -> object:
    """The job's config, its parameter server not yet named (``ps.servers``)."""
    model = {"input": [1, 28, 28], "layers": LAYERS, **sections.pop("model", {})}
    return config_from_dict({"model": model, "ps": {"job": JOB}, **sections})


def geometry_of(config) -> ModelGeometry:
    return ModelGeometry.from_network(build_network(config.model, 10))


def supervised_role(config, tmp_path: Path, spec: RoleSpec):
    """The launcher and supervision of one real role process, as the driver holds them; the
    supervisor restarts nothing (a restart fails the test)."""
    launcher = LocalLauncher(config, str(tmp_path / "run"))
    policy = RestartPolicy(limit=3, kept=str(tmp_path / "checkpoints"))

    def start_again(restart):
        raise AssertionError(f"restarted {restart.name}: no restart helps a stopped bucket")

    supervisor = Supervisor(policy, launcher, lambda i: None, start_again, lambda *a: None)
    return launcher, policy, supervisor


def wait_for_exit(launcher: LocalLauncher, name: str) -> int:
    process = launcher.roles[name].process
    deadline = time.monotonic() + EXITED_WITHIN_S
    while process.poll() is None:
        assert time.monotonic() < deadline, f"{name} did not stop"
        time.sleep(0.05)
    return process.returncode


def error_lines(launcher: LocalLauncher, name: str) -> tuple[list[str], str]:
    role = launcher.roles[name]
    role.reader.join(5.0)
    log = role.log.read_text()
    return [line for line in log.splitlines() if line.startswith("hogwild: ")], log


def run_batch(board: Board, ended: list) -> None:
    """One batch of four portions on ``board`` as the coordinator runs it (folding nothing);
    how it ended goes in ``ended``."""
    try:
        board.run_batch(1, 4, lambda fold: None)
    except BaseException as exc:  # noqa: BLE001 - the test asserts on it
        ended.append(exc)


def assert_job_stopped(supervisor, policy, name: str, server) -> None:
    with pytest.raises(RoleFailedError) as stopped:
        supervisor.recover()
    message = str(stopped.value)
    assert f"{name} on localhost was stopped by its parameter server" in message, message
    assert f"parameter server {server.address}: STOPPED" in message, message
    assert "bucket 0 is stopped on server 0" in message and "failed to apply" in message
    assert "not restarted" in message and "checkpoints is kept" in message
    assert policy.restarts == {}


def test_a_partitioned_replica_whose_partition_meets_stopped_stops_the_job(tmp_path, mnist_dir):
    config = job_config(
        model={"partitions": 2},
        train={"subset": SUBSET, "in_flight": 4, "batch": 1},
        cluster={"replicas": 1},
    )
    with local_server(geometry_of(config), job=JOB, threads=1) as server:
        config = config.override({"ps.servers": [str(server.address)]})
        config_file = tmp_path / "job.json"
        config_file.write_text(json.dumps(config.to_dict()))
        argv = ("cluster", "--config", str(config_file), "--data", str(mnist_dir), "replica",
                "--index", "0")  # fmt: skip
        spec = RoleSpec("replica", 0, argv)
        launcher, policy, supervisor = supervised_role(config, tmp_path, spec)
        with launcher:
            address = launcher.start(spec)  # its partitions took the servers' model
            supervisor.supervise(spec.name, spec.kind, spec.index)
            with PSClient([str(server.address)], JOB, client_id=7, timeout_s=3.0) as client:
                stop_bucket_0(server, client)
            with ControlClient(address, JOB, timeout_s=10.0) as driver:  # the driver's portion
                driver.call("train", epoch=0, lr=0.001, start=0, stop=SUBSET, seed=1)
            assert wait_for_exit(launcher, spec.name) == EXIT_STOPPED
            lines, log = error_lines(launcher, spec.name)
            assert_job_stopped(supervisor, policy, "replica 0", server)
    assert "Traceback" not in log, log
    # the partitions' own lines (server, bucket, failure; both may have met it before the
    # replica stopped them), then the replica's, naming the partition and carrying its line
    partitions = [line for line in lines if line.startswith("hogwild: partition ")]
    assert partitions, log
    for line in partitions:
        assert f"parameter server {server.address}: STOPPED" in line, line
        assert "bucket 0 is stopped on server 0" in line and "failed to apply" in line, line
    [replica] = [line for line in lines if line.startswith("hogwild: error:")]
    assert "of 2 was stopped by its parameter server while training epoch 1: " in replica
    assert f"parameter server {server.address}: STOPPED" in replica, replica


def test_a_group_member_that_meets_stopped_exits_with_one_line_and_stops_the_job(
    tmp_path, mnist_dir
):
    config = job_config(
        cluster={"framework": "sandblaster", "replicas": 1, "workers_per_replica": 1},
    )
    service = BoardService(range(1), silence_s=60.0)
    coordinator = ControlServer("127.0.0.1:0", JOB, service.answer)
    coordinator_address = coordinator.start()
    board = Board(PortionScheduler(push_every=3, max_copies=2), timeout_s=60.0)
    try:
        with local_server(geometry_of(config), job=JOB, threads=1) as server:
            config = config.override({"ps.servers": [str(server.address)]})
            config_file = tmp_path / "job.json"
            config_file.write_text(json.dumps(config.to_dict()))
            argv = ("cluster", "--config", str(config_file), "--data", str(mnist_dir), "member",
                    "--index", "0", "--coordinator", coordinator_address)  # fmt: skip
            spec = RoleSpec("member", 0, argv)
            launcher, policy, supervisor = supervised_role(config, tmp_path, spec)
            with launcher:
                launcher.start(spec)
                supervisor.supervise(spec.name, spec.kind, spec.index)
                with PSClient([str(server.address)], JOB, client_id=7, timeout_s=3.0) as client:
                    stop_bucket_0(server, client)
                service.install(board, np.arange(100), 25)
                ended: list[BaseException] = []  # the coordinator's batch: the member fetches
                batch = threading.Thread(target=run_batch, args=(board, ended), daemon=True)
                batch.start()
                assert wait_for_exit(launcher, spec.name) == EXIT_STOPPED
                batch.join(30)
                assert not batch.is_alive(), "the coordinator's batch did not end"
                lines, log = error_lines(launcher, spec.name)
                assert_job_stopped(supervisor, policy, "member 0", server)
    finally:
        board.close()
        service.close()
        coordinator.stop()
    assert "Traceback" not in log, log
    # the coordinator's batch ends when its last member left, with why it left
    [error] = ended
    assert isinstance(error, BatchTimeout) and "every replica left" in str(error), error
    assert "STOPPED" in str(error) and "bucket 0 is stopped on server 0" in str(error), error
    [line] = [line for line in lines if line.startswith("hogwild: error:")]
    assert line.startswith("hogwild: error: member 0: "), line
    assert f"parameter server {server.address}: STOPPED" in line, line
    assert "bucket 0 is stopped on server 0" in line and "failed to apply" in line
