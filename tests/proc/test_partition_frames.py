"""Partitions on different hosts send each other the same blocks as ZeroMQ frames, on loopback.

Two host groups on this machine (``model.partition_hosts`` with two loopback ports), so every
block that crosses between them is a frame and nothing is shared in memory: the leader, this
test's process, runs partitions 0 and 2; a ``hogwild partition-host`` process runs partition 1
in an arena of its own. With one example in flight the job is deterministic, so it must end with
the weights of per-example SGD through the partitioned step in one process (which
``tests/unit/test_partition_compute.py`` ties to the unpartitioned model and PyTorch autograd):
the forward activations, the partial errors and their sums crossed intact, each owner's slices
from two hosts, a host's several slices in one message, each example's rate with its LOAD
(``optim.smooth``). With four examples in flight and a learning rate too small to move the
weights, the loss the leader counts is the initial model's on those examples: no frame landed
in another example's slot, frames that overtook their example's LOAD were kept until it came.
A partition killed on the follower stops the job naming it. The follower ends by itself when
the leader is done, and nothing is left behind (the autouse leak check).
"""

from __future__ import annotations

import signal
from dataclasses import replace

import numpy as np
import pytest

from bench.support.paper_job import PAPER_OVERRIDES
from hogwild.config import load_config
from hogwild.data.mnist import load_mnist
from hogwild.errors import ConfigError
from hogwild.model.context import TrainingContext
from hogwild.model.network import build_network
from hogwild.net.ports import free_ports
from hogwild.partition.plan import plan_partitions
from hogwild.partition.runtime import train_partitioned
from hogwild.training.api import load_checkpoint
from hogwild.training.checkpoint import latest_checkpoint
from hogwild.training.job import epoch_permutation, subset_indices
from hogwild.training.resume import starting_point
from tests.proc.test_cli_signals import (
    START_TIMEOUT_S,
    hogwild_cli,
    started,
    stop,
    wait_until,
    workers_of,
)
from tests.proc.test_partition_dataflow import sequential_sgd

SUBSET = 200
SMOOTH = {"optim.smooth": True, "optim.schedule": "linear", "optim.min_lr": 0.0}
FOLLOWER_EXIT_S = 60.0


@pytest.fixture(scope="module")
def mnist(mnist_dir):
    """MNIST with 1,000 test images: the runs compare with each other, not with a figure."""
    data = load_mnist(mnist_dir)
    return replace(data, test_images=data.test_images[:1000], test_labels=data.test_labels[:1000])


def _train_with_a_follower(mnist, overrides, hosts, follower_host, **options):
    """The job with ``model.partition_hosts = hosts``, a follower bound at ``follower_host``."""
    follower = hogwild_cli("partition-host", "--bind", follower_host, "--wait-s", "300")
    try:
        result = train_partitioned(
            data=mnist,
            epochs=1,
            subset=SUBSET,
            progress=False,
            overrides={**overrides, "model.partition_hosts": hosts},
            **options,
        )
        _, err = follower.communicate(timeout=FOLLOWER_EXIT_S)
        assert follower.returncode == 0, err
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    return result, err  # its lines: on stderr, as every role's


def test_three_partitions_on_two_hosts_train_exactly_as_in_one_process(tmp_path, mnist):
    """Partitions 0 and 2 on the leader, 1 on the follower, ``optim.smooth`` on (each example's
    rate travels with its LOAD): the weights equal per-example SGD through the partitioned step
    in one process, the follower's rows included (they came back at the epoch's end)."""
    a, b = (f"127.0.0.1:{port}" for port in free_ports(2))
    overrides = {**PAPER_OVERRIDES, "model.partitions": 3, **SMOOTH}
    framed, out = _train_with_a_follower(
        mnist, overrides, [a, b, a], b, checkpoint_dir=tmp_path / "framed"
    )
    assert "partitions 1 of 3 running" in out
    assert framed.metrics["examples"] == SUBSET  # every example completely processed once
    saved = load_checkpoint(latest_checkpoint(tmp_path / "framed"))
    expected = sequential_sgd(overrides, mnist, SUBSET)
    np.testing.assert_allclose(saved.params, expected, rtol=1e-5, atol=1e-6)
    initial, _, _, _ = starting_point(
        load_config(None, {**overrides, "train.subset": SUBSET}),
        saved.network, 10, False, print,
    )  # fmt: skip
    for lo, hi in plan_partitions(saved.network, 3).param_rows(1):  # the follower's rows
        assert not np.array_equal(saved.params[lo:hi], initial[lo:hi])  # came back trained


def test_four_in_flight_over_frames_count_every_example_loss_once(mnist):
    a, b = (f"127.0.0.1:{port}" for port in free_ports(2))
    overrides = {
        **PAPER_OVERRIDES,
        "model.partitions": 2,
        "train.in_flight": 4,
        "optim.lr": 1e-12,
    }
    result, _ = _train_with_a_follower(mnist, overrides, [a, b], b)
    config = load_config(None, {**overrides, "train.subset": SUBSET})
    network = build_network(config.model)
    params, _, _, _ = starting_point(config, network, 10, False, print)
    images = mnist.train_images.reshape(len(mnist.train_images), -1)
    chosen = subset_indices(config.train.seed, len(images), SUBSET)
    images, labels = images[chosen], mnist.train_labels[chosen]
    assert len(epoch_permutation(config.train.seed, 0, SUBSET)) == SUBSET
    loss, correct = TrainingContext.allocate(network, 1).evaluate_range(
        network.ops, params, images, labels.astype(np.int32), 0, SUBSET,
        config.data.mean, config.data.std,
    )  # fmt: skip
    assert result.metrics["examples"] == SUBSET
    assert result.history[0]["train_loss"] == pytest.approx(loss / SUBSET, rel=1e-5)
    assert result.history[0]["train_accuracy"] == pytest.approx(correct / SUBSET)


def test_partitions_beyond_loopback_need_keys(mnist):
    with pytest.raises(ConfigError, match="cluster.keys"):
        train_partitioned(
            data=mnist,
            epochs=1,
            subset=SUBSET,
            progress=False,
            overrides={
                **PAPER_OVERRIDES,
                "model.partitions": 2,
                "model.partition_hosts": ["127.0.0.1:7001", "10.213.9.9:7001"],
            },
        )


def test_a_partition_killed_on_the_other_host_stops_the_job_naming_it(tmp_path, mnist_dir):
    """SIGKILL of the follower's partition mid-epoch: the follower reports it and exits 1, the
    leader stops the job naming the host, the partition and the signal, status 1; every process
    ends and no segment is left (the autouse leak check)."""
    a, b = (f"127.0.0.1:{port}" for port in free_ports(2))
    follower = hogwild_cli("partition-host", "--bind", b, "--wait-s", "300")
    metrics = tmp_path / "metrics.jsonl"
    leader = hogwild_cli(
        "train", "--data", str(mnist_dir), "--partitions", "2", "--epochs", "50",
        "--subset", "2000", "--metrics", str(metrics), "--no-progress",
        f"--model.partition_hosts={a},{b}",
    )  # fmt: skip
    try:
        wait_until(lambda: started(metrics), START_TIMEOUT_S, "the partitions to start")
        partitions = workers_of(follower.pid)
        assert len(partitions) == 1
        victim = partitions[0]
        victim.send_signal(signal.SIGKILL)
        _, err = stop(leader)
        assert leader.returncode == 1, err
        assert f"partition host {b}: partition 1 (pid {victim.pid}) died" in err, err
        assert "signal 9" in err
        _, follower_err = stop(follower)
        assert follower.returncode == 1, follower_err
    finally:
        for process in (leader, follower):
            if process.poll() is None:
                process.kill()
                process.communicate()
