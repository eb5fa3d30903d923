"""One partitioned replica over two namespace hosts: partition 0 in host 1, partition 1 in host 2.

``hogwild partition-host`` waits in host 2 under the job's CURVE keys; ``hogwild train
--partitions 2 --model.partition_hosts=H1:P,H2:P`` in host 1 sends it the job and trains, the
activations and errors crossing the (virtual) network as frames. The job learns well above
chance, host 2 sent the blocks its partition computed, both commands end by themselves with
status 0, and neither host keeps a process or a shared-memory segment afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from hogwild.net.auth import make_keys
from tests.cluster.test_cluster import job_segments, unique_job

pytestmark = pytest.mark.slow

SUBSET = 500
PORT = 5701
JOB_WITHIN_S = 600.0


def test_partitions_on_two_hosts_train_and_leave_nothing_behind(make_hosts, mnist_dir, tmp_path):
    hosts = make_hosts(2)
    keys = str(make_keys(tmp_path / "keys"))
    leader_at, follower_at = (f"{hosts.address(h)}:{PORT}" for h in (1, 2))
    job = unique_job()  # its segments carry it: a partitioned job beside this test owns others
    follower = hosts.run(
        2,
        [sys.executable, "-m", "hogwild.cli", "partition-host", "--bind", follower_at,
         "--keys", keys, "--wait-s", str(JOB_WITHIN_S)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    metrics = tmp_path / "metrics.jsonl"
    leader = hosts.run(
        1,
        [sys.executable, "-m", "hogwild.cli", "train", "--data", str(mnist_dir),
         "--partitions", "2", "--epochs", "1", "--subset", str(SUBSET), "--no-progress",
         "--metrics", str(metrics), f"--model.partition_hosts={leader_at},{follower_at}",
         f"--ps.job={job}",
         f"--cluster.keys={keys}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _, leader_err = leader.communicate(timeout=JOB_WITHIN_S)
    assert leader.returncode == 0, leader_err
    follower_out, follower_err = follower.communicate(timeout=60)
    assert follower.returncode == 0, follower_err
    assert f"partitions 1 of 2 running for the leader at {leader_at}" in follower_out
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    final = next(r for r in records if r["event"] == "final")
    assert final["examples"] == SUBSET
    assert final["test_accuracy"] > 0.3, final  # chance is 0.1
    # partition 1's activations and partial errors crossed: about half of the plan's bytes
    # per example, in CURVE frames
    assert hosts.sent_bytes(2) > SUBSET * final["bytes_per_example"] // 4
    deadline = time.monotonic() + 10
    while (hosts.pids(1) or hosts.pids(2)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert hosts.pids(1) == [] and hosts.pids(2) == []
    assert job_segments(job) == set()
