"""A Ray cluster and an etcd on :class:`~tests.hosts.harness.Hosts`, for the hosts tier and bench/.

:func:`start_ray` runs ``ray start --head`` in the first host given and ``ray start --address``
in the others, each node with its own temporary directory (hosts share the filesystem) and its
own logical CPUs, under Ray's token authentication with a token of the hosts' own (a file named
by ``RAY_AUTH_TOKEN_PATH``): the head turns token mode on by itself when it finds a token, a
joining node is told ``RAY_AUTH_MODE=token``, as Ray asks of ``ray start --address``. Neither
``ray stop`` (it stops every Ray instance on the machine) nor anything else stops them: they
are daemons of their hosts, killed when the hosts close. Each node starts lean: no log monitor
(the launcher's driver does not take its roles' output: each role writes its own log), no
usage stats, and the head no dashboard and no autoscaler monitor (nothing here autoscales; the
launcher reads the nodes and their CPUs from the GCS): daemons that cost CPU at every start
and serve nothing a job here does. Nor do the nodes, drivers and actors record metrics or task
events, which only the dashboard and the state API read (:data:`LEAN_ENV`). :func:`start_etcd`
does the same for a one-member etcd listening on a host's address, :func:`start_etcd_cluster`
for an etcd cluster with a member in each of several hosts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from hogwild_plugins.ps.etcd_process import ELECTION_MS, PRE_VOTE, heartbeat_ms

from tests.hosts.harness import Hosts, HostsError, kill_all_in, pids_in

RAY_PORT = 6379  # each host has its own ports: nothing on the machine is in the way
ETCD_PORT = 2379
STARTED_WITHIN_S = 120.0


def ray_env(hosts: Hosts) -> dict[str, str]:
    """The environment the hosts' Ray nodes and drivers run in: this one without ``RAY_*``
    settings, with :data:`LEAN_ENV`, and ``RAY_AUTH_TOKEN_PATH`` naming a token made for these
    hosts."""
    token = hosts.home(1) / "auth_token"
    if not token.exists():
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(os.urandom(16).hex())
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(LEAN_ENV, RAY_AUTH_TOKEN_PATH=str(token))
    return env


def _ray_start(hosts: Hosts, host: int, env: dict, cpus: int, *args: str) -> Callable[[], None]:
    """Start ``ray start`` in host ``host``; a function that waits for it to end (raising
    :class:`HostsError` if it failed twice), so that several nodes join at once.

    A start that failed is tried once more, after the processes it left in the host are killed
    (those that were there before it, an etcd member or a server, are left alone): ``ray
    start`` gives its raylet a fixed 30 s to register with the GCS, which a loaded 2-core
    machine (the suite's other worker beside three hosts' Ray daemons) can exceed."""
    argv = [
        sys.executable, "-m", "ray.scripts.scripts", "start", *args,
        "--node-ip-address", hosts.address(host), "--num-cpus", str(cpus),
        "--object-store-memory", str(80 * 2**20), "--disable-usage-stats",
        "--include-log-monitor=false",
    ]  # fmt: skip

    def launch(attempt: int) -> tuple[subprocess.Popen, Path]:
        temp = hosts.home(host) / ("ray" if attempt == 1 else f"ray{attempt}")
        log = hosts.home(host) / f"ray-start-{attempt}.log"
        with open(log, "w") as out:  # not a pipe: Ray's daemons inherit it and keep it open
            starter = subprocess.Popen(
                hosts.argv(host, [*argv, "--temp-dir", str(temp)]), stdout=out,
                stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        return starter, log

    def failure(starter: subprocess.Popen, log: Path) -> str | None:
        try:
            code = starter.wait(STARTED_WITHIN_S)
        except subprocess.TimeoutExpired:
            starter.kill()
            starter.wait()
            return f"not done in {STARTED_WITHIN_S:g} s: {log.read_text()[-3000:]}"
        return f"exit {code}: {log.read_text()[-3000:]}" if code else None

    before = frozenset(pids_in(hosts.namespace(host)))
    first = launch(1)

    def wait() -> None:
        said = failure(*first)
        if said is None:
            return
        kill_all_in(hosts.namespace(host), keep=before)  # the first try's, whatever they reached
        again = failure(*launch(2))
        if again is not None:
            raise HostsError(f"ray start in host {host}, twice: {said}\n... then: {again}")

    return wait


# What every test's Ray node, and every driver and actor worker started beside it, runs with:
# no metrics (no node's, worker's or actor's metrics recorded and sent to its node's dashboard
# agent, which ingests them into OpenTelemetry: the agent's busiest work here), no task events
# (the state API's task list and timeline, which nothing here reads: the tests read actors and
# placement groups from the GCS), and the agent's node report (psutil over every Ray process,
# for the dashboard none of these nodes has) once a minute, not every 5 s. Settings for tests
# that read nothing of these, not the launcher's: a user's cluster is the user's to set.
LEAN_ENV = {
    "RAY_enable_metrics_collection": "false",
    "RAY_enable_task_events": "false",
    "REPORTER_UPDATE_INTERVAL_MS": "60000",
}

# How the head's GCS checks its nodes where a test loses hosts (``start_ray(quick_loss=True)``):
# a check a second, a node dead after 3 failed in a row. A lost host's checks fail at once (gRPC
# UNAVAILABLE: no route while it is cut, nothing listening once it is back), so Ray's own (every
# 3 s, 5 in a row) find its node dead about 15 s after the loss, this about 3 s (seen: 2 s after
# the first failure), and the lost roles, reported only then, are restarted that much sooner.
# Each check still waits Ray's 10 s for an answer: a live node that answers late is taken for
# dead only after 3 such checks, 30 s and more.
QUICK_LOSS_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}


def start_ray(
    hosts: Hosts,
    nodes: list[int],
    cpus: int,
    head_cpus: int | None = None,
    quick_loss: bool = False,
) -> str:
    """A Ray cluster with a node in each of ``nodes`` (the head in the first, then the others
    joining it together), ``cpus`` logical CPUs each (the head ``head_cpus`` if given: 0 keeps
    roles off it); its GCS address. With ``quick_loss``, the head finds a lost node dead
    about 3 s after its checks begin to fail (:data:`QUICK_LOSS_ENV`), not Ray's 15 s."""
    env = {**ray_env(hosts), **(QUICK_LOSS_ENV if quick_loss else {})}
    head = nodes[0]
    _ray_start(hosts, head, env, cpus if head_cpus is None else head_cpus, "--head", "--port",
               str(RAY_PORT), "--include-dashboard=false", "--no-monitor")()  # fmt: skip
    address = f"{hosts.address(head)}:{RAY_PORT}"
    joining = [join_ray_node(hosts, host, address, cpus, wait=False) for host in nodes[1:]]
    failed = None
    for wait in joining:  # every one waited for, even after one failed
        try:
            wait()
        except HostsError as exc:
            failed = failed or exc
    if failed is not None:
        raise failed
    return address


def join_ray_node(hosts: Hosts, host: int, address: str, cpus: int, wait: bool = True):
    """A Ray node in host ``host`` joining the cluster whose GCS is ``address`` (a host lost
    and back, say): with ``wait``, once it joined (:class:`HostsError` if it failed); else a
    function that waits for that."""
    env = {**ray_env(hosts), "RAY_AUTH_MODE": "token"}
    joined = _ray_start(hosts, host, env, cpus, "--address", address)
    return joined() if wait else joined


def wait_listening(hosts: Hosts, host: int, address: str, port: int, within_s=20.0) -> None:
    """Wait until something in host ``host`` accepts TCP connections on ``address:port``."""
    code = (
        "import socket, sys, time\n"
        f"deadline = time.monotonic() + {within_s}\n"
        "while time.monotonic() < deadline:\n"
        "    try:\n"
        f"        socket.create_connection(({address!r}, {port}), timeout=1).close()\n"
        "        sys.exit(0)\n"
        "    except OSError:\n"
        "        time.sleep(0.05)\n"
        "sys.exit(1)\n"
    )
    if subprocess.run(
        hosts.argv(host, [sys.executable, "-c", code]), timeout=within_s + 30
    ).returncode:
        raise HostsError(f"nothing listens on {address}:{port} in host {host}")


def wait_etcd_healthy(hosts: Hosts, host: int, address: str, within_s=30.0) -> None:
    """Wait until the etcd member listening on ``address:ETCD_PORT`` in host ``host`` says it is
    healthy: its ``/health`` is true only once its cluster has a leader and a quorum read works."""
    url = f"http://{address}:{ETCD_PORT}/health"
    code = (
        "import json, sys, time, urllib.request\n"
        f"deadline = time.monotonic() + {within_s}\n"
        "while time.monotonic() < deadline:\n"
        "    try:\n"
        f"        with urllib.request.urlopen({url!r}, timeout=2) as r:\n"
        "            if json.load(r).get('health') == 'true':\n"
        "                sys.exit(0)\n"
        "    except (OSError, ValueError):\n"
        "        pass\n"
        "    time.sleep(0.05)\n"
        "sys.exit(1)\n"
    )
    if subprocess.run(
        hosts.argv(host, [sys.executable, "-c", code]), timeout=within_s + 30
    ).returncode:
        raise HostsError(f"the etcd member on {address}:{ETCD_PORT} in host {host} has no leader")


def start_etcd(hosts: Hosts, host: int) -> str:
    """A one-member etcd listening on host ``host``'s address; its ``HOST:PORT``."""
    client = f"http://{hosts.address(host)}:{ETCD_PORT}"
    peer = f"http://127.0.0.1:{ETCD_PORT + 1}"
    hosts.daemon(host, [
        "etcd", f"--name=h{host}", f"--data-dir={hosts.home(host) / 'etcd'}",
        f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=h{host}={peer}", "--log-level=error",
    ], hosts.home(host) / "etcd.log")  # fmt: skip
    wait_etcd_healthy(hosts, host, hosts.address(host))  # a one-member cluster elects itself
    return f"{hosts.address(host)}:{ETCD_PORT}"


def start_etcd_member(hosts: Hosts, host: int, members: list[int], state: str = "new") -> None:
    """Start the etcd member of host ``host`` in the cluster of ``members`` (its data in the
    host's home): ``state`` ``"new"`` for a cluster being made, ``"existing"`` for a member
    restarted after it was killed (it keeps its data directory and rejoins)."""
    peers = {h: f"http://{hosts.address(h)}:{ETCD_PORT + 1}" for h in members}
    initial = ",".join(f"h{h}={peer}" for h, peer in peers.items())
    client = f"http://{hosts.address(host)}:{ETCD_PORT}"
    hosts.daemon(host, [
        "etcd", f"--name=h{host}", f"--data-dir={hosts.home(host) / 'etcd'}",
        f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peers[host]}", f"--initial-advertise-peer-urls={peers[host]}",
        f"--initial-cluster={initial}", f"--initial-cluster-state={state}",
        f"--heartbeat-interval={heartbeat_ms(ELECTION_MS)}", f"--election-timeout={ELECTION_MS}",
        PRE_VOTE, "--log-level=error",
    ], hosts.home(host) / "etcd.log")  # fmt: skip


def start_etcd_cluster(hosts: Hosts, members: list[int]) -> str:
    """An etcd cluster with a member in each of ``members`` (peers over the hosts' network);
    its members' addresses, ``HOST:PORT,HOST:PORT,...``."""
    for host in members:
        start_etcd_member(hosts, host, members)
    for host in members:  # the members found each other and elected a leader
        wait_etcd_healthy(hosts, host, hosts.address(host))
    return ",".join(f"{hosts.address(h)}:{ETCD_PORT}" for h in members)


__all__ = [
    "ETCD_PORT",
    "LEAN_ENV",
    "QUICK_LOSS_ENV",
    "RAY_PORT",
    "join_ray_node",
    "ray_env",
    "start_etcd",
    "start_etcd_cluster",
    "start_etcd_member",
    "start_ray",
    "wait_etcd_healthy",
    "wait_listening",
]
