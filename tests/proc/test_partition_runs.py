"""A partitioned replica (``--partitions 2``) trained as a user would, on the real MNIST files.

Proves that two partitions with four examples in flight reach the unpartitioned job's test
accuracy at the same epochs; that a checkpoint written with two partitions is the whole model and
resumes with one (the unpartitioned engine); that a partition killed with SIGKILL mid-epoch stops
the job with an error naming it (the partitions forked by a server the CLI forked from itself),
and that SIGTERM of the parent ends it with status 143, each leaving no process and no
shared-memory segment behind, as does SIGKILL of the parent; and that the parent's nap between
two looks at its partitions ends as soon as one of them ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import types

import psutil
import pytest

import hogwild
from bench.support.paper_job import PAPER_OVERRIDES  # Adam's model without dropout: learns fast
from hogwild.data.mnist import load_mnist
from hogwild.partition.runtime import nap_unless_one_ends, train_partitioned
from hogwild.training.api import load_checkpoint
from hogwild.training.checkpoint import latest_checkpoint
from hogwild.training.zygote import FORKED_TITLE
from tests.proc.test_cli_signals import (
    START_TIMEOUT_S,
    forkserver_of,
    hogwild_cli,
    started,
    stop,
    wait_until,
    workers_of,
)

PARTITIONED = {**PAPER_OVERRIDES, "model.partitions": 2, "train.in_flight": 4}


@pytest.fixture(scope="module")
def mnist(mnist_dir):
    return load_mnist(mnist_dir)


def partition_segments(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"hogwild-partition-{pid}-")]


def test_two_partitions_four_in_flight_reach_the_unpartitioned_accuracy(mnist):
    """Same data, order, initial weights and epochs. Four examples in flight means each one's
    forward pass sees weights three updates old, and which updates it misses depends on how the
    two processes happen to interleave, so one short partitioned run is a draw: on 5,000
    examples and 2 epochs, 12 runs beside a busy core (2-core AMD EPYC) landed at 0.9472 to
    0.9588, mean 0.9540, standard deviation 0.0033, against the whole model's 0.9566 (the same
    every run): a gap of 0.26 points on average, 0.94 at most. CI drew 0.9458, a gap of 1.08:
    2.5 standard deviations out, so CI's runs spread wider than these. Two points is the mean
    gap plus five of these standard deviations. That the split computes what the whole
    model computes is the one-in-flight tests' (the same outputs and gradients); this one checks
    that four in flight still learn. The issue's 0.3 points is a claim about full training,
    where the spread is far smaller; a single short run cannot test it."""
    options = dict(
        data=mnist, epochs=SAME_EPOCHS, subset=SUBSET, progress=False, evaluate_every=0
    )  # the final figures only
    whole = hogwild.train(workers=1, overrides={**PAPER_OVERRIDES, "optim.lr": LR}, **options)
    split = train_partitioned(overrides={**PARTITIONED, "optim.lr": LR}, **options)
    assert whole.history[0]["lr"] == split.history[0]["lr"] == LR
    assert split.metrics["partitions"] == 2 and split.metrics["in_flight"] == 4
    assert split.metrics["examples"] == SAME_EPOCHS * SUBSET  # every example completely processed
    assert split.history[0]["evaluated"] is False and split.history[0]["test_accuracy"] is None
    gap = whole.metrics["test_accuracy"] - split.metrics["test_accuracy"]
    assert gap <= 0.02, (whole.metrics["test_accuracy"], split.metrics["test_accuracy"])


def test_a_checkpoint_of_two_partitions_resumes_with_one(tmp_path, mnist):
    directory = tmp_path / "ck"
    split = train_partitioned(
        data=mnist,
        epochs=1,
        subset=1000,
        progress=False,
        checkpoint_dir=directory,
        overrides=PARTITIONED,
    )
    saved = load_checkpoint(latest_checkpoint(directory))
    assert set(saved.weights) == {spec.name for spec in saved.network.params}  # the whole model
    accuracy = (saved.predict(mnist.test_images) == mnist.test_labels).mean()
    assert accuracy == pytest.approx(split.metrics["test_accuracy"], abs=1e-4)
    resumed = hogwild.train(
        data=mnist,
        epochs=2,
        subset=1000,
        workers=1,
        progress=False,
        checkpoint_dir=directory,
        resume=True,
        overrides=PAPER_OVERRIDES,
    )
    assert [h["epoch"] for h in resumed.history] == [0, 1]
    assert resumed.history[0]["test_accuracy"] == split.history[0]["test_accuracy"]
    assert resumed.metrics["test_accuracy"] > 0.5


@pytest.fixture
def partitioned_job(tmp_path, mnist_dir):
    metrics = tmp_path / "metrics.jsonl"
    args = [
        "train",
        "--data",
        str(mnist_dir),
        "--partitions",
        "2",
        "--epochs",
        "50",
        "--subset",
        "2000",
        "--metrics",
        str(metrics),
        "--no-progress",
    ]
    return args, metrics


def test_sigkill_of_a_partition_stops_the_job_naming_it_and_leaves_nothing(partitioned_job):
    args, metrics = partitioned_job
    process = hogwild_cli(*args)
    wait_until(lambda: started(metrics), START_TIMEOUT_S, "the partitions to start")
    partitions = workers_of(process.pid)
    assert len(partitions) == 2 and partition_segments(process.pid)
    server = forkserver_of(process.pid)  # forked from the CLI: no second interpreter's start
    assert f"{FORKED_TITLE}, for pid {process.pid}, hogwild train" in " ".join(server.cmdline())
    assert {partition.ppid() for partition in partitions} == {server.pid}
    victim = partitions[1]
    victim.send_signal(signal.SIGKILL)
    _, err = stop(process)
    assert process.returncode == 1, err
    assert f"partition 1 of 2 (pid {victim.pid}) died" in err and "signal 9" in err, err
    _, alive = psutil.wait_procs(partitions, timeout=10)
    assert not alive
    assert partition_segments(process.pid) == []


def test_sigkill_of_the_parent_leaves_no_partition_and_no_segment(partitioned_job):
    args, metrics = partitioned_job
    process = hogwild_cli(*args)
    wait_until(lambda: started(metrics), START_TIMEOUT_S, "the partitions to start")
    partitions = workers_of(process.pid)
    process.kill()
    process.communicate()
    _, alive = psutil.wait_procs(partitions, timeout=15)
    assert not alive, "partitions outlived their parent"
    wait_until(lambda: not partition_segments(process.pid), 30, "the orphaned arena to go")


def test_sigterm_of_the_parent_stops_the_partitions_with_status_143(partitioned_job):
    args, metrics = partitioned_job
    process = hogwild_cli(*args)
    wait_until(lambda: started(metrics), START_TIMEOUT_S, "the partitions to start")
    partitions = workers_of(process.pid)
    process.send_signal(signal.SIGTERM)
    stop(process)
    assert process.returncode == 128 + signal.SIGTERM
    _, alive = psutil.wait_procs(partitions, timeout=10)
    assert not alive
    assert partition_segments(process.pid) == []


SUBSET, SAME_EPOCHS, LR = 5000, 2, 0.0015


def test_the_parents_nap_ends_when_a_partition_process_ends():
    # a process that only ends, watched through what the nap waits on: its sentinel (here a
    # pidfd, readable once it ended, as a multiprocessing child's sentinel is)
    child = subprocess.Popen(["sleep", "0.2"])
    watched = types.SimpleNamespace(sentinel=os.pidfd_open(child.pid))
    try:
        started_at = time.monotonic()
        nap_unless_one_ends([watched], 60.0)
        assert child.poll() == 0  # it had ended when the nap did: woken by its end
        assert child.wait(10) == 0
        assert time.monotonic() - started_at < 30.0
    finally:
        os.close(watched.sentinel)
        if child.poll() is None:
            child.kill()
            child.wait()
    nap_unless_one_ends([], 0.01)  # no partition yet: a plain sleep
