"""One partitioned replica over two namespace hosts: partition 0 in host 1, partition 1 in host 2.

``hogwild partition-host`` waits in host 2 under the job's CURVE keys; ``hogwild train
--partitions 2 --model.partition_hosts=H1:P,H2:P`` in host 1 sends it the job and trains, the
activations and errors crossing the (virtual) network as frames. The job learns well above
chance, host 2 sent the blocks its partition computed, both commands end by themselves with
status 0, and neither host keeps a process or a shared-memory segment afterwards.

Losing either end (``model.partition_silence_s`` short, so that the suite does not wait the
default 30 s): the leader SIGKILLed mid-epoch leaves the follower unheard-from; once the silence
has lasted the setting, the follower stops its partitions and exits 1 naming the leader, and its
partitions and arena are gone (the leader's own partitions saw their parent die and removed its
arena). The follower's host lost (every process in it SIGKILLed, its cable pulled): the leader
stops the job naming the host and its partition, exits 1, and leaves nothing of its own; only
the segment the lost host's processes held is left, as a dead machine's memory would be.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from hogwild.net.auth import make_keys
from hogwild.shm.naming import parse_segment_name
from hogwild.shm.sweeper import unlink_segment
from tests.bench_runs import small_mnist
from tests.cluster.test_cluster import job_segments, unique_job

pytestmark = pytest.mark.slow

SUBSET = 500
PORT = 5701
JOB_WITHIN_S = 600.0
SILENCE_S = 3.0  # model.partition_silence_s in the fault tests: six of the hosts' beats
STOPS_WITHIN_S = 30.0  # from the silence's end to the process's exit, on a loaded machine


@pytest.fixture
def small_dir(mnist_dir, tmp_path_factory):
    """MNIST's first 10,000 training and 2,000 test images (written once per session): the jobs
    train on at most 2,000, and the leader's final evaluation, in one process, of 2,000 test
    images rather than 10,000 still tells a trained model (above 0.3) from chance (0.1). The
    first 2,000 test images come from the test set's first 5,000, which LeCun calls the cleaner,
    easier half: the accuracy reads a little higher than on all 10,000, so the bound is a little
    looser in effect (chance, SD about 0.007 on 2,000, still fails it)."""
    return small_mnist(mnist_dir, tmp_path_factory)


def _start_job(hosts, data_dir, tmp_path, job: str, *options: str):
    """``hogwild partition-host`` in host 2, then ``hogwild train`` for it in host 1 with
    ``options``: (follower, leader, leader's address, follower's address, metrics file)."""
    keys = str(make_keys(tmp_path / "keys"))
    leader_at, follower_at = (f"{hosts.address(h)}:{PORT}" for h in (1, 2))
    follower = hosts.run(
        2,
        [sys.executable, "-m", "hogwild.cli", "partition-host", "--bind", follower_at,
         "--keys", keys, "--wait-s", str(JOB_WITHIN_S)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    metrics = tmp_path / "metrics.jsonl"
    leader = hosts.run(
        1,
        [sys.executable, "-m", "hogwild.cli", "train", "--data", str(data_dir),
         "--partitions", "2", "--no-progress", "--metrics", str(metrics),
         f"--model.partition_hosts={leader_at},{follower_at}", f"--ps.job={job}",
         f"--cluster.keys={keys}", *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return follower, leader, leader_at, follower_at, metrics


def _nothing_left_in(hosts, *numbers: int) -> None:
    deadline = time.monotonic() + 10
    while any(hosts.pids(h) for h in numbers) and time.monotonic() < deadline:
        time.sleep(0.1)
    for h in numbers:
        assert hosts.pids(h) == [], f"host {h} still runs {hosts.pids(h)}"


def test_partitions_on_two_hosts_train_and_leave_nothing_behind(make_hosts, small_dir, tmp_path):
    hosts = make_hosts(2)
    job = unique_job()  # its segments carry it: a partitioned job beside this test owns others
    follower, leader, leader_at, _, metrics = _start_job(
        hosts, small_dir, tmp_path, job, "--epochs", "1", "--subset", str(SUBSET)
    )
    _, leader_err = leader.communicate(timeout=JOB_WITHIN_S)
    assert leader.returncode == 0, leader_err
    _, follower_err = follower.communicate(timeout=60)
    assert follower.returncode == 0, follower_err
    assert f"partitions 1 of 2 running for the leader at {leader_at}" in follower_err
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    final = next(r for r in records if r["event"] == "final")
    assert final["examples"] == SUBSET
    assert final["test_accuracy"] > 0.3, final  # chance is 0.1
    # partition 1's activations and partial errors crossed: about half of the plan's bytes
    # per example, in CURVE frames
    assert hosts.sent_bytes(2) > SUBSET * final["bytes_per_example"] // 4
    _nothing_left_in(hosts, 1, 2)
    assert job_segments(job) == set()


def _long_job(hosts, data_dir, tmp_path, job: str):
    """A job that would train for minutes, hosts lost after :data:`SILENCE_S`, once started."""
    started = _start_job(
        hosts, data_dir, tmp_path, job, "--epochs", "50", "--subset", "2000",
        f"--model.partition_silence_s={SILENCE_S}",
    )  # fmt: skip
    follower, leader, _, _, metrics = started
    deadline = time.monotonic() + JOB_WITHIN_S
    while not (metrics.exists() and '"event": "start"' in metrics.read_text()):
        assert leader.poll() is None, leader.communicate()[1]
        assert follower.poll() is None, follower.communicate()[1]
        assert time.monotonic() < deadline, "the partitions did not start"
        time.sleep(0.1)
    return started


def test_a_leader_killed_mid_epoch_leaves_its_follower_to_stop_naming_it(
    make_hosts, small_dir, tmp_path
):
    hosts = make_hosts(2)
    job = unique_job()
    follower, leader, leader_at, _, _ = _long_job(hosts, small_dir, tmp_path, job)
    assert len(hosts.pids(2)) > 1  # the follower host and its partition
    killed = time.monotonic()
    leader.kill()  # `ip netns exec` execs the command: this is hogwild train itself
    leader.communicate()
    _, err = follower.communicate(timeout=SILENCE_S + STOPS_WITHIN_S)
    waited = time.monotonic() - killed
    assert follower.returncode == 1, err
    assert f"the leader at {leader_at} was silent for {SILENCE_S:g} s" in err, err
    # it waited out much of the setting: the follower counts the silence from the leader's
    # last message, which a leader starved of CPU on a loaded machine sent a beat or more before
    # it was killed (1.93 s of 3 seen in a full run, the bound before was 2)
    assert waited >= SILENCE_S / 2, waited
    _nothing_left_in(hosts, 1, 2)  # the leader's partitions followed their parent
    assert job_segments(job) == set()  # the follower's arena, and the leader's (its partitions)


def test_a_lost_follower_host_stops_the_job_naming_it(make_hosts, small_dir, tmp_path):
    hosts = make_hosts(2)
    job = unique_job()
    follower, leader, leader_at, follower_at, _ = _long_job(hosts, small_dir, tmp_path, job)
    lost = set(hosts.lose(2))  # every process in host 2 SIGKILLed, its cable pulled
    try:
        assert follower.pid in lost
        follower.communicate()
        lost_at = time.monotonic()
        _, err = leader.communicate(timeout=SILENCE_S + STOPS_WITHIN_S)
        waited = time.monotonic() - lost_at
        assert leader.returncode == 1, err
        assert f"partition host {follower_at} (partitions 1) was silent for {SILENCE_S:g} s" in err
        assert waited >= SILENCE_S - 2 * 0.5, waited
        _nothing_left_in(hosts, 1, 2)
        left = job_segments(job)  # what the lost machine's memory held, its owners dead
        assert {parse_segment_name(name).pid for name in left} <= lost, left
        # the machine back (here: this one's memory), a partition host started on it sweeps
        # them before it waits for a leader (any job's start sweeps dead owners' segments: a
        # replica started meanwhile by a test beside this one may have swept them first)
        again = hosts.run(
            1,
            [sys.executable, "-m", "hogwild.cli", "partition-host", "--bind", leader_at,
             "--keys", str(tmp_path / "keys"), "--wait-s", "0.5"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _, err = again.communicate(timeout=60)
        assert again.returncode == 1 and "no leader sent" in err, err
        swept = {line.split()[1].strip("/:") for line in err.splitlines() if "removed" in line}
        assert job_segments(job) == set(), (left, swept)
    finally:  # the lost machine's memory goes with it; here it is this machine's
        for name in job_segments(job):
            if parse_segment_name(name).pid in lost:
                unlink_segment("/" + name)
