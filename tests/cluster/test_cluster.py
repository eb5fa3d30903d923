"""``hogwild cluster`` end to end with the local launcher: every role a real process on loopback.

A job of two replicas (one worker each), two parameter servers and a data server trains MNIST
to 98 % in two epochs of 40,000 examples, writes per-epoch metrics with the cluster's fields and
a checkpoint in ``hogwild train``'s format, and leaves nothing behind. A running job answers
``hogwild cluster status`` and serves every role's counters to Prometheus. SIGKILL of a role of
each kind stops the whole job within 10 s with an error naming the role and how it ended, and
leaves no process and no shared-memory segment, when the role is a parameter server or
``cluster.restarts = 0``.
Otherwise a SIGKILLed replica or data server is restarted and the job completes: the portions a
replica lost are trained again (every epoch counts each example once), a data server comes back
on its address and serves again, and the summary counts the restarts. Every role is forked from
the job's role server and titled with its command line, a replica's workers' forkserver from the
replica; a SIGKILLed driver takes them all down.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from bench.support.paper_job import PAPER_JOB  # Adam's model on the old schedule: learns fast
from hogwild.shm import sweeper
from hogwild.shm.naming import parse_segment_name, sanitize_job
from hogwild.training.checkpoint import load_checkpoint
from hogwild.training.zygote import FORKED_TITLE

pytestmark = pytest.mark.slow

STARTED_WITHIN_S = 240.0  # cold numba caches on a loaded 2-core machine
STOPPED_WITHIN_S = 10.0
ROLES_END_WITHIN_S = 60.0  # roles ending by themselves once their driver died, on a loaded machine
# The jobs that lose a role and go on train FAULT_SUBSET examples an epoch, evaluated once, at the
# end: the faults need a job that is still training when they come, and the accuracy only says
# that the job learned through them (chance is 10 %).
FAULT_SUBSET = 10_000
FAULT_ACCURACY = 0.93


def cluster_command(data: Path, run_dir: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "hogwild.cli", "cluster", "--data", str(data),
        "--checkpoint-dir", str(run_dir), "--metrics", str(run_dir / "metrics.jsonl"),
        "--no-progress", "--workers-per-replica", "1", *PAPER_JOB, *args,
    ]  # fmt: skip


def processes_of(run_dir: Path) -> list[psutil.Process]:
    """Live processes whose command line names the job's run directory (its roles, workers)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(str(run_dir) in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def hogwild_segments() -> set[str]:
    try:
        return {e for e in os.listdir(sweeper.SHM_DIR) if e.startswith("hogwild")}
    except FileNotFoundError:
        return set()


def unique_job() -> str:
    """A job name no other job on the machine has (``--ps.job``): every segment of the job
    carries it (:mod:`hogwild.shm.naming`), so what the job leaves is told apart from what jobs
    of other tests running beside it own."""
    return f"test_{os.getpid()}_{secrets.token_hex(4)}"


def job_segments(job: str) -> set[str]:
    """The segments in ``/dev/shm`` named for job ``job``, whoever owns them."""
    return {
        name
        for name in hogwild_segments()
        if (owner := parse_segment_name(name)) is not None and owner.job == sanitize_job(job)
    }


def _ephemeral_start() -> int:
    """The first port of the kernel's range for outgoing connections and port-0 binds."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive TCP ports free on loopback right now, below the ephemeral
    range: a port there may go to any outgoing connection on the machine (the other worker's
    tests' too) between this check and the role's bind, seconds later."""
    below = max(_ephemeral_start(), 20_000 + 16 * n) - n
    for first in [
        *range(random.randrange(20_000, below, 16), below, 16),
        *range(20_000, below, 16),
    ]:
        try:
            with contextlib.ExitStack() as stack:
                for port in range(first, first + n):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    pytest.fail(f"no {n} consecutive free ports")


def scrape(port: int) -> str:
    """The text a Prometheus server would scrape from a role's endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.read().decode()


def wait_for_roles(run_dir: Path, driver: subprocess.Popen) -> dict:
    """cluster.json once every role started and the replicas train."""
    deadline = time.monotonic() + STARTED_WITHIN_S
    where = run_dir / "cluster.json"
    while time.monotonic() < deadline:
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        if where.is_file():
            try:
                return json.loads(where.read_text())
            except ValueError:
                pass  # being written
        time.sleep(0.2)
    driver.kill()
    pytest.fail(f"the job did not start within {STARTED_WITHIN_S:g} s: {driver.communicate()}")


def test_two_replicas_two_servers_and_a_data_server_reach_98_percent(mnist_dir, tmp_path):
    run_dir = tmp_path / "run"
    # Two epochs of 40,000 examples: two of 30,000 reached 98.34 % and 98.37 % here (two runs
    # under load), the full 60,000 (twice the training) is not needed for the bound.
    command = cluster_command(mnist_dir, run_dir, "--epochs", "2", "--replicas", "2", "--ps",
                              "2", "--data-servers", "1", "--train.subset=40000")  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    final = json.loads(done.stdout.strip().splitlines()[-1])
    assert final["test_accuracy"] >= 0.98, final
    assert final["replicas"] == 2 and final["ps_servers"] == 2 and final["data_servers"] == 1

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (start,) = [r for r in records if r["event"] == "start"]
    assert start["evaluate"] == "between"  # auto: the local driver shares the replicas' cores
    assert (start["n_push"], start["n_fetch"]) == (512, 512)  # the ps store's own cadence
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1]
    for record in epochs:
        assert record["eval_s"] > 0
        assert set(record["per_replica_examples"]) == {"0", "1"}  # both replicas trained
        assert record["updates_per_s"] >= 0 and sum(record["staleness"].values()) > 0
        assert record["fetch_wait_s"] >= 0 and record["data_wait_s"] >= 0
    assert sum(epochs[0]["per_replica_examples"].values()) == epochs[0]["examples"]
    assert 0 < epochs[0]["ps_updates"] < epochs[1]["ps_updates"]  # the servers applied pushes

    restored = load_checkpoint(run_dir)  # hogwild train's format, hashes verified
    assert restored.epoch == 1 and str(restored.path) == final["checkpoint"]
    assert "fc1.weight" in restored.weights
    assert not (run_dir / "cluster.json").exists()
    assert processes_of(run_dir) == []


ROLE_COMMANDS = {  # how each kind of role is found by its command line
    "ps": "-m hogwild.cli ps serve --config",
    "data": "-m hogwild.cli data serve",
    "replica": "-m hogwild.cli cluster --config",
}


def assert_forked_and_titled(roles: list[dict], run_dir: Path) -> None:
    """Every role was forked from the job's role server, leads a session of its own, and its
    command line names its kind and the job's run directory (``ps``, ``processes_of`` and the
    chaos benches find it so)."""
    for role in roles:
        proc = psutil.Process(role["pid"])
        line = " ".join(proc.cmdline())
        kind, index = role["name"].split()
        assert ROLE_COMMANDS[kind] in line and str(run_dir) in line, (role, line)
        if kind == "replica":
            assert f" replica --index {index} " in line, line
            # its workers' forkserver, forked from it as it began, titled as what it is and
            # whose (so that processes_of finds one left behind), never as the role
            servers = []
            for child in proc.children():
                with contextlib.suppress(psutil.Error):  # a worker ended meanwhile
                    servers.append(" ".join(child.cmdline()))
            owner = f"for pid {role['pid']}, a role of the hogwild role server of {run_dir}"
            assert [s for s in servers if f"{FORKED_TITLE}, {owner}" in s], servers
            assert not [s for s in servers if ROLE_COMMANDS[kind] in s], servers
        assert os.getsid(role["pid"]) == role["pid"]  # its own session: no Ctrl-C reaches it
        server = " ".join(proc.parent().cmdline()).strip()  # a title: one part, NULs after
        assert server == f"hogwild role server of {run_dir}", (role, server)


def _kill_a_role(mnist_dir, tmp_path, kind: str, args: tuple[str, ...]) -> tuple[str, Path]:
    run_dir = tmp_path / "run"
    job = unique_job()
    metrics_port = free_ports(4)
    command = cluster_command(mnist_dir, run_dir, "--epochs", "50", f"--ps.job={job}", *args)
    command.append(f"--cluster.metrics_port={metrics_port}")
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        where = wait_for_roles(run_dir, driver)
        if kind == "ps":  # while it runs, the job answers `hogwild cluster status`
            scraped = {
                name: scrape(metrics_port + k) for k, name in enumerate(("driver", "ps 0", "ps 1"))
            }
            assert 'hogwild_driver_replicas{role="driver"} 1.0' in scraped["driver"]
            assert 'hogwild_ps_n_params{role="ps 1"}' in scraped["ps 1"]
            assert 'hogwild_ps_updates_per_s{role="ps 0"}' in scraped["ps 0"]
            deadline = time.monotonic() + 60  # until the replica has its first portion
            while 'hogwild_replica_examples{role="replica 0"}' not in scrape(metrics_port + 3):
                assert time.monotonic() < deadline, scrape(metrics_port + 3)
                time.sleep(0.2)
            status = subprocess.run(
                [sys.executable, "-m", "hogwild.cli", "cluster", "status", str(run_dir), "--json"],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert status.returncode == 0, status.stderr
            assert json.loads(status.stdout)["job"] == where["job"]
        until("the job's segments named for it", lambda: job_segments(job), driver=driver)
        assert_forked_and_titled(where["roles"], run_dir)
        (victim,) = [r for r in where["roles"] if r["name"] == f"{kind} 0"]
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = driver.communicate(timeout=60)
        took = time.monotonic() - killed_at
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 1, stderr[-3000:]
    assert took <= STOPPED_WITHIN_S, f"the job took {took:.1f} s to stop"
    assert f"{kind} 0 on localhost was killed by SIGKILL" in stderr, stderr[-3000:]
    assert "last checkpoint" in stderr  # the job says its checkpoints are kept

    deadline = time.monotonic() + 30  # orphaned workers remove their arena by themselves
    while time.monotonic() < deadline and (processes_of(run_dir) or job_segments(job)):
        time.sleep(0.2)
    assert processes_of(run_dir) == []
    assert job_segments(job) == set()
    return stderr, run_dir


# Not alone: the stop waits for events only (a worker inside its share is terminated at once,
# its requests in flight to the dead role cancelled), so a busy neighbour's load no longer
# stretches a fixed wait (the gang's 5 s stop timeout, a data read's 2 x 2 s) past the bound.
@pytest.mark.parametrize(
    "kind, args",
    [
        ("ps", ("--replicas", "1", "--ps", "2")),  # never restarted
        ("data", ("--replicas", "1", "--ps", "1", "--data-servers", "1", "--cluster.restarts=0")),
        ("replica", ("--replicas", "2", "--ps", "1", "--cluster.restarts=0")),
    ],
)
def test_a_killed_role_stops_the_job_naming_it(mnist_dir, tmp_path, kind, args):
    _kill_a_role(mnist_dir, tmp_path, kind, args)


def gauge(text: str, name: str) -> float | None:
    """The value of the first sample of ``name`` in a Prometheus scrape, if there is one."""
    found = re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def pid_of(run_dir: Path, name: str) -> int:
    where = json.loads((run_dir / "cluster.json").read_text())
    (role,) = [r for r in where["roles"] if r["name"] == name]
    return role["pid"]


def until(what: str, check, seconds: float = 60.0, driver: subprocess.Popen | None = None):
    """Wait (bounded) for ``check()`` to return something true; that."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if driver is not None and driver.poll() is not None:
            pytest.fail(
                f"the job ended while waiting for {what}: {driver.communicate()[1][-3000:]}"
            )
        with contextlib.suppress(OSError, ValueError):
            found = check()
            if found:
                return found
        time.sleep(0.1)
    pytest.fail(f"no {what} within {seconds:g} s")


def job_ended(driver: subprocess.Popen, after: str, seconds: float = 300.0) -> tuple[str, str]:
    """The driver's stdout and stderr once the job ended, ``seconds`` at most after ``after``;
    past that it is killed and the test fails naming what it waited for."""
    try:
        return driver.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        driver.kill()
        _, stderr = driver.communicate()
        pytest.fail(f"the job did not end within {seconds:.0f} s after {after}: {stderr[-3000:]}")


def still_running(driver: subprocess.Popen, deadline: float, what: str) -> None:
    """Fail naming ``what`` was awaited if the job ended, or if ``deadline`` (monotonic) passed:
    then the driver is killed first, so that its output is read without waiting for the job."""
    if driver.poll() is not None:
        pytest.fail(f"the job ended while waiting for {what}: {driver.communicate()[1][-3000:]}")
    if time.monotonic() >= deadline:
        driver.kill()
        pytest.fail(f"no {what} before the deadline: {driver.communicate()[1][-3000:]}")


def _run_and_kill(
    mnist_dir, tmp_path, args: tuple[str, ...], n_roles: int, kill, job: str | None = None
) -> tuple:
    """Run a job (named ``job``, or a name of its own) with Prometheus ports,
    ``kill(run_dir, first_port, driver)`` while it trains; its final summary, its metrics
    records and its stderr, once every role is gone."""
    run_dir = tmp_path / "run"
    job = job or unique_job()
    first_port = free_ports(n_roles)
    command = cluster_command(
        mnist_dir, run_dir, f"--ps.job={job}", *args, f"--cluster.metrics_port={first_port}"
    )
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_roles(run_dir, driver)
        until("the job's segments named for it", lambda: job_segments(job), driver=driver)
        kill(run_dir, first_port, driver)
        stdout, stderr = job_ended(driver, "the kills")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 0, stderr[-3000:]
    final = json.loads(stdout.strip().splitlines()[-1])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert processes_of(run_dir) == []
    assert job_segments(job) == set()
    return final, records, stderr


def test_a_sigkilled_driver_takes_every_forked_role_down_with_it(mnist_dir, tmp_path):
    """The roles' parent is the role server, not the driver: each watches the driver itself."""
    run_dir = tmp_path / "run"
    job = unique_job()
    args = ("--epochs", "50", "--replicas", "1", "--ps", "1", "--data-servers", "1")
    command = cluster_command(mnist_dir, run_dir, f"--ps.job={job}", *args)
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        where = wait_for_roles(run_dir, driver)
        assert_forked_and_titled(where["roles"], run_dir)
        roles = [psutil.Process(role["pid"]) for role in where["roles"]]
        assert len(roles) == 3
        driver.kill()
        driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    _, alive = psutil.wait_procs(roles, timeout=ROLES_END_WITHIN_S)  # SIGTERM: a ps flushes
    assert alive == [], [" ".join(proc.cmdline())[:200] for proc in alive if proc.is_running()]
    deadline = time.monotonic() + 30  # the server once its roles, orphaned workers their arena
    while time.monotonic() < deadline and (processes_of(run_dir) or job_segments(job)):
        time.sleep(0.2)
    assert processes_of(run_dir) == []
    assert job_segments(job) == set()


# One job loses a replica and then both its data servers (each SIGKILLed while it trains): the two
# faults were two jobs of the same shape, each starting its own driver, servers and replicas.
def test_a_killed_replica_and_killed_data_servers_come_back_and_the_job_completes(
    mnist_dir, tmp_path
):
    """Replica 1 is SIGKILLed: it is restarted and the portions it lost are trained again (every
    epoch counts each example once). Then data 0 and data 1 are SIGKILLed in turn: each comes
    back on its address, and data 0 serves again while data 1 is down."""
    args = ("--epochs", "3", "--replicas", "2", "--ps", "1", "--data-servers", "2",
            f"--train.subset={FAULT_SUBSET}", "--evaluate-every=0")  # fmt: skip

    def kill(run_dir, first_port, driver):  # ports: driver, ps 0, data 0, data 1, replica 0, 1
        until("replica 1 training", lambda: gauge(scrape(first_port + 5),
              "hogwild_replica_examples"), driver=driver)  # fmt: skip
        replica = pid_of(run_dir, "replica 1")
        os.kill(replica, signal.SIGKILL)
        until("replica 1 restarted", lambda: pid_of(run_dir, "replica 1") != replica,
              driver=driver)  # fmt: skip
        first = pid_of(run_dir, "data 0")
        os.kill(first, signal.SIGKILL)
        until("data 0 restarted", lambda: pid_of(run_dir, "data 0") != first, driver=driver)
        os.kill(pid_of(run_dir, "data 1"), signal.SIGKILL)  # data 0 alone serves the replicas
        until("data 0 serving again", lambda: gauge(scrape(first_port + 2),
              "hogwild_data_records"), driver=driver)  # fmt: skip

    final, records, stderr = _run_and_kill(mnist_dir, tmp_path, args, 6, kill)
    for name in ("replica 1", "data 0", "data 1"):
        assert f"{name} on localhost was killed by SIGKILL; restarting (1 of 3)" in stderr, name
    assert final["restarts"] == {"replica-1": 1, "data-0": 1, "data-1": 1}, final["restarts"]
    assert final["test_accuracy"] >= FAULT_ACCURACY, final
    restarts = [r for r in records if r["event"] == "restart"]
    (replica,) = [r for r in restarts if r["role"] == "replica 1"]
    assert replica["returncode"] == -signal.SIGKILL, replica
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1, 2]
    for record in epochs:  # the replica's lost portions were trained again, whole, counted once
        assert record["examples"] == FAULT_SUBSET == sum(record["per_replica_examples"].values())
    start = next(r for r in records if r["event"] == "start")
    served = sorted(r["address"] for r in restarts if r["role"].startswith("data "))
    assert served == sorted(start["data_servers"]), (served, start["data_servers"])  # same address


def test_a_paused_replica_is_fenced_and_restarted_and_a_resume_continues_the_job(
    mnist_dir, tmp_path
):
    """A replica paused (SIGSTOP, its workers too) does not answer the driver through every
    retry: the driver fences it on the servers (the process could live on), kills it, restarts
    it as its next incarnation, and hands its portions out again; the job completes its epoch.
    A fresh run into its directory is then refused, and ``--resume`` continues from its
    checkpoint of the servers' model. One job checks both: the pause and the first run of the
    resume were two jobs of the same shape (two replicas, a server, 6,000 examples)."""
    run_dir = tmp_path / "run"
    job = unique_job()
    common = ("--replicas", "2", "--ps", "1", "--train.subset=6000")
    common += ("--ps.timeout_s=2", "--ps.retries=2")  # taken for dead after 2 s x 3 tries

    def pause(run_dir, first_port, driver):  # ports: driver, ps 0, replica 0, replica 1
        until("replica 1 training", lambda: gauge(scrape(first_port + 3),
              "hogwild_replica_examples"), driver=driver)  # fmt: skip
        os.killpg(pid_of(run_dir, "replica 1"), signal.SIGSTOP)

    after_one, records, stderr = _run_and_kill(
        mnist_dir, tmp_path, ("--epochs", "1", *common), 4, pause, job=job
    )
    assert "replica 1 did not answer the driver" in stderr, stderr[-3000:]
    assert "replica 1 fenced below incarnation 1 on 1 of 1 parameter server(s)" in stderr
    assert "replica 1 on localhost was killed by SIGKILL; restarting (1 of 3)" in stderr
    assert after_one["restarts"] == {"replica-1": 1}
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    # the restarted replica's lost portions trained again with local data (no data server:
    # test_a_killed_replica_and_killed_data_servers_come_back_and_the_job_completes has two)
    assert epoch["examples"] == 6000 == sum(epoch["per_replica_examples"].values())

    common += (f"--ps.job={job}",)  # the same job, continued
    again = subprocess.run(  # a fresh run into the same directory is refused
        cluster_command(mnist_dir, run_dir, "--epochs", "2", *common),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert again.returncode == 2 and "--resume" in again.stderr

    resumed = subprocess.run(
        cluster_command(mnist_dir, run_dir, "--epochs", "2", "--resume", *common),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert final["examples"] == 6000  # one more epoch, not two
    restored = load_checkpoint(run_dir)
    assert restored.epoch == 1 and len(restored.info["history"]) == 2
    # the second epoch trained from the first one's model: its training loss is far below the
    # first epoch's, which started from random weights (0.39 against 0.23 here)
    assert final["train_loss"] < 0.8 * after_one["train_loss"]
