"""``cluster.etcd = "job"`` end to end with the local launcher: the job's own etcd cluster.

A job with three copies of each parameter server and its own three-member etcd cluster on
loopback loses a member while it trains (SIGKILL, the member its clients talk to first), then two
of its parameter servers, which are replaced, and ends well, carrying the config its roles ran
into its records and checkpoint; afterwards no etcd process and no etcd data directory is left.
SIGTERM of the driver stops the members with the job, leaving nothing either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest

from hogwild.training.checkpoint import load_checkpoint
from tests.cluster.test_cluster import (
    FAULT_ACCURACY,
    FAULT_SUBSET,
    _run_and_kill,
    cluster_command,
    gauge,
    pid_of,
    processes_of,
    scrape,
    until,
    wait_for_roles,
)

pytestmark = pytest.mark.slow

ARGS = ("--epochs", "2", "--replicas", "1", "--ps", "3", "--cluster.copies=3",
        "--cluster.etcd=job", f"--train.subset={FAULT_SUBSET}", "--evaluate-every=0")  # fmt: skip
LEASE_S = 1.0  # the lease the driver chooses with a local etcd: its measured floor, 1 s


def etcd_members(driver_pid: int) -> list[psutil.Process]:
    """The etcd members the driver started (its children named etcd), in member order."""
    try:
        children = psutil.Process(driver_pid).children()
    except psutil.NoSuchProcess:
        return []
    members = []
    for child in children:
        try:
            if child.name() == "etcd" and child.status() != psutil.STATUS_ZOMBIE:
                name = next(a for a in child.cmdline() if a.startswith("--name="))
                members.append((name, child))
        except (psutil.Error, StopIteration):
            continue
    return [child for _, child in sorted(members, key=lambda pair: pair[0])]


def left_behind(tmp) -> tuple[list, list]:
    """Live processes whose command line names ``tmp`` (the members' data lives there), and the
    etcd work directories in it."""
    return processes_of(tmp), sorted(p.name for p in tmp.glob("hogwild-etcd-*"))


@pytest.fixture
def job_tmp(tmp_path, monkeypatch):
    """The driver's temporary directory, where its etcd members keep their data."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    return tmp


def test_a_job_loses_an_etcd_member_and_two_copies_servers_and_goes_on(
    mnist_dir, tmp_path, job_tmp
):
    """The job's own etcd cluster loses a member while it trains (SIGKILL, the member its clients
    talk to first): no server dies of it. Then ps 0 and ps 1 (of three keeping three copies of
    every bucket) are SIGKILLed in turn: each is replaced, and the job goes on to a trained model.
    One job checks both: the etcd member's loss and the servers' were two jobs of the same shape
    (one replica, three servers keeping three copies)."""
    killed = []

    def kill(run_dir, first_port, driver):  # ports: driver, ps 0, ps 1, ps 2, replica 0
        members = until("three etcd members", lambda: len(etcd_members(driver.pid)) == 3
                        and etcd_members(driver.pid), driver=driver)  # fmt: skip
        until("replica 0 training", lambda: gauge(scrape(first_port + 4),
              "hogwild_replica_examples"), driver=driver)  # fmt: skip
        members[0].kill()  # the first member named: every client's first choice
        killed.append(members[0].pid)
        # training goes on for a few leases (the auto lease is etcd's 1 s) before a server is
        # killed, so that one dying of the member's loss (its lease clock lapsing) is seen
        servers = [pid_of(run_dir, f"ps {i}") for i in range(3)]
        at_loss = gauge(scrape(first_port + 4), "hogwild_replica_examples") or 0
        settled = time.monotonic() + 3 * LEASE_S
        until("training 3 leases past the etcd member's loss", lambda: time.monotonic() > settled
              and gauge(scrape(first_port + 4), "hogwild_replica_examples") > at_loss,
              driver=driver)  # fmt: skip
        assert [pid for pid in servers if _gone(pid)] == [], "a server died of the member's loss"
        first = servers[0]
        os.kill(first, signal.SIGKILL)
        until("ps 0 replaced", lambda: pid_of(run_dir, "ps 0") != first, driver=driver)
        os.kill(pid_of(run_dir, "ps 1"), signal.SIGKILL)

    final, records, stderr = _run_and_kill(mnist_dir, tmp_path, ARGS, 5, kill)
    ran = records[0]["config"]["cluster"]["etcd"]
    assert len(ran.split(",")) == 3 and ran.startswith("127.0.0.1:")  # the roles got all three
    assert killed and _gone(killed[0])
    for name in ("ps 0", "ps 1"):
        assert f"{name} on localhost was killed by SIGKILL; restarting (1 of 3)" in stderr, name
    # the servers failed over to an etcd member left: none died of the member's loss, and the two
    # killed were replaced once each
    assert final["restarts"] == {"ps-0": 1, "ps-1": 1}, final["restarts"]
    assert final["test_accuracy"] >= FAULT_ACCURACY, final
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1]
    assert [r["examples"] for r in epochs] == [FAULT_SUBSET, FAULT_SUBSET]
    # the checkpoint and the final record carry the config the roles ran (the etcd and the lease
    # the driver chose), so a --resume compares against what ran, not the settings before them
    config = records[0]["config"]
    assert config["cluster"]["etcd"] and config["ps"]["lease_s"] > 0
    assert [r["config"] for r in records if r["event"] == "final"] == [config]
    assert load_checkpoint(tmp_path / "run").info["config"] == config
    assert left_behind(job_tmp) == ([], [])


def test_sigterm_of_the_driver_stops_its_etcd_members(mnist_dir, tmp_path, job_tmp):
    run_dir = tmp_path / "run"
    driver = subprocess.Popen(cluster_command(mnist_dir, run_dir, *ARGS), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for_roles(run_dir, driver)
        members = etcd_members(driver.pid)
        assert len(members) == 3
        driver.send_signal(signal.SIGTERM)
        _, stderr = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert [member.pid for member in members if not _gone(member.pid)] == []
    assert processes_of(run_dir) == []
    assert left_behind(job_tmp) == ([], [])


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
