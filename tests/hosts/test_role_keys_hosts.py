"""A key pair per role in a job beyond loopback: the local launcher's job in one namespace host,
probed from another as a machine on the same network would.

The driver runs in host 1 with ``cluster.host`` host 1's address (so every role binds it, under
CURVE): it makes the job's roster, a key pair per role in its private directory, public keys
alone in ``RUN_DIR/keys``. From host 2, while the job is in its first epoch: a client without
keys gets no answer from any server, one with the job's user's key is answered, and a replication
message (``COMMIT``) sent with that key is refused by each parameter server as not a server's; in
host 1, ``hogwild cluster status RUN_DIR`` is answered (it finds the user's key pair by itself).
The job's training worker is held (SIGSTOP) from when it is first seen until those probes are
over, so the job cannot end before them on a loaded host, and it trains no more than its accuracy
bound needs (2 epochs of 10,000 examples: 0.96 in a run here). The job's stall limit
(``train.stall_s``) is raised to 600 s, so that a held worker is not taken for a stalled one
while the probes (each bounded at 60 s) run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hogwild.net.auth import read_roster
from hogwild.training.worker import PROCESS_NAME

pytestmark = pytest.mark.slow

JOB_WITHIN_S = 600.0
WORKER = PROCESS_NAME.format("")  # the start of a training worker's process name
ROOT = Path(__file__).resolve().parents[2]


def test_every_role_has_its_own_key_and_a_forger_is_refused(make_hosts, mnist_dir, tmp_path):
    hosts = make_hosts(2)
    run_dir = tmp_path / "run"
    argv = [
        sys.executable, "-m", "hogwild.cli", "cluster", "--data", str(mnist_dir),
        "--epochs", "2", "--replicas", "1", "--workers-per-replica", "1", "--ps", "2",
        "--data-servers", "1", "--train.subset=10000", "--train.stall_s=600",
        f"--cluster.host={hosts.address(1)}",
        "--checkpoint-dir", str(run_dir), "--metrics", str(tmp_path / "m.jsonl"), "--no-progress",
    ]  # fmt: skip
    held: list[psutil.Process] = []
    driver = hosts.run(1, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + JOB_WITHIN_S
        while not (run_dir / "cluster.json").is_file():  # every role started
            assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
            time.sleep(0.2)
        held = _hold_worker(driver, run_dir, deadline)
        roster = read_roster(run_dir / "keys")
        start = next(
            json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()
            if json.loads(line)["event"] == "start"
        )  # fmt: skip
        ps, data = start["ps_servers"], start["data_servers"]
        probe = hosts.check(2, [
            sys.executable, "-m", "tests.hosts.keyless", start["config"]["ps"]["job"],
            start["config"]["ps"]["keys"], "--ps", *ps, "--data", *data,
            "--identity", str(run_dir / "private-keys" / "user.key_secret"),
        ], cwd=str(ROOT))  # fmt: skip
        status = hosts.check(
            1, [sys.executable, "-m", "hogwild.cli", "cluster", "status", str(run_dir), "--json"]
        )  # the user's key, found by itself
        _release(held)
        stdout, stderr = driver.communicate(timeout=JOB_WITHIN_S)
    finally:
        _release(held)
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 0, stderr[-3000:]
    assert set(roster) == {"driver", "user", "ps 0", "ps 1", "data 0", "replica 0"}
    assert len({entry["key"] for entry in roster.values()}) == len(roster)  # each its own
    assert {roster[f"ps {i}"]["address"] for i in (0, 1)} == set(ps)
    assert roster["data 0"]["address"] == data[0] and roster["replica 0"]["address"]
    assert [p.name for p in (run_dir / "keys").iterdir()] == ["roster.json"]  # public only
    private = run_dir / "private-keys"
    assert private.stat().st_mode & 0o077 == 0
    assert all(p.stat().st_mode & 0o077 == 0 for p in private.iterdir())
    found = json.loads(probe.strip().splitlines()[-1])
    assert set(found) == {*ps, *data}
    for address, seen in found.items():
        forged = {"forged_refused": True} if address in ps else {}
        assert seen == {"keyless_refused": True, "keyed_answered": True, **forged}, address
    assert json.loads(status.strip().splitlines()[-1])["job"] == start["config"]["ps"]["job"]
    final = json.loads(stdout.strip().splitlines()[-1])
    assert final["test_accuracy"] > 0.9, final


def _hold_worker(driver, run_dir: Path, deadline: float) -> list[psutil.Process]:
    """SIGSTOP the job's training worker (below replica 0's role) as soon as it is there: the
    processes stopped."""
    roles = json.loads((run_dir / "cluster.json").read_text())["roles"]
    replica = next(r["pid"] for r in roles if r["name"] == "replica 0")
    while True:
        assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
        try:
            below = psutil.Process(replica).children(recursive=True)
        except psutil.Error:  # the replica gone: the driver's poll above says why, next round
            below = []
        workers = [p for p in below if _name(p).startswith(WORKER)]
        if workers:
            for worker in workers:
                worker.send_signal(signal.SIGSTOP)
            return workers
        time.sleep(0.05)


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:  # gone meanwhile
        return ""


def _release(held: list[psutil.Process]) -> None:
    while held:
        try:
            held.pop().send_signal(signal.SIGCONT)
        except psutil.Error:  # gone: nothing to let go on
            pass
