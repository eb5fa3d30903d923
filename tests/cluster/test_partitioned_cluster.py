"""``hogwild cluster --partitions 2``: replicas of two partition processes through the servers.

Each partition pushes and pulls only its own rows (:mod:`hogwild.cluster.partitioned`). A job
of two replicas x two partitions and one parameter server trains each example once, every
partition's rows move in the servers' model, it learns about as well as the same job with
unpartitioned replicas (its training loss near theirs on the same examples and epoch, its
servers' model's test accuracy within 0.2 of theirs and learning), and it leaves nothing behind.
A partition SIGKILLed mid-epoch takes its replica down; the driver restarts the replica, which
trains its lost portions again, and the job ends well.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import numpy as np
import psutil
import pytest

from hogwild.config import config_from_dict
from hogwild.model.init import initialise
from hogwild.model.network import build_network
from hogwild.partition.plan import plan_partitions
from hogwild.partition.process import PROCESS_NAME
from hogwild.training.checkpoint import load_checkpoint, restore_parameters
from tests.cluster.test_cluster import (
    _run_and_kill,
    cluster_command,
    gauge,
    job_segments,
    pid_of,
    processes_of,
    scrape,
    unique_job,
    until,
)

pytestmark = pytest.mark.slow

SUBSET = 3000
JOB = ("--epochs", "1", "--replicas", "2", "--ps", "1", f"--train.subset={SUBSET}",
       "--train.in_flight=4")  # fmt: skip
# The test accuracy of one epoch of 3,000 examples is one snapshot of the servers' model. With 4
# in flight a partitioned job's spreads more widely than an unpartitioned one's (measured on 2
# cores under load, each seed's two jobs): seeds 0 to 19, unpartitioned 0.819 to 0.918 (sd
# 0.025), two partitions 0.790 to 0.920 (sd 0.037), the split job -0.124 to +0.084 from the same
# seed's whole one (sd 0.048). With 1 in flight seeds 0 to 7 gave 0.804 to 0.903: as wide a range
# as the unpartitioned one over 20 seeds, so those 8 seeds show no wider spread. A check of the
# split job's snapshot within 0.15 of the whole one's failed now and then (CI once; one job of
# 6,000 examples ended at 0.693); within ACCURACY_WITHIN, about 4 sd of the same-seed
# differences, it still fails a servers' model that learns much worse than the whole job's,
# which the training loss cannot see (it is the partitions' loss on their own params, not the
# servers' model: a fault in how the servers take the pushes leaves it unmoved). The epoch's
# training loss, a mean over all 3,000 examples, is steady: unpartitioned 0.65 to 0.77, 4 in
# flight 0.69 to 1.10 (staleness: 0.02 to 0.33 over the same seed's whole job), 1 in flight 0.68
# to 0.75, and the low snapshots had ordinary losses; a split job that does not learn (lr 1e-9)
# ended at 4.52 (chance: ln 10 = 2.30). So the split job is compared with the whole one on both,
# and its servers' model must learn (FLOOR); accuracy cannot tell a partition whose pushes never
# reach the servers (0.702 measured, with partition 1's rows left out of its exchange), which
# `_rows_moved` checks in the servers' model itself.
LOSS_WITHIN = 0.6  # about twice the worst staleness cost seen; not learning: 4.52
ACCURACY_WITHIN = 0.2  # about 4 sd (0.048) of the same-seed differences; the worst seen -0.124
FLOOR = 0.65
MOVED = 0.9  # honest runs moved 99.5 % or more of every slice; a lost partition moves none


def _network_of(checkpoint):
    """The job's model (its config and classes as its checkpoint records them) and config."""
    config = config_from_dict(checkpoint.info["config"])
    return build_network(config.model, int(checkpoint.info["n_classes"])), config


def _rows_moved(run_dir: Path, k: int) -> list[list[float]]:
    """Per partition, per slice of the parameter vector it owns: the fraction of its values
    that the job's final model (its checkpoint, pulled from the servers) holds changed from the
    seeded initial weights the job started from."""
    checkpoint = load_checkpoint(run_dir)
    network, config = _network_of(checkpoint)
    start = np.zeros(network.n_params, np.float32)
    initialise(network, start, config.model.init, config.model.init_scale, config.train.seed)
    final = np.zeros_like(start)
    restore_parameters(network, final, checkpoint.weights, checkpoint.path, "")
    plan = plan_partitions(network, k)
    return [
        [float(np.mean(final[lo:hi] != start[lo:hi])) for lo, hi in plan.param_rows(p)]
        for p in range(k)
    ]


def _pulled(log: Path, replica: int) -> tuple[int, int, int]:
    """A partitioned replica's stop line: the times it took the servers' model, the bytes
    those takes pulled, and the whole model's bytes."""
    found = re.search(
        rf"replica {replica} took the servers' model (\d+) time\(s\), ([\d,]+) bytes of values "
        rf"in all: "
        rf".* \(the whole model is ([\d,]+) bytes\)",
        log.read_text(),
    )
    assert found, log.read_text()[-2000:]
    return tuple(int(g.replace(",", "")) for g in found.groups())


def _run(mnist_dir, run_dir, *args: str) -> dict:
    done = subprocess.run(
        cluster_command(mnist_dir, run_dir, *JOB, *args),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_two_replicas_of_two_partitions_train_as_well_as_unpartitioned_ones(mnist_dir, tmp_path):
    job = unique_job()
    whole = _run(mnist_dir, tmp_path / "whole", f"--ps.job={job}")
    split = _run(mnist_dir, tmp_path / "split", f"--ps.job={job}", "--partitions", "2")
    assert split["examples"] == whole["examples"] == SUBSET, split
    assert split["train_loss"] <= whole["train_loss"] + LOSS_WITHIN, (split, whole)
    assert split["test_accuracy"] >= whole["test_accuracy"] - ACCURACY_WITHIN, (split, whole)
    assert split["test_accuracy"] >= FLOOR, split
    assert split["restarts"] == {}
    lines = (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    assert sum(epoch["per_replica_examples"].values()) == SUBSET  # every example once
    assert epoch["ps_updates"] > 0  # the partitions pushed
    moved = _rows_moved(tmp_path / "split", 2)  # each partition's rows reached the servers
    assert all(min(slices) >= MOVED for slices in moved), moved
    model_bytes = 4 * _network_of(load_checkpoint(tmp_path / "split"))[0].n_params
    for r in range(2):  # all K partitions on the replica's host: its takes pull every shard
        takes, pulled, whole = _pulled(tmp_path / "split" / "logs" / f"replica-{r}.log", r)
        assert takes == 1 and pulled == whole == model_bytes, (r, takes, pulled, whole)
    assert processes_of(tmp_path / "split") == []
    assert job_segments(job) == set()


def test_a_killed_partition_takes_its_replica_down_and_the_replica_is_restarted(
    mnist_dir, tmp_path
):
    args = (*JOB, "--partitions", "2")
    killed = []

    def kill(run_dir, first_port, driver):  # ports: driver, ps 0, replica 0, replica 1
        until("replica 1 training", lambda: gauge(scrape(first_port + 3),
              "hogwild_replica_examples"), driver=driver)  # fmt: skip
        replica = psutil.Process(pid_of(run_dir, "replica 1"))
        (victim,) = [c for c in replica.children(recursive=True) if c.name() == f"{PROCESS_NAME}1"]
        killed.append(victim.pid)
        os.kill(victim.pid, signal.SIGKILL)

    final, records, stderr = _run_and_kill(mnist_dir, tmp_path, args, 4, kill)
    assert killed
    assert "replica 1 on localhost" in stderr and "restarting (1 of" in stderr, stderr[-3000:]
    assert final["restarts"] == {"replica-1": 1}, final
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    assert epoch["examples"] == SUBSET == sum(epoch["per_replica_examples"].values())
    assert final["test_accuracy"] >= FLOOR, final  # it learns (0.75 was inside the spread)
    moved = _rows_moved(tmp_path / "run", 2)  # each partition's rows reached the servers
    assert all(min(slices) >= MOVED for slices in moved), moved
