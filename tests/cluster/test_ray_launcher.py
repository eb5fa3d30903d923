"""``hogwild cluster --launcher ray`` end to end, on a real Ray head started on loopback.

The module's Ray head is this test's own: ``ray start --head`` in a session of its own, with its
own temporary directory and free ports, and it is stopped by signalling that session's processes
and their descendants (``ray stop`` would stop every Ray instance on the machine, other users'
too). It starts lean: no dashboard (the tests read the actors and placement groups from the
GCS itself, as ``ray memory`` does, not through the dashboard's state API), no log monitor (the
launcher's driver does not take its roles' output), no autoscaler monitor (nothing autoscales),
no usage stats, and no metrics or task events (``tests.hosts.ray_nodes.LEAN_ENV``). It has 5
logical CPUs on a 2-core machine: the job's 2 parameter servers and data server ask 1 CPU each
and its 2 replicas 1 CPU each (Ray's CPUs are logical; the local launcher runs the same 5 roles
on the same 2 cores).

A job of two replicas (one worker each), two parameter servers and a data server, every role a
Ray actor running its process, trains 10,000 MNIST examples to 93 % in two epochs (the same job
on the local launcher reaches 98 % on 40,000: ``test_cluster.py``; here what is checked is
Ray's part) while one replica, SIGKILLed, is restarted in its actor, writes each role's log in
the run directory, and leaves no process, no live actor and no placement group behind.
A replica of two partitions is one actor in one placement group of two CPUs (its partitions on
one node, around one arena), and trains.
The launcher itself, driven in a process of its own on the same head with ``cluster.host``
beyond loopback: a lost data server comes back at its address on its home node's IP; a server
homed where no node is, or on a node gone before Ray placed it, and a role Ray cannot place in
time, fail as roles within the start timeout, forgotten, their actors killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from bench.support.paper_job import PAPER_JOB  # Adam's model on the old schedule: learns fast
from hogwild.net.ports import free_ports
from hogwild.training.zygote import FORKED_TITLE
from tests.cluster.test_cluster import processes_of
from tests.hosts.ray_nodes import LEAN_ENV

pytest.importorskip("ray")
from ray._private.internal_api import get_state_from_address  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

HEAD_CPUS = 5
HEAD_STARTED_WITHIN_S = 120.0
HEAD_STOPPED_WITHIN_S = 10.0  # for SIGKILLed processes to be gone
JOB_WITHIN_S = 600.0
GONE_WITHIN_S = 30.0  # Ray kills actors and removes placement groups asynchronously
# Ray turns token authentication on when ~/.ray/auth_token exists (a local ray.init() makes
# one); on loopback the head and the job agree to go without, whatever this machine's state.
# Lean as the hosts tier's nodes: no metrics, no task events, a rare node report (LEAN_ENV).
RAY_ENV = {**os.environ, **LEAN_ENV, "RAY_AUTH_MODE": "disabled"}


def _session_processes(session: int) -> list[psutil.Process]:
    """The processes of the Ray head's session (``ray start``'s), and everything below them."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == session:
                found[proc.pid] = proc
                found.update((c.pid, c) for c in proc.children(recursive=True))
        except (OSError, psutil.Error):
            continue
    return list(found.values())


def _stop_head(session: int) -> None:
    """SIGKILL the head's session and wait for each process to be gone. Not SIGTERM first: the
    raylet, the GCS server, the dashboard's agent and the runtime-env agent outlive it by more
    than 10 s (so a grace period is always spent whole), and the head's state is thrown away
    with its temporary directory anyway."""
    for _ in range(3):  # a process forked while the others were killed is found the next time
        procs = _session_processes(session)
        if not procs:
            return
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=HEAD_STOPPED_WITHIN_S)


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head of this module's own on loopback: its GCS address, and a reader of its
    tables (a ``GlobalState``)."""
    temp = tempfile.mkdtemp(prefix="hwray-", dir="/tmp")  # short: Ray's sockets live in it
    port, agent, client = free_ports(3)
    command = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head",
        "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", str(HEAD_CPUS),
        "--include-dashboard=false", "--dashboard-agent-listen-port", str(agent),
        "--ray-client-server-port", str(client), "--object-store-memory", str(100 * 2**20),
        "--disable-usage-stats", "--include-log-monitor=false", "--no-monitor", "--temp-dir", temp,
    ]  # fmt: skip
    log_path = Path(temp) / "ray-start.log"
    with open(log_path, "w") as log:  # not a pipe: Ray's daemons inherit it and keep it open
        starter = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=RAY_ENV
        )
    try:
        try:
            code = starter.wait(HEAD_STARTED_WITHIN_S)
        except subprocess.TimeoutExpired:
            code = None
        if code != 0:
            pytest.fail(f"ray start --head: exit {code}: {log_path.read_text()[-3000:]}")
        gcs = get_state_from_address(f"127.0.0.1:{port}")  # its tables, read by the tests
        try:
            yield {"address": f"127.0.0.1:{port}", "gcs": gcs}
        finally:
            gcs.disconnect()
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        _stop_head(starter.pid)
        shutil.rmtree(temp, ignore_errors=True)


def _left_behind(ray_head: dict) -> tuple[list, list]:
    """Actors not dead and placement groups not removed, on the module's Ray head (read from
    its GCS, as Ray's own ``ray memory`` reads it: the state API would need the dashboard)."""
    state = ray_head["gcs"]
    actors = state.actor_table(None).values()
    groups = state.placement_group_table().values()
    return (
        [(a["ActorClassName"], a["State"]) for a in actors if a["State"] != "DEAD"],
        [(g["name"], g["state"]) for g in groups if g["state"] != "REMOVED"],
    )


def ray_job(ray_head: dict, data: Path, tmp_path: Path, *args: str) -> list[str]:
    """The command line of a cluster job on the module's Ray head, its run directory
    ``tmp_path/run`` and its metrics ``tmp_path/m.jsonl``."""
    return [
        sys.executable, "-m", "hogwild.cli", "cluster", "--launcher", "ray",
        "--ray-address", ray_head["address"], "--data", str(data),
        "--checkpoint-dir", str(tmp_path / "run"), "--metrics", str(tmp_path / "m.jsonl"),
        "--no-progress", *PAPER_JOB, *args,
    ]  # fmt: skip


def assert_nothing_left(ray_head: dict, run_dir: Path) -> None:
    """No live actor, no placement group (once Ray has removed them) and no process of the job."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and (_left_behind(ray_head) != ([], [])):
        time.sleep(0.5)
    actors, groups = _left_behind(ray_head)
    assert actors == [], f"Ray actors still alive: {actors}"
    assert groups == [], f"placement groups not removed: {groups}"
    assert processes_of(run_dir) == []


def _role_hosts(ray_head: dict) -> int:
    """How many ``RoleHost`` actors the module's Ray head has had, dead or alive."""
    actors = ray_head["gcs"].actor_table(None).values()
    return sum(a["ActorClassName"] == "RoleHost" for a in actors)


def test_ray_job_trains_restarts_a_killed_replica_in_its_actor_and_leaves_nothing(
    ray_head, mnist_dir, tmp_path
):
    """One job for both: every role a Ray actor, and replica 1, SIGKILLed once every role has
    started, restarted by the driver in its actor; the epochs still count every example once.
    A replica (a fresh interpreter here, not forked from a role server) forks its workers'
    forkserver from itself as it begins, titled with its job's run directory."""
    run_dir = tmp_path / "run"
    actors_before = _role_hosts(ray_head)
    command = ray_job(
        ray_head, mnist_dir, tmp_path, "--epochs", "2", "--replicas", "2", "--workers-per-replica",
        "1", "--ps", "2", "--data-servers", "1", "--train.subset=10000",
    )  # fmt: skip
    driver = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=RAY_ENV
    )
    try:
        deadline = time.monotonic() + JOB_WITHIN_S
        while not (run_dir / "cluster.json").is_file():  # every role started
            assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
            time.sleep(0.2)
        roles = json.loads((run_dir / "cluster.json").read_text())["roles"]
        (kept,) = [r for r in roles if r["name"] == "replica 0"]
        servers = []  # its workers' forkserver, forked from it as it began (not a fresh one)
        for child in psutil.Process(kept["pid"]).children():
            with contextlib.suppress(psutil.Error):  # a worker ended meanwhile
                servers.append(" ".join(child.cmdline()))
        owner = f"for pid {kept['pid']}, replica 0 of the job of {run_dir}"
        assert [s for s in servers if f"{FORKED_TITLE}, {owner}" in s], servers
        (victim,) = [r for r in roles if r["name"] == "replica 1"]
        os.kill(victim["pid"], signal.SIGKILL)
        stdout, stderr = driver.communicate(timeout=JOB_WITHIN_S)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 0, stderr[-3000:]
    final = json.loads(stdout.strip().splitlines()[-1])
    assert final["restarts"] == {"replica-1": 1}, stderr[-3000:]
    # the bound of test_cluster.py's jobs that lose a replica (0.955 to 0.976 measured there)
    assert final["test_accuracy"] >= 0.93, final
    assert final["examples"] == 2 * 10000
    assert final["replicas"] == 2 and final["ps_servers"] == 2 and final["data_servers"] == 1

    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    (start,) = [r for r in records if r["event"] == "start"]
    assert start["config"]["cluster"]["launcher"] == "ray"
    assert start["evaluate"] == "beside"  # auto: the next epoch trains while the driver tests
    epochs = [r for r in records if r["event"] == "epoch"]
    assert epochs and all(r["eval_s"] > 0 for r in epochs)
    for r in epochs:
        assert r["examples"] == 10000 == sum(r["per_replica_examples"].values()), r
    for name in ("ps-0", "ps-1", "data-0", "replica-0", "replica-1"):  # the driver's host
        assert "hogwild " in (run_dir / "logs" / f"{name}.log").read_text(), name

    assert_nothing_left(ray_head, run_dir)
    assert _role_hosts(ray_head) - actors_before == 5  # every role was a Ray actor, the restart too


def test_ray_places_a_partitioned_replica_on_one_node(ray_head, mnist_dir, tmp_path):
    """A replica of 2 partitions is one actor in one placement group of 2 CPUs (one node):
    its partitions share the arena; the job trains and leaves nothing behind."""
    run_dir = tmp_path / "run"
    command = ray_job(
        ray_head, mnist_dir, tmp_path, "--epochs", "1", "--replicas", "1", "--partitions", "2",
        "--ps", "1", "--train.subset=3000",
    )  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=JOB_WITHIN_S, env=RAY_ENV
    )
    assert done.returncode == 0, done.stderr[-3000:]
    final = json.loads(done.stdout.strip().splitlines()[-1])
    assert final["examples"] == 3000 and final["test_accuracy"] >= 0.75, final
    ready = (run_dir / "logs" / "replica-0.log").read_text()
    assert "replica 0 (2 partitions on CPUs" in ready, ready[-2000:]
    groups = ray_head["gcs"].placement_group_table().values()
    bundles = [bundle for g in groups for bundle in g["bundles"].values()]
    assert {"CPU": 2.0} in bundles, bundles  # the replica's: both partitions on one node
    assert_nothing_left(ray_head, run_dir)


def test_a_ray_address_where_nothing_listens_is_refused_at_once(mnist_dir, tmp_path):
    (port,) = free_ports(1)  # nothing listens there
    env = {**RAY_ENV, "RAY_ADDRESS": f"127.0.0.1:{port}"}  # the environment says where
    command = [
        sys.executable, "-m", "hogwild.cli", "cluster", "--launcher", "ray", "--data",
        str(mnist_dir), "--checkpoint-dir", str(tmp_path / "run"), "--no-progress",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode != 0
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - started < 60.0  # not Ray's minute of retries on top


# A driver's launcher on the module's Ray head, in a process of its own (Ray's driver state is
# per process): ``cluster.host`` beyond loopback, so a lost server is homed at its node's IP.
LAUNCHER = """
import json, sys, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from hogwild.cluster.launcher import RoleFailedError
from hogwild.cluster.roles import RoleSpec, on_port_of
from hogwild.config import load_config
from hogwild.net.auth import make_keys
from hogwild_plugins.ray.launcher import RayLauncher

address, case, run_dir, data = sys.argv[1:5]
config = load_config(overrides={
    "cluster.ray_address": address, "cluster.host": "0.0.0.0",
    "cluster.start_timeout_s": 120.0 if case == "lost-data" else 2.0,
    "cluster.stop_timeout_s": 2.0, "cluster.replicas": 1, "cluster.data_servers": 1,
})
launcher = RayLauncher(config, run_dir)
out = {}
try:
    if case == "no-node":  # its home's IP belongs to no node (TEST-NET-2, RFC 5737)
        launcher.homes["ps 0"] = "198.51.100.7"
        spec = RoleSpec("ps", 0, ("ps", "serve"), fixed_port=True)
    elif case == "dead-node":  # its home's node found alive, then gone before Ray placed it
        class Racing(RayLauncher):
            def _node_at(self, spec, ip, deadline):
                return "ab" * 28  # the id of a node the cluster no longer has
        launcher.__class__ = Racing
        launcher.homes["ps 0"] = launcher.node_ip
        spec = RoleSpec("ps", 0, ("ps", "serve"), fixed_port=True)
    elif case == "no-room":  # more CPUs than the head has: Ray holds it pending
        spec = RoleSpec("ps", 0, ("ps", "serve"), cpus=64, fixed_port=True)
    elif case == "no-room-group":  # the same for a role in a placement group of its own
        spec = RoleSpec("replica", 0, ("cluster", "replica"), cpus=64, group="replica-0")
    if case in ("no-node", "dead-node", "no-room", "no-room-group"):
        started = time.monotonic()
        try:
            launcher.start(spec)
            out["error"] = None
        except RoleFailedError as exc:
            out["error"] = str(exc)
        out["seconds"] = time.monotonic() - started
        out["groups"] = sorted(launcher.groups)
        if case == "no-room-group":  # tried again: refused for want of room again, not held
            try:
                launcher.start(spec)
            except RoleFailedError as exc:
                out["again"] = str(exc)
    elif case == "etcd-too-few":  # the job's own etcd asked of more nodes than the head
        from pathlib import Path
        from hogwild.errors import ConfigError
        from hogwild_plugins.ps.etcd_tls import JOB, EtcdTls
        try:
            launcher.start_etcd_cluster(3, JOB)
            out["error"] = None
        except ConfigError as exc:
            out["error"] = str(exc)
        out["driver_key_left"] = (Path(run_dir) / "private-keys" / "etcd-driver").exists()
        try:
            EtcdTls.load(JOB)
            out["job_tls_after"] = "loaded"
        except ConfigError as exc:
            out["job_tls_after"] = str(exc)
    else:  # "lost-data": a data server whose actor (its node, for the driver) is lost
        keys = str(make_keys(run_dir + "/keys"))  # it binds its node's IP: not loopback
        argv = ("data", "serve", data, "--bind", "0.0.0.0", "--port", "0", "--keys", keys)
        spec = RoleSpec("data", 0, argv)
        (first,) = launcher.start_all([spec])
        host = launcher.roles["data 0"].host
        ray.kill(launcher.roles["data 0"].actor, no_restart=True)
        again = launcher.restart(on_port_of(spec, first))
        out.update(first=first, again=again, host=host)
    out["roles"] = sorted(launcher.roles)
    out["homes"], out["node_ip"] = launcher.homes, launcher.node_ip
finally:
    launcher.stop_all()
print(json.dumps(out))
"""


def _launcher_case(ray_head: dict, case: str, tmp_path: Path, data: Path) -> dict:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, ray_head["address"], case, str(run_dir), str(data)],
        capture_output=True, text=True, timeout=JOB_WITHIN_S, env=RAY_ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert_nothing_left(ray_head, run_dir)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_server_whose_home_node_dies_before_placement_fails_as_a_role(
    ray_head, mnist_dir, tmp_path
):
    """A server's home node gone between the look-up and the placement: Ray finds the actor
    unschedulable; the driver is told the role failed (not a Ray error), the role forgotten,
    its actor killed, its home kept for the next attempt."""
    out = _launcher_case(ray_head, "dead-node", tmp_path, mnist_dir)
    assert out["error"] is not None and "ps 0" in out["error"], out
    assert "unschedulable" in out["error"].lower() or "cannot place" in out["error"], out
    assert out["roles"] == [] and out["homes"] == {"ps 0": out["node_ip"]}, out


def test_a_role_ray_cannot_place_in_time_is_forgotten(ray_head, mnist_dir, tmp_path):
    """A role whose actor is still pending at its start timeout fails and is forgotten, its
    actor killed: kept, a later restart would take the pending actor for a placed one."""
    out = _launcher_case(ray_head, "no-room", tmp_path, mnist_dir)
    assert out["error"] is not None and "did not place ps 0" in out["error"], out
    assert out["roles"] == [], out


def test_a_job_etcd_that_cannot_start_leaves_no_driver_key(ray_head, mnist_dir, tmp_path):
    """The job's own etcd cluster refused (more members than Ray nodes) after the driver's
    certificate was made: no controller closes it, so its start removes it, and this process
    has no job certificate left to use."""
    out = _launcher_case(ray_head, "etcd-too-few", tmp_path, mnist_dir)
    assert out["error"] is not None and "live node(s)" in out["error"], out
    assert out["driver_key_left"] is False, out
    assert out["job_tls_after"] != "loaded", out


def test_a_placement_group_ray_cannot_place_in_time_is_removed(ray_head, mnist_dir, tmp_path):
    """A replica's placement group still pending at its start timeout is removed with the role:
    kept, it would hold its CPUs once placed and refuse the next start as already held."""
    out = _launcher_case(ray_head, "no-room-group", tmp_path, mnist_dir)
    assert out["error"] is not None and "did not place replica 0" in out["error"], out
    assert out["roles"] == [] and out["groups"] == [], out
    assert "did not place replica 0" in out["again"], out


def test_a_server_homed_where_no_node_is_fails_within_its_start_timeout(
    ray_head, mnist_dir, tmp_path
):
    """A lost parameter server must come back at its node's IP: with no Ray node there, its
    start fails within ``cluster.start_timeout_s`` naming the IP, and no actor is left."""
    out = _launcher_case(ray_head, "no-node", tmp_path, mnist_dir)
    assert out["error"] is not None and "198.51.100.7" in out["error"], out
    assert out["seconds"] < 2.0 + 5.0, out  # its start timeout, not Ray's own waits
    assert out["roles"] == [] and out["homes"] == {"ps 0": "198.51.100.7"}, out


def test_a_lost_data_server_comes_back_at_its_address_on_its_home_node(
    ray_head, mnist_dir, tmp_path
):
    """A data server whose actor is lost is placed anew on its old node's IP (its home
    recorded) and serves at the address the replicas were given."""
    out = _launcher_case(ray_head, "lost-data", tmp_path, mnist_dir)
    assert out["homes"] == {"data 0": out["node_ip"]}, out  # the IP Ray names its node by
    assert out["again"] == out["first"], out
    assert out["roles"] == ["data 0"], out


def test_a_node_with_no_role_of_the_job_left_loses_its_mirror_and_every_key_left(
    tmp_path, monkeypatch
):
    """The task the job's stop runs on a node where no actor of the job is left removes the
    mirror and the job's key folders with the keys a forgotten role's killed actor left in
    them; another job's folders beside them stay."""
    from hogwild_plugins.ray.role_actor import mirror_dir, remove_mirror

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mirror = mirror_dir("/runs/job")
    other = mirror_dir("/runs/other")
    for base in (mirror, other):
        (base / "keys").mkdir(parents=True)
        for folder, left in (("own-keys", "follower-1.key_secret"), ("etcd-tls", "client.key")):
            (base.parent / f"{base.name}-{folder}").mkdir()
            (base.parent / f"{base.name}-{folder}" / left).write_text("secret")
    remove_mirror("/runs/job")
    assert sorted(p.name for p in mirror.parent.iterdir()) == sorted(
        [other.name, f"{other.name}-own-keys", f"{other.name}-etcd-tls"]
    )
