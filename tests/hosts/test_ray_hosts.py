"""``hogwild cluster --launcher ray`` across three hosts (network namespaces), as on three machines.

The module's Ray cluster: ``ray start --head`` in host 1 and ``ray start --address`` in hosts 2
and 3, each node with ``NODE_CPUS`` logical CPUs and a temporary directory of its own, under
token authentication (:mod:`tests.hosts.ray_nodes`: the head turns token mode on by itself when
it finds a token, the joining nodes are told ``RAY_AUTH_MODE=token`` as Ray asks). The driver
runs in host 1 and is *not* told ``RAY_AUTH_MODE``: it must find out that the cluster wants the
token.

The job: copies = 3 over 3 parameter servers (one per node: Ray spreads them), 2 one-worker
replicas and a data server, ``cluster.host`` host 1's address, so every role binds its node's
address under the job's CURVE keys, and the controller is the job's own etcd cluster
(``cluster.etcd = "job"``: a member on each node, TLS with certificates the job made). While it
trains, a client without keys is refused by every server, one with the job's keys answered (the
control), and a replication message sent with the job's user's key (a role of the job, not a
server) refused by every server. Once an epoch has ended, host 2's (or host 3's, if the data server
runs there: every run loses the job's only data server unless Ray put it beside the driver)
member is made the etcd leader and that host is lost (every process in it killed, its link
down): its member, its parameter server and whatever else of the job ran there. Two seconds
later it comes back as a new machine and its Ray node joins again; the lost roles are started
again (a server only at its old address, so on that node; the head finds the lost node dead
3 s after its health checks begin to fail: ``start_ray(quick_loss=True)``), the job goes on
through the two members left, and ends >= 98 % after 3 epochs of 30,000 examples (tested once,
after the last; 60,000 of them after the loss, as in 2 epochs of all 60,000).
Afterwards: each host ran a role, and no role's process, etcd member, run-directory mirror or
key folder is left in any host but the lost member's key folder (nothing sweeps a dead job's
keys yet: docs/hosts.md). (The issue's two tests, the job across hosts and a member's host
lost, are one run here: each costs a three-epoch job. A client failing over between members it
was given, the first one lost, is tested on loopback: tests/cluster/test_etcd_cluster.py and
tests/cluster/test_job_etcd.py; here the first member is on the driver's host, which is never
lost.)

``NODE_CPUS`` x 3 is exactly what the job's roles ask, so the first test also shows a job that
asks one CPU more refused at once, with what it needs and what there is. The Sandblaster and
AllReduce groups' jobs take the one-host run's steps; the AllReduce one runs under the job's own
etcd cluster, a member on each Ray node, speaking TLS with certificates the job made: from
outside the job (:mod:`tests.hosts.etcd_probe`), every member refuses a plain-HTTP request and a
TLS client without a certificate, and answers the driver's (the control) with a certificate
naming its own address; the job's CA key and every role's and member's etcd key are gone after.

A partitioned replica spread over the nodes (``cluster.partition_placement = "spread"``: its 2
partitions on 2 nodes, a ``hogwild partition-host`` follower beside its role) learns from 3,000
examples, both partitions' rows move in the servers' model, its follower SIGKILLed mid-epoch is
restarted with its replica; one spread over more nodes than there are is refused at once.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.support.paper_job import PAPER_JOB
from tests.cluster.test_cluster import hogwild_segments
from tests.cluster.test_frameworks import MLP
from tests.hosts.harness import Hosts
from tests.hosts.ray_nodes import join_ray_node, ray_env, start_ray

pytest.importorskip("ray")
from hogwild_plugins.ray.role_actor import mirror_dir  # noqa: E402

from hogwild.shm.naming import parse_segment_name  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

NODE_CPUS = 2
SPREAD_SHARD_KIB = 16  # the default model in 73 shards: partition 1 of 2 lies in 40 of them
JOB_WITHIN_S = 900.0
EPOCHS = 3
SUBSET = 30000


@pytest.fixture(scope="module")
def cluster():
    """Three hosts, a Ray cluster across them; killed with the hosts."""
    from tests.hosts.conftest import skip_without_namespaces

    skip_without_namespaces()
    with Hosts(3) as hosts:
        ray = start_ray(hosts, [1, 2, 3], NODE_CPUS, quick_loss=True)  # a host is lost
        yield {"hosts": hosts, "env": ray_env(hosts), "ray": ray}


def _job_argv(cluster, run_dir: Path, tmp_path: Path, mnist_dir: Path, *extra: str) -> list[str]:
    hosts = cluster["hosts"]
    return [
        sys.executable, "-m", "hogwild.cli", "cluster", "--launcher", "ray",
        "--ray-address", cluster["ray"], "--data", str(mnist_dir), "--epochs", str(EPOCHS),
        "--replicas", "2", "--workers-per-replica", "1", "--ps", "3", "--data-servers", "1",
        "--cluster.copies=3", "--cluster.etcd=job", f"--cluster.host={hosts.address(1)}",
        "--checkpoint-dir", str(run_dir), "--metrics", str(tmp_path / "m.jsonl"), "--no-progress",
        *PAPER_JOB, *extra,
    ]  # fmt: skip


def _records(metrics: Path) -> list[dict]:
    """The job's metrics records written so far (none before the file exists; a line still
    being written is left for the next look)."""
    try:
        text = metrics.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _roles_left(hosts: Hosts, run_dir: Path) -> list[str]:
    """Processes in any host whose command line names the job's run directory or a role."""
    left = []
    for host in (1, 2, 3):
        for pid in hosts.pids(host):
            try:
                proc = psutil.Process(pid)
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                line = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            if str(run_dir) in line or "hogwild.cli" in line:
                left.append(f"host {host}: {pid} {line[:120]}")
    return left


def _member_in(hosts: Hosts, host: int) -> tuple[str, Path]:
    """The name and work directory (data and log) of the job's etcd member running in
    ``host``."""
    for pid in hosts.pids(host):
        try:
            args = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        options = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
        if "-etcd-" in options.get("name", "") and "data-dir" in options:
            return options["name"], Path(options["data-dir"]).parent
    raise AssertionError(f"no etcd member of the job in host {host}")


SPREAD_FOUR = (  # one replica of 4 partitions, one a node: 5 CPUs of 6, but 3 nodes
    "--replicas", "1", "--partitions", "4", "--ps", "1", "--data-servers", "0",
    "--cluster.copies=1", "--cluster.etcd=", "--cluster.partition_placement=spread",
)  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--replicas", "3"), ("need 7 CPU(s)", "has 6 on 3 node(s)")),
        (SPREAD_FOUR, ("each of a replica's 4 partitions (model.partitions) on a node of its "
                       "own", "has 3 node(s) with a CPU")),
    ],
)  # fmt: skip
def test_a_job_asking_more_cpus_than_the_ray_cluster_has_is_refused_at_once(
    cluster, mnist_dir, tmp_path, extra, said
):
    """A job needing more CPUs than the cluster has, or a replica spread over more nodes than
    it has (``cluster.partition_placement = "spread"``), is refused at once, naming both."""
    hosts = cluster["hosts"]
    argv = _job_argv(cluster, tmp_path / "run", tmp_path, mnist_dir, *extra)
    env = {**cluster["env"], "RAY_ADDRESS": cluster["ray"]}
    argv.remove("--ray-address"), argv.remove(cluster["ray"])  # RAY_ADDRESS says where
    started = time.monotonic()
    done = subprocess.run(
        hosts.argv(1, argv), capture_output=True, text=True, env=env, timeout=JOB_WITHIN_S
    )
    assert done.returncode != 0
    assert all(words in done.stderr for words in said), done.stderr
    assert time.monotonic() - started < 60.0  # not cluster.start_timeout_s (300 s)
    assert _roles_left(hosts, tmp_path / "run") == [] and _etcd_left(hosts) == []


# How long the lost host stays off the network before it comes back as a new machine. Every
# process in it is dead from the first moment: its peers find it silent while it is cut, then
# refusing (nothing listens at its addresses), as a dead machine's; 2 s covers the election
# its member's loss costs (a 200 ms election timeout) and Ray's first failed health checks,
# and each second longer only delays its node's return, which the lost roles' restarts wait for.
DOWN_S = 2.0


def test_ray_across_three_hosts_trains_with_three_copies_through_a_lost_host_and_leaves_nothing(
    cluster, mnist_dir, tmp_path
):
    hosts = cluster["hosts"]
    run_dir = tmp_path / "run"
    here = str(Path(__file__).resolve().parents[2])
    said = tmp_path / "driver.log"  # a file, not a pipe nobody reads until the job ends
    with open(said, "w") as log:
        driver = hosts.run(
            1, _job_argv(cluster, run_dir, tmp_path, mnist_dir, f"--train.subset={SUBSET}",
                         "--train.evaluate_every=0"),  # tested once, after its last epoch
            stdout=subprocess.PIPE, stderr=log, text=True, env=cluster["env"],
        )  # fmt: skip
    try:
        deadline = time.monotonic() + JOB_WITHIN_S
        metrics = tmp_path / "m.jsonl"
        members = _job_etcd(run_dir, driver, deadline)
        # every role started (cluster.json), and the start record, which the driver writes after
        while not (run_dir / "cluster.json").is_file() or not _records(metrics):
            assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
            time.sleep(0.5)
        roles = json.loads((run_dir / "cluster.json").read_text())["roles"]
        (start,) = [r for r in _records(metrics) if r["event"] == "start"]
        ps, data = start["ps_servers"], start["data_servers"]
        probe = hosts.check(3, [
            sys.executable, "-m", "tests.hosts.keyless", start["config"]["ps"]["job"],
            start["config"]["ps"]["keys"], "--ps", *ps, "--data", *data,
            "--identity", str(run_dir / "private-keys" / "user.key_secret"),
        ], cwd=here)  # fmt: skip
        # the host lost: never host 1 (the driver, the Ray head and the first etcd member); the
        # data server's, where Ray put it on another, so that every run loses the job's only
        # data server (a replica's read fails: its restart waits for the server's), else host 2
        (data_host,) = [r["host"] for r in roles if r["name"] == "data 0"]
        lost_host = next((h for h in (2, 3) if hosts.address(h) == data_host), 2)
        lost_roles = {r["name"] for r in roles if r["host"] == hosts.address(lost_host)}
        lost_member = _member_in(hosts, lost_host)
        (wanted,) = [m for m in members if m.rpartition(":")[0] == hosts.address(lost_host)]
        epochs_before = 0
        while driver.poll() is None and time.monotonic() < deadline and not epochs_before:
            epochs_before = sum(r["event"] == "epoch" for r in _records(metrics))
            time.sleep(0.5)
        # the lost host's member the leader: its loss costs an election, and the clients'
        # first member (host 1's, a follower) answers without a leader until there is one
        leader = hosts.check(1, [
            sys.executable, "-m", "tests.hosts.etcd_leader",
            *(str(run_dir / "private-keys" / "etcd-driver" / f) for f in _DRIVER_TLS),
            wanted, *members,
        ], cwd=here)  # fmt: skip
        hosts.lose(lost_host)  # the machine dies: its member, its server, whatever else ran there
        assert hosts.pids(lost_host) == []
        time.sleep(DOWN_S)
        hosts.heal(lost_host)  # back as a new machine: its Ray node joins again, the driver puts
        join_ray_node(hosts, lost_host, cluster["ray"], NODE_CPUS)  # the lost roles back on it
        stdout, _ = driver.communicate(timeout=JOB_WITHIN_S)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    stderr = said.read_text()
    assert driver.returncode == 0, stderr[-3000:]
    assert json.loads(leader.strip().splitlines()[-1])["leader"] == wanted
    records = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    epochs = sum(r["event"] == "epoch" for r in records)
    assert epochs == EPOCHS and epochs - epochs_before >= 2, epochs_before  # trained on, lost
    final = json.loads(stdout.strip().splitlines()[-1])
    assert final["test_accuracy"] >= 0.98, final
    assert final["replicas"] == 2 and final["ps_servers"] == 3 and final["data_servers"] == 1
    # every role lost with the host started again; another role only if it is a replica and
    # the job's one data server was lost: its read fails, and it is restarted once the data
    # server answers again (the driver holds its restart meanwhile; docs/hosts.md, "Not done
    # yet"), once, as long as Ray finds the lost node within data.wait_s (60 s; about 3 s
    # with this module's quick health checks, 10-25 s here with Ray's defaults): past that the
    # hold ends and a start would wait again (review F, left)
    restarted = set(final["restarts"])
    told = [line for line in stderr.splitlines() if line.startswith("hogwild cluster: WARN")]
    lost = {n.replace(" ", "-") for n in lost_roles}
    assert lost <= restarted, (final["restarts"], roles)
    others = restarted - lost
    assert not others or ("data-0" in lost and all(n.startswith("replica-") for n in others)), (
        final["restarts"], roles,
    )  # fmt: skip
    assert all(final["restarts"][n] == 1 for n in others), (final["restarts"], told)
    assert start["config"]["cluster"]["etcd"].split(",") == members
    assert sorted(m.rpartition(":")[0] for m in members) == sorted(
        hosts.address(h) for h in (1, 2, 3)
    )  # a member on each node, the first on the driver's

    addresses = {hosts.address(h) for h in (1, 2, 3)}
    assert {r["host"] for r in roles} == addresses, roles  # each host ran at least one role
    assert {a.rpartition(":")[0] for a in ps} == addresses  # a server (and a copy) per host
    assert any(name.startswith("ps ") for name in lost_roles), roles  # a server was lost
    found = json.loads(probe.strip().splitlines()[-1])
    assert set(found) == {*ps, *data}
    for address, seen in found.items():  # a replication message with a non-server's key: refused
        forged = {"forged_refused": True} if address in ps else {}
        assert seen == {"keyless_refused": True, "keyed_answered": True, **forged}, address

    deadline = time.monotonic() + 30.0  # Ray kills actors asynchronously
    while time.monotonic() < deadline and (_roles_left(hosts, run_dir) or _etcd_left(hosts)):
        time.sleep(0.5)
    assert _roles_left(hosts, run_dir) == [] and _etcd_left(hosts) == []
    mirror = mirror_dir(str(run_dir.resolve()))  # hosts 2 and 3's copy of the roster
    assert not mirror.exists()
    assert not (mirror.parent / f"{mirror.name}-own-keys").exists()  # the roles' key pairs
    assert not (mirror.parent / f"{mirror.name}-etcd-tls").exists()  # the roles' etcd keys
    assert not (run_dir / "private-keys" / "etcd-driver").exists()
    # what the lost member's SIGKILLed actor could not remove, and nothing else: its key folder
    # (no sweep of a dead job's keys yet) and its work directory (the next job's etcd sweeps it)
    name, work = lost_member  # the job's members are named after its driver's pid
    left = set(mirror.parent.glob(f"hogwild-{driver.pid}-etcd-*-etcd-tls"))
    assert left == {mirror.parent / f"{name}-etcd-tls"}, left
    for folder in (*left, work):  # these hosts share a filesystem; a new machine's would not
        shutil.rmtree(folder, ignore_errors=True)


_DRIVER_TLS = ("ca.crt", "client.crt", "client.key")  # the driver's job-made etcd certificate


def _job_etcd(run_dir: Path, driver: subprocess.Popen, deadline: float) -> list[str]:
    """The job's own etcd members' client addresses, from the config the driver writes into
    ``run_dir`` once they serve (before it starts a role)."""
    while True:
        assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
        for path in run_dir.glob("*.json"):
            try:
                etcd = json.loads(path.read_text())["cluster"]["etcd"]
            except (ValueError, KeyError, TypeError, OSError):  # another file, or half written
                continue
            if etcd and etcd != "job":
                return etcd.split(",")
        time.sleep(0.2)


def _etcd_left(hosts: Hosts) -> list[str]:
    """etcd members the job started (named ``hogwild-PID-etcd-I``) still alive in hosts 1 to 3."""
    left = []
    for host in (1, 2, 3):
        for pid in hosts.pids(host):
            try:
                proc = psutil.Process(pid)
                line = " ".join(proc.cmdline())
                if proc.status() != psutil.STATUS_ZOMBIE and "-etcd-" in line and "--name=" in line:
                    left.append(f"host {host}: {pid} {line[:120]}")
            except psutil.Error:
                continue
    return left


@pytest.mark.parametrize(
    ("framework", "more", "far_more"),
    [
        ("sandblaster", (), ()),  # an epoch is one full-batch L-BFGS iteration
        # ten steps of synchronous SGD an epoch; a server per worker; across the hosts, each
        # server's buckets copied on the other, under the job's own etcd cluster
        (
            "allreduce",
            ("--train.batch=100", "--optim.lr=0.1", "--optim.schedule=constant"),
            ("--cluster.copies=2", "--cluster.etcd=job"),
        ),
    ],
)
def test_group_members_on_other_hosts_take_the_steps_of_the_one_host_run(
    cluster, mnist_dir, tmp_path, framework, more, far_more
):
    """Sandblaster L-BFGS, and AllReduce's synchronous SGD: a group of two member processes over
    two parameter servers, placed by Ray across the hosts (every node has 2 CPUs, the 5 roles
    need 5, so a member runs on another host than its coordinator), takes the same steps, epoch
    for epoch, as the same job with every role on one host (the local launcher, loopback).

    The AllReduce job across the hosts also has its servers' buckets copied (copies = 2) under
    the job's own etcd cluster (``cluster.etcd = "job"``): a member on each Ray node, every
    role told all three, none left once the job ends (copies change no step: the same sums);
    its traffic is TLS with client certificates the job made (probed from outside)."""
    hosts = cluster["hosts"]
    config = tmp_path / "mlp.toml"
    config.write_text(MLP)  # the one-host framework tests' model and subset
    common = [
        sys.executable, "-m", "hogwild.cli", "cluster", "--config", str(config),
        "--data", str(mnist_dir), f"--cluster.framework={framework}",
        "--cluster.workers_per_group=2", "--ps", "2", "--epochs", "3", "--no-progress", *more,
    ]  # fmt: skip

    def losses(run: Path) -> list[float]:
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["train_loss"] for r in records if r["event"] == "epoch"]

    # the one-host run (loopback, the machine's own network) trains while the hosts' job starts
    # and trains: two independent jobs, started together so that neither waits out the other's
    # start-up (most of either job's time on 1,000 examples)
    one, local_log = tmp_path / "one", tmp_path / "one.log"
    with open(local_log, "w") as log:  # a file, not a pipe nobody reads while the other job runs
        local = subprocess.Popen(
            [*common, "--checkpoint-dir", str(one), "--metrics", str(one / "metrics.jsonl")],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    far = tmp_path / "far"
    argv = [*common, "--launcher", "ray", "--ray-address", cluster["ray"],
            f"--cluster.host={hosts.address(1)}", "--checkpoint-dir", str(far),
            "--metrics", str(far / "metrics.jsonl"), *far_more]  # fmt: skip
    try:
        driver = hosts.run(
            1, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster["env"]
        )
        try:
            deadline = time.monotonic() + JOB_WITHIN_S
            if "--cluster.etcd=job" in far_more:  # its members up: probed from outside the job
                members = _job_etcd(far, driver, deadline)
                probe = hosts.check(1, [
                    sys.executable, "-m", "tests.hosts.etcd_probe",
                    *(str(far / "private-keys" / "etcd-driver" / f) for f in _DRIVER_TLS), *members,
                ], cwd=str(Path(__file__).resolve().parents[2]))  # fmt: skip
                found = json.loads(probe.strip().splitlines()[-1])
                assert set(found) == set(members)
                refused = {"plain_refused": True, "names_its_address": True,
                           "certless_refused": True}  # fmt: skip
                for member, seen in found.items():  # beyond loopback: TLS, certificates required
                    assert seen == {**refused, "certified_answered": True}, member
            while not (far / "cluster.json").is_file():  # every role started (removed at the end)
                assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
                time.sleep(0.2)
            roles = json.loads((far / "cluster.json").read_text())["roles"]
            _, stderr = driver.communicate(timeout=JOB_WITHIN_S)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.communicate()
        local.wait(timeout=JOB_WITHIN_S)
    finally:
        if local.poll() is None:  # SIGTERM first: the driver then stops its roles
            local.terminate()
            try:
                local.wait(timeout=30)
            except subprocess.TimeoutExpired:
                local.kill()
                local.wait()
    assert local.returncode == 0, local_log.read_text()[-3000:]
    assert driver.returncode == 0, stderr[-3000:]
    # read once the job is over: the driver writes cluster.json before its start record
    records = [json.loads(x) for x in (far / "metrics.jsonl").read_text().splitlines()]
    (start,) = [r for r in records if r["event"] == "start"]
    where = {r["name"]: r["host"] for r in roles}
    assert {"member 0", "member 1", "replica 0"} <= set(where)
    assert {where["member 0"], where["member 1"]} - {where["replica 0"]}, where  # another host
    # the same float32 terms, summed in the order the pushes came in (L-BFGS's 1e-8 apart here)
    assert losses(far) == pytest.approx(losses(one), rel=1e-4), (losses(far), losses(one))
    assert len(losses(one)) == 3 and losses(one)[-1] < losses(one)[0]
    if "--cluster.etcd=job" in far_more:
        assert start["config"]["cluster"]["etcd"].split(",") == members
        assert sorted(m.rpartition(":")[0] for m in members) == sorted(
            hosts.address(h) for h in (1, 2, 3)
        )  # a member on each node, the roles told all three
        assert start["config"]["cluster"]["etcd_tls"] == "job"  # each role its own certificate
        assert not (far / "private-keys" / "etcd-driver").exists()  # the driver's, with its job
    deadline = time.monotonic() + 30.0  # Ray kills actors asynchronously
    while time.monotonic() < deadline and (_roles_left(hosts, far) or _etcd_left(hosts)):
        time.sleep(0.5)
    assert _roles_left(hosts, far) == [] and _etcd_left(hosts) == []
    mirror = mirror_dir(str(far.resolve()))  # the roles' and the members' etcd keys, every host
    assert not (mirror.parent / f"{mirror.name}-etcd-tls").exists()
    assert not list(mirror.parent.glob(f"hogwild-{driver.pid}-etcd-*-etcd-tls"))  # its members'


def test_a_replica_spread_over_two_hosts_trains_through_a_lost_follower_and_leaves_nothing(
    cluster, mnist_dir, tmp_path
):
    """``cluster.partition_placement = "spread"``: one replica of 2 partitions on 2 of the 3
    Ray nodes (its placement group STRICT_SPREAD), partition 0 in the replica's role, partition
    1 in a ``hogwild partition-host`` follower the launcher starts on another node, blocks of
    neurons crossing as CURVE frames. Its follower SIGKILLed in the first 2 of 3 epochs takes the
    replica down; the driver restarts it (the launcher starts its follower again, and the driver
    names the follower as the cause), and the job ends well:
    every example trained, the model well above chance, partition 1's rows (which only the
    follower trains, from the activations and errors that crossed) moved in the servers' model,
    the follower's stop line on the driver's stderr saying its takes pulled only partition 1's
    shards (``ps.shard_kib`` small enough that they are not every shard), nothing left on any
    host."""
    from hogwild.partition.plan import plan_partitions
    from hogwild.training.checkpoint import load_checkpoint
    from tests.cluster.test_partitioned_cluster import MOVED, _network_of, _rows_moved

    hosts = cluster["hosts"]
    run_dir = tmp_path / "run"
    argv = [
        sys.executable, "-m", "hogwild.cli", "cluster", "--launcher", "ray",
        "--ray-address", cluster["ray"], "--data", str(mnist_dir), "--epochs", "3",
        "--replicas", "1", "--partitions", "2", "--ps", "1",
        "--cluster.partition_placement=spread", f"--cluster.host={hosts.address(1)}",
        f"--ps.shard_kib={SPREAD_SHARD_KIB}",
        "--train.subset=1000", "--train.evaluate_every=0", "--checkpoint-dir", str(run_dir),
        "--metrics", str(tmp_path / "m.jsonl"), "--no-progress", *PAPER_JOB,
    ]  # fmt: skip
    said = tmp_path / "driver.log"
    with open(said, "w") as log:
        driver = hosts.run(1, argv, stdout=subprocess.PIPE, stderr=log, text=True,
                           env=cluster["env"])  # fmt: skip
    mirror = mirror_dir(str(run_dir.resolve()))  # the far nodes' copy (these hosts share /tmp)
    try:
        deadline = time.monotonic() + JOB_WITHIN_S
        ready = ""
        while not ready:  # the leader serves: its follower has the job and its model
            assert driver.poll() is None and time.monotonic() < deadline, said.read_text()
            ready = _ready_line(run_dir, mirror)
            time.sleep(0.2)
        follower = _spread_follower(hosts)
        assert follower is not None, ready
        while not (run_dir / "cluster.json").is_file():  # the driver's roles, once all started
            assert driver.poll() is None and time.monotonic() < deadline, said.read_text()
            time.sleep(0.2)
        roles = json.loads((run_dir / "cluster.json").read_text())["roles"]
        metrics, ended = tmp_path / "m.jsonl", []
        while not ended:  # mid-job: killed once the driver has recorded the first epoch's end
            # (its metrics file read every 50 ms: a `cluster status` process per look took a
            # second or two, in which a quiet machine trained two epochs of 1,000 examples)
            assert driver.poll() is None and time.monotonic() < deadline, said.read_text()
            text = metrics.read_text() if metrics.is_file() else ""
            whole = text[: text.rfind("\n") + 1]  # a last line still being written is left
            records = [json.loads(line) for line in whole.splitlines()]
            ended = [r for r in records if r.get("event") == "epoch"]
            time.sleep(0.05)
        epoch, trained = ended[0]["epoch"], ended[0]["examples"]
        assert epoch < 2, (epoch, trained)  # in the first 2 of 3 epochs: a whole one still ahead
        try:
            psutil.Process(follower[1]).kill()
        except psutil.NoSuchProcess:
            pytest.fail(f"the follower exited before it was killed (epoch {epoch}, {trained} "
                        f"examples trained): {said.read_text()[-2000:]}")  # fmt: skip
        stdout, _ = driver.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    stderr = said.read_text()
    assert driver.returncode == 0, stderr[-3000:]
    final = json.loads(stdout.strip().splitlines()[-1])
    assert final["examples"] == 3000 and final["test_accuracy"] >= 0.6, final
    assert final["restarts"] == {"replica-0": 1}, (final["restarts"], stderr[-2000:])
    assert "by its launcher, as follower 1" in stderr, stderr[-2000:]  # the failing part named
    leader = ready.rpartition(" on ")[2].rpartition(":")[0]
    (far,) = re.findall(r", 1 at ([0-9.]+):[0-9]+", ready)
    assert far != leader and {leader, far} <= {hosts.address(h) for h in (1, 2, 3)}, ready
    assert hosts.address(follower[0]) == far, (follower, ready)
    spread = {r["name"]: r for r in roles if r["name"] in ("replica 0", "follower 1")}
    assert spread["replica 0"]["host"] == leader and spread["follower 1"]["host"] == far, roles
    assert spread["follower 1"]["replica"] == "replica 0", roles
    moved = _rows_moved(run_dir, 2)
    assert min(moved[1]) >= MOVED and min(moved[0]) >= MOVED, moved
    # the follower's stop line, relayed by the launcher to the driver's stderr (its log went
    # with its node's mirror): its takes pulled only the shards partition 1's rows lie in
    network, _ = _network_of(load_checkpoint(run_dir))
    per_take = _shard_bytes(network, plan_partitions(network, 2).param_rows(1))
    assert per_take < 0.6 * 4 * network.n_params, per_take  # 40 of 73 shards: a real saving
    relayed = re.findall(
        r"follower 1 on ([0-9.]+): hogwild partition-host \S+: took the servers' model (\d+) "
        r"time\(s\), ([0-9,]+) bytes of values in all: the shards of the rows of partitions 1 "
        r"\(the whole model is ([0-9,]+) bytes\)",
        stderr,
    )
    assert len(relayed) == 1, stderr[-3000:]  # the restarted follower's (the killed one's: none)
    (said_host, takes, pulled, whole) = relayed[0]
    assert said_host == far and int(takes) >= 1, relayed
    assert int(pulled.replace(",", "")) == int(takes) * per_take, (relayed, per_take)
    assert int(whole.replace(",", "")) == 4 * network.n_params, relayed

    deadline = time.monotonic() + 30.0  # Ray kills actors asynchronously
    while time.monotonic() < deadline and _roles_left(hosts, run_dir):
        time.sleep(0.5)
    assert _roles_left(hosts, run_dir) == []
    assert not mirror.exists()
    assert not (mirror.parent / f"{mirror.name}-own-keys").exists()
    owners = {n: parse_segment_name(n) for n in hogwild_segments()}
    left = [n for n, owner in owners.items() if owner is not None and owner.pid == follower[1]]
    assert left == [], left  # the killed follower's arena: swept by its role's actor


def _shard_bytes(network, rows) -> int:
    """Bytes of values in the shards (of :data:`SPREAD_SHARD_KIB`) that ``rows`` lie in."""
    floats = SPREAD_SHARD_KIB * 1024 // 4
    shards = {s for lo, hi in rows for s in range(lo // floats, (hi - 1) // floats + 1)}
    return 4 * sum(min(network.n_params, (s + 1) * floats) - s * floats for s in shards)


def _ready_line(run_dir: Path, mirror: Path) -> str:
    """The replica's ready line, from its log on the driver's node or on a far one."""
    for logs in (run_dir / "logs", mirror / "logs"):
        try:
            text = (logs / "replica-0.log").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("hogwild replica: serving") and line.endswith(tuple("0123456789")):
                return line
    return ""


def _spread_follower(hosts: Hosts) -> tuple[int, int] | None:
    """The host and pid of the job's ``hogwild partition-host`` (the follower), if running."""
    for host in (1, 2, 3):
        for pid in hosts.pids(host):
            try:
                line = " ".join(psutil.Process(pid).cmdline())
            except psutil.Error:
                continue
            if " partition-host --bind" in line:
                return host, pid
    return None
