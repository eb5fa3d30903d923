"""Partitions, stalls, lost hosts and etcd faults under replicated parameter servers on real hosts.

Four network-namespace hosts (:class:`tests.hosts.harness.Hosts`): hosts 1 to 3 each run one
member of a three-member etcd cluster and one ``hogwild ps serve --copies 3`` of the *ledger*
job (the bundled model's layout, bound to the host's address under CURVE keys); host 4 runs the
ledger client (:mod:`bench.support.ledger_client`), which pushes non-negative integer deltas
and sums every acknowledged one, and the driver of the *training* job: ``hogwild cluster``,
copies = 3, its controller the same etcd cluster (the job of ``bench/figures/chaos_cluster.py``:
Adam's MNIST model on the paper's schedule, 12 epochs). A ledger client cannot push into a
training job without changing it, which is why they are two jobs. The hosts and what runs on them
are :class:`bench.support.hosts_cluster.HostsCluster`; this script injects the faults and keeps
the record.

Where the training job's roles run (``--launcher``):

- ``ray`` (the default): a Ray cluster whose head, without CPUs, is in host 4 beside the driver
  (no role is placed there, and no fault touches the head) and whose nodes, of ``RAY_CPUS``
  logical CPUs each, are hosts 1 to 3; the job runs with ``--launcher ray``, its
  ``cluster.host`` host 4's address, so each role binds its node's address under the job's
  CURVE keys and its servers are spread one per node. The per-host faults below then reach the
  training job's servers and replicas as well as the ledger's. A lost host comes back with a
  Ray node started again in it, where the driver places the lost server again (a server comes
  back only at its old address: see the Ray launcher);
- ``local`` (``--quick``'s default): every role in host 4; the faults reach the training job
  through its controller (etcd members cut off, lost, killed) and through role kills only.
  Ray's start-up across hosts is what a smoke run saves.

The training job runs twice: fault-free first (``fault_free_test_accuracy``; not with
``--quick`` or ``--no-fault-free``), then under the faults. This process, outside the hosts'
network, injects a seeded schedule of faults, one at a time, each once every ledger bucket has a
primary and another in-sync copy and a push was acknowledged since the last fault (read from
the map the client publishes):

- ``cut_primary``: the host of a random bucket's primary is taken off the network (its switch
  port down: both sides stay alive) for ``--cut-s`` seconds, then put back;
- ``stall_copy``: a ledger server that is an in-sync copy (not primary) of some bucket is
  stopped (SIGSTOP) for ``--stall-s`` seconds, then continued, and with it the training job's
  servers in the same host (their process groups; with ``ray``);
- ``lose_host``: a whole host is lost (every process in it SIGKILLed, its link down); after
  ``--down-s`` it comes back as a new machine: its etcd member rejoins from its data directory,
  its ledger server starts empty, its Ray node (with ``ray``) joins again. Three hosts survive
  one lost (etcd keeps a quorum of two, every bucket a copy);
- ``kill_etcd``: an etcd member is SIGKILLed and restarted after ``--down-s``;
- ``kill_role``: a ledger server (restarted at once; its lease lapses) or a role of the training
  job (its driver restarts it), SIGKILLed.

At the end the client stops, waits for three in-sync copies, pulls and compares:
``acknowledged_lost`` and ``applied_twice`` count parameters (see the client's docstring).
``failover_s``: for each ``cut_primary``, seconds from the cut to the first acknowledgement of a
push sent after it (a push touches every bucket, so the cut primary's buckets were served by
then: taken over, or, if the cut ended first, served by it again; compare with ``--cut-s``).
``unavailable_s``: per kind, the longest time without an acknowledgement that overlaps the
fault's window (from its start to its end plus ``SETTLE_S``, or to the next fault's start),
counted up to the next fault's start at most (the rest of such a gap is the next fault's, whose
own gap runs from the last acknowledgement before it), median and max. ``failover_stages`` takes
each cut apart (:func:`breakdown`: by when the cut server's lease was gone from etcd, the takeover
won, served, first acknowledged; the cuts of the host whose etcd member led apart from the
others, and those whose leader was not known), from the map history and the servers' takeovers
the ledger client keeps. ``leaked``: namespaces of this run left, processes of the run alive
after the hosts closed and of each training job after it ended (each role process seen while it
ran too: under Ray they are not the driver's children), ``/dev/shm`` segments of those processes.
``stuck``: for each wait for a ready map that ended without one (the run then stops injecting),
what it last saw and the tails of the client's, servers' and etcd members' logs
(:meth:`bench.support.hosts_cluster.HostsCluster.stuck_report`); its gist is in ``problems``.

Run: ``python bench/figures/partitions.py --out bench/results/partitions.json`` (``--quick``: one
fault of each kind with short pauses and a one-epoch job on 3,000 examples, no fault-free run, a
smoke run; ``--no-train``: the ledger job alone; ``--faults-within-s S``: no fault started after
S seconds, for a run that must end by a time; ``--kinds cut_primary --no-train --faults 10``:
primary cuts alone, the failover taken apart, in about four minutes; ``--lease-s``: the ledger
servers' lease, ``ps serve``'s 2 s by default, recorded in ``settings`` and ``targets``). One
JSON line; progress goes to stderr.

The 100 faults with the fault-free control, estimated (not measured: the one run with training
failed) at under 25 minutes of a quiet 2-core machine (the estimate, and why each option, in
docs/benchmarks.md): ``python bench/figures/partitions.py
--launcher local --lease-s 1 --cut-s 5 --gap-s 1 --down-s 2 --stuck-s 300 --faults-within-s 1140
--out bench/results/partitions.json``. Both training jobs are the same command (12 epochs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

import psutil

from bench.support.cluster_run import ClusterRun
from bench.support.failover_stages import breakdown, first_fresh_ack, longest_gap
from bench.support.hosts_cluster import (
    CLIENT_HOST,
    LEASE_S,
    RAY_CPUS,
    READY_WITHIN_S,
    SERVER_HOSTS,
    STALL_S,
    HostsCluster,
    log_tail,
    stuck_brief,
)
from bench.support.leaks import LeakCheck
from bench.support.machine import describe_machine, versions
from bench.support.paper_job import PAPER_JOB, REPLICATED_JOB_ARGS
from bench.support.paths import SHARED_MNIST
from bench.support.ps_watch import spread
from bench.support.record import emit_record, stamp
from hogwild.signals import deferred_signals, terminate_as_interrupt
from tests.hosts import harness
from tests.hosts.harness import Hosts, HostsError
from tests.hosts.ray_nodes import LEAN_ENV, join_ray_node, ray_env

KINDS = ["cut_primary", "stall_copy", "lose_host", "kill_etcd", "kill_role"]
SETTLE_S = 3.0
ROLE_EXIT_S = 10.0  # a training role process still there this long after its driver ended: left
TARGETS = {"acknowledged_lost": 0, "applied_twice": 0, "faults": 100, "failover_max_s": 3.0,
           "accuracy_points": 0.3}  # fmt: skip
STARTED = time.monotonic()  # the progress lines' clock


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/figures/partitions.py", description=__doc__)
    add = parser.add_argument
    add("--faults", type=int, default=None, help="how many faults (default 100; --quick 5)")
    add("--cut-s", type=float, default=None, help="seconds a primary's host is cut off (10)")
    add("--stall-s", type=float, default=0.7, help="seconds a copy is stopped (0.7)")
    add("--down-s", type=float, default=None, help="seconds a lost host/etcd member is down (3)")
    add("--gap-s", type=float, default=None, help="mean seconds between faults (2)")
    add("--epochs", type=int, default=None, help="the training job's epochs (12; --quick 1)")
    add("--push-every-s", type=float, default=None,
        help="the ledger client starts a push at most this often (0: back to back; --quick "
        "0.1)")  # fmt: skip
    add("--no-train", action="store_true", help="the ledger client alone, no training job")
    add(
        "--kinds",
        default=",".join(KINDS),
        type=_kinds,
        metavar="K,K,...",
        help=f"the kinds of fault to inject, in turn (default all: {','.join(KINDS)})",
    )
    add("--launcher", choices=["ray", "local"], default=None,
        help="the training job's roles: on hosts 1-3 through a Ray cluster (ray, the default), "
        "or all in host 4 (local; --quick's default)")  # fmt: skip
    add("--no-fault-free", action="store_true", help="no fault-free run (--quick has none)")
    add("--data", metavar="DIR", help="MNIST files (default $HOGWILD_TEST_DATA, $HOGWILD_DATA)")
    add("--faults-within-s", type=float, default=None, metavar="S",
        help="start no fault after S seconds of the run (then end as usual; the record says "
        "how many faults fitted)")  # fmt: skip
    add("--stuck-s", type=float, default=STALL_S, metavar="S",
        help=f"no ready map for S seconds (or twice the servers' start) ends the faults as "
        f"stuck ({STALL_S:g}; more on a loaded machine, where leases lapse)")  # fmt: skip
    add("--lease-s", type=int, default=LEASE_S,
        help=f"the ledger servers' etcd lease, whole seconds ({LEASE_S}: ps serve's default; "
        "this etcd cluster's 200 ms election timeout honours 1)")  # fmt: skip
    add("--seed", type=int, default=0)
    add("--quick", action="store_true", help="one fault of each kind: a smoke test")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    # quick: the ledger client pushes (a whole model, to three copies under CURVE) at most
    # every 0.1 s, the resolution of the map it publishes: still several pushes inside the
    # shortest fault (a 0.7 s stall) and in its gaps, and half as many as at 0.05 s (the
    # quick test's CPU median went from 56 to 46 s)
    quick = {"faults": 5, "cut_s": 3.0, "down_s": 1.0, "gap_s": 0.5, "epochs": 1,
             "push_every_s": 0.1}  # fmt: skip
    full = {"faults": 100, "cut_s": 10.0, "down_s": 3.0, "gap_s": 2.0, "epochs": 12,
            "push_every_s": 0.0}  # fmt: skip
    defaults = quick if args.quick else full
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.subset = 3000 if args.quick else 0
    args.launcher = args.launcher or ("local" if args.quick else "ray")
    args.fault_free = not (args.quick or args.no_fault_free)
    args.bound_s = 300.0 if args.quick else 3600.0
    env = os.environ
    args.data = (
        args.data or env.get("HOGWILD_TEST_DATA") or env.get("HOGWILD_DATA") or str(SHARED_MNIST)
    )
    return args


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if not kinds or unknown:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected kinds of fault, comma-separated, from {','.join(KINDS)}"
        )
    return kinds


def job_args(args, etcd: str, ray: str = "RAY", host: str = "HOST") -> list[str]:
    """``hogwild cluster``'s arguments for the training job (its controller: the etcd cluster;
    with the Ray launcher, its roles on the Ray cluster ``ray``, bound to their nodes'
    addresses, the driver on ``host``)."""
    out = ["cluster", "--data", args.data, *REPLICATED_JOB_ARGS, *PAPER_JOB, "--cluster.copies=3",
           f"--cluster.etcd={etcd}", "--epochs", str(args.epochs), "--no-progress"]  # fmt: skip
    if args.launcher == "ray":
        out += ["--launcher", "ray", "--ray-address", ray, f"--cluster.host={host}"]
    if args.subset:
        out.append(f"--train.subset={args.subset}")
    return out


def launch(cluster: HostsCluster, name: str, args) -> ClusterRun:
    """Start the training job's driver in the client's host (not waiting for it)."""
    hosts, folder = cluster.hosts, cluster.folder
    argv = job_args(args, cluster.etcd, cluster.ray_address, hosts.address(CLIENT_HOST))
    _log(f"{name}: hogwild {' '.join(argv)}")
    token = ray_env(hosts)["RAY_AUTH_TOKEN_PATH"] if cluster.ray_address else None
    env = ["env", f"RAY_AUTH_TOKEN_PATH={token}"] if token else []  # the Ray cluster's token
    return ClusterRun(argv, folder, name, prefix=hosts.argv(CLIENT_HOST, env))


def wait_started(run: ClusterRun) -> ClusterRun:
    """``run`` once it wrote its start record (or ended: a quick job may be over before it is
    looked at)."""
    deadline = time.monotonic() + READY_WITHIN_S * 3
    while run.running() and not any(r.get("event") == "start" for r in run.records()):
        if time.monotonic() > deadline:
            run.job.stop()
            raise RuntimeError(f"{run.job.describe()} did not start: {run.job.err_tail()}")
        time.sleep(0.1)
    return run


def finish(cluster: HostsCluster, run: ClusterRun, args) -> dict:
    """Wait for the job; its accuracy, failure and what it left behind (before the hosts close:
    the job's own clean-up; its roles under Ray are not the driver's children, so each role
    process seen while it ran is looked for too)."""
    summary, error, leaked = run.finish(args.bound_s)
    summary = summary or {}
    cluster.note_job_roles(run)
    roles = [p for p in cluster.job_processes.pop(run.job_name, {}).values() if _alive(p)]
    psutil.wait_procs(roles, timeout=ROLE_EXIT_S)  # (the driver reaped them before it ended)
    alive = [p for p in roles if _alive(p)]
    leaked["processes"] += len(alive)
    leaked["detail"]["processes"] += [f"role process {p.pid} alive" for p in alive]
    _log(f"{run.dir.name}: test accuracy {summary.get('test_accuracy')}"
         + (f"; FAILED: {error}" if error else ""))  # fmt: skip
    return {
        "test_accuracy": summary.get("test_accuracy"),
        "epochs": summary.get("epochs"),
        "restarts": summary.get("restarts"),
        "wall_s": summary.get("wall_s"),
        "error": error,
        "leaked": leaked,
        "named_while_running": leaked["named_while_running"],  # the leak count's names exist
    }


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _log(text: str) -> None:
    elapsed = time.monotonic() - STARTED
    print(f"partitions: {elapsed:7.1f} s: {text}", file=sys.stderr, flush=True)


def schedule(rng: random.Random, n: int, quick: bool, kinds_asked: list[str]) -> list[str]:
    """The kinds of the ``n`` faults: every kind asked once in each block, shuffled."""
    kinds: list[str] = []
    while len(kinds) < n:
        block = list(kinds_asked)
        if not quick:
            rng.shuffle(block)
        kinds += block
    return kinds[:n]


def inject(cluster: HostsCluster, kind: str, rng: random.Random, args, seen: dict) -> dict:
    """One fault of ``kind``, undone before it returns; what was done, and when."""
    hosts, buckets = cluster.hosts, seen["buckets"]
    at = time.time()
    if kind == "cut_primary":
        bucket = rng.choice(sorted(buckets))
        host = buckets[bucket]["primary"] + 1
        held = sorted(b for b, v in buckets.items() if v["primary"] == host - 1)
        epochs = {b: buckets[b]["epoch"] for b in held}
        in_sync = {b: buckets[b]["in_sync"] for b in held}  # 2 of 3: a copy still catching up
        leader = seen.get("etcd_leader")
        there = [name for name, _ in cluster.job_roles(host)]
        hosts.cut(host)
        at = time.time()  # once cut: a push sent while `ip` ran is no failover
        time.sleep(args.cut_s)
        hosts.heal(host)
        return {"kind": kind, "host": host, "primary_of": held, "epochs": epochs,
                "in_sync": in_sync,
                "etcd_leader_host": None if leader is None else SERVER_HOSTS[leader],
                "training_roles": there, "at": at, "until": time.time()}  # fmt: skip
    if kind == "stall_copy":  # the ledger's copy, and the training job's servers beside it
        copies = sorted({s for v in buckets.values() for s in v["in_sync"][1:]})
        host = rng.choice(copies) + 1
        process = cluster.servers[host]
        stalled = [(n, pid) for n, pid in cluster.job_roles(host) if n.startswith("ps ")]
        at = time.time()
        cluster.stalled += [(process.pid, False), *((pid, True) for _, pid in stalled)]
        os.kill(process.pid, signal.SIGSTOP)
        for _, pid in stalled:
            cluster.stop_group(pid, signal.SIGSTOP)
        time.sleep(args.stall_s)
        cluster.continue_stalled()
        return {"kind": kind, "host": host, "training_roles": [n for n, _ in stalled],
                "at": at, "until": time.time()}  # fmt: skip
    host = rng.choice(SERVER_HOSTS)
    if kind == "lose_host":
        there = [name for name, _ in cluster.job_roles(host)]
        at = time.time()
        hosts.lose(host)
        time.sleep(args.down_s)
        hosts.heal(host)
        cluster.restart_etcd(host)
        cluster.start_server(host)
        if cluster.ray_address:  # the machine back: its Ray node joins again
            join_ray_node(hosts, host, cluster.ray_address, RAY_CPUS)
        return {"kind": kind, "host": host, "training_roles": there, "at": at,
                "until": time.time()}  # fmt: skip
    elif kind == "kill_etcd":
        pid = cluster.etcd_pid(host)
        at = time.time()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        time.sleep(args.down_s)
        cluster.restart_etcd(host)
    elif kind == "kill_role":  # a ledger server, or a role of the training job (its driver
        # restarts it)
        victims = [(f"ledger ps {h - 1}", h, None) for h in SERVER_HOSTS]
        roles = cluster.job_roles()
        where = {r["name"]: cluster.host_of(r) for r in cluster.job.roles_file().get("roles", [])
                 } if roles else {}  # fmt: skip
        victims += [(name, where.get(name, CLIENT_HOST), pid) for name, pid in roles]
        role, host, pid = rng.choice(victims)
        at = time.time()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it died by itself just now
            return {"kind": kind, "host": host, "role": role, "at": at, "until": time.time()}
        cluster.servers[host].kill()
        cluster.servers[host].wait(10)
        cluster.start_server(host)
        return {"kind": kind, "host": host, "role": role, "at": at, "until": time.time()}
    else:
        raise ValueError(f"fault kind {kind!r}: expected one of {KINDS}")
    return {"kind": kind, "host": host, "at": at, "until": time.time()}


def measure(args) -> dict:
    rng = random.Random(args.seed)
    check = LeakCheck()
    started = time.monotonic()
    kinds = schedule(rng, args.faults, args.quick, args.kinds)
    events: list[dict] = []
    problems: list[str] = []
    stuck: list[dict] = []  # why each wait for a ready map ended without one
    result: dict = {}
    fault_free: dict = {}
    faulty: dict = {}

    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
        folder = Path(tmp)
        hosts = Hosts(CLIENT_HOST)
        tag = hosts.tag
        cluster = None
        free_run = None  # the fault-free job, stopped by the finally from its launch on
        try:
            cluster = HostsCluster(hosts, folder, "" if args.no_train else args.launcher)
            cluster.stall_s = args.stuck_s
            cluster.lease_s = args.lease_s
            _log(
                f"etcd cluster {cluster.etcd}"
                + (f", Ray {cluster.ray_address}" if cluster.ray_address else "")
            )
            if not args.no_train and args.fault_free:
                free_run = launch(cluster, "fault_free", args)
                fault_free = finish(cluster, wait_started(free_run), args)
            cluster.start_ledger(args.seed, args.push_every_s)
            _log(f"ledger servers {cluster.addresses}, etcd {cluster.etcd}")
            if not args.no_train:  # after the ledger's servers: started beside them, its roles
                # took the cores the servers needed to listen within READY_WITHIN_S
                cluster.job = launch(cluster, "faults", args)  # the finally stops it from here
                wait_started(cluster.job)
                _log("the training job started")
            since = 0.0
            for kind in kinds:
                if args.faults_within_s and time.monotonic() - started > args.faults_within_s:
                    problems.append(
                        f"--faults-within-s {args.faults_within_s:g}: stopped after "
                        f"{len(events)} of {len(kinds)} faults"
                    )
                    break
                waited_from = since
                seen = cluster.wait_ready(waited_from)
                if seen is not None:
                    time.sleep(args.gap_s * rng.uniform(0.5, 1.5))
                    waited_from = time.time()  # the map now, not before the pause
                    seen = cluster.wait_ready(waited_from)
                if seen is None:
                    stuck.append(cluster.stuck_report(waited_from) | {"before_fault": kind})
                    problems.append(
                        f"stuck before fault {len(events) + 1} ({kind}): no map with a primary "
                        "and a copy per bucket and updates flowing in "
                        f"{cluster.ready_within_s():.0f} s ({stuck_brief(stuck[-1])})"
                    )
                    break
                cluster.job_roles()  # its role processes, kept to be counted at its end
                try:
                    event = inject(cluster, kind, rng, args, seen)
                except (HostsError, OSError, subprocess.SubprocessError) as exc:
                    problems.append(f"fault {len(events) + 1} ({kind}) could not be undone: {exc}")
                    break  # the figures so far are kept
                event["pushes_before"] = seen.get("pushes")
                event["map_age_s"] = round(event["at"] - seen["at"], 3)
                event["load_1min"] = os.getloadavg()[0]  # the machine's load: others run too
                events.append(event)
                _log(f"{kind} on host {event['host']} ({len(events)}/{len(kinds)})")
                since = time.time()
            if cluster.job is not None:
                faulty = finish(cluster, cluster.job, args)
            _log("faults done; waiting for three in-sync copies")
            if cluster.wait_ready(since, least=3) is None:
                stuck.append(cluster.stuck_report(since, least=3) | {"before_fault": None})
                problems.append(
                    "the copies did not come back to three after the last fault "
                    f"({stuck_brief(stuck[-1])})"
                )
            _log("stopping the ledger client")
            (cluster.client_dir / "stop").touch()
            try:
                cluster.client.wait(cluster.ready_within_s() + 60)
            except subprocess.TimeoutExpired:
                problems.append("the ledger client did not finish")
            try:
                result = json.loads((cluster.client_dir / "result.json").read_text())
            except (FileNotFoundError, json.JSONDecodeError) as exc:
                log = log_tail(folder / "client.log", 2000)
                problems.append(f"no ledger result ({exc!r}); client log: {log}")
            if result.get("partial"):
                log = log_tail(folder / "client.log", 2000)
                problems.append(
                    "the ledger client's result is partial (its acknowledgements, no final "
                    f"comparison: lost and applied twice are not known); client log: {log}"
                )
        finally:
            with deferred_signals():  # a second SIGTERM or Ctrl-C must not cut the clean-up
                processes = list(cluster.seen.values()) if cluster else []
                try:
                    if cluster is not None:
                        cluster.continue_stalled()  # stopped servers cannot take a SIGTERM
                    for run in (free_run, cluster.job if cluster else None):
                        if run is not None:
                            run.job.stop()
                finally:
                    hosts.close()
        leaked = check.count(processes, set())
        leaked["namespaces"] = sum(n.startswith(tag) for n in harness.namespaces())
    acks = result.get("acks", [])
    takeovers = result.get("takeovers")  # None: a partial result (the servers were not read)
    for e, following in zip(events, [*events[1:], None][: len(events)], strict=True):
        end = e["until"] + SETTLE_S
        next_fault = None if following is None else following["at"]
        if next_fault is not None:  # a gap the next fault opened is that fault's
            end = min(end, next_fault)
        e["unavailable_s"] = longest_gap(acks, e["at"], end, next_fault)
        if e["kind"] == "cut_primary":
            e["failover_s"] = first_fresh_ack(acks, e["at"])
            e["stages"] = breakdown(e, end, result.get("history", []), takeovers)
    cuts = [e for e in events if e["kind"] == "cut_primary"]
    stages = {
        stage: spread([e["stages"][stage] for e in cuts])
        for stage in ("lease_gone_by_s", "recorded_s", "serving_s", "first_ack_s")
    }
    stages["lease_read_late"] = sum(e["stages"]["lease_read_late"] is True for e in cuts)
    for leader_cut, name in ((True, "cut"), (False, "kept"), (None, "unknown")):
        which = [e for e in cuts if e["stages"]["etcd_leader_cut"] is leader_cut]
        stages[f"failover_s_etcd_leader_{name}"] = spread([e["failover_s"] for e in which])
    counts = {k: sum(e["kind"] == k for e in events) for k in KINDS}
    failover = spread([e.get("failover_s") for e in events if e["kind"] == "cut_primary"])
    lost, twice = result.get("acknowledged_lost"), result.get("applied_twice")
    problems += result.get("problems", [])
    for run in (fault_free, faulty):  # what the training jobs left, counted before the close
        for k in ("segments", "processes"):
            leaked[k] += run.get("leaked", {}).get(k, 0)
    leak_total = sum(leaked[k] for k in ("segments", "processes", "namespaces"))
    accuracies = (faulty.get("test_accuracy"), fault_free.get("test_accuracy"))
    gap = None if None in accuracies else abs(accuracies[0] - accuracies[1]) * 100
    return {
        "benchmark": "partitions",
        "faults": counts | {"total": len(events)},
        "acknowledged_lost": lost,
        "applied_twice": twice,
        "failover_s": failover,
        "failover_stages": stages,
        "unavailable_s": {
            k: spread([e["unavailable_s"] for e in events if e["kind"] == k]) for k in KINDS
        },
        "test_accuracy": accuracies[0],
        "fault_free_test_accuracy": accuracies[1],
        "accuracy_gap_points": None if gap is None else round(gap, 3),
        "training": {
            "faults": {k: v for k, v in faulty.items() if k != "leaked"},
            "fault_free": {k: v for k, v in fault_free.items() if k != "leaked"},
            "command": None if args.no_train else "hogwild " + " ".join(job_args(args, "ETCD")),
            "launcher": None if args.no_train else args.launcher,
            # the Ray nodes' settings beyond Ray's defaults, where Ray launched the roles
            "ray_settings": LEAN_ENV if not args.no_train and args.launcher == "ray" else None,
        },  # fmt: skip
        "leaked": {k: leaked[k] for k in ("namespaces", "processes", "segments")}
        | {"detail": leaked["detail"]},
        "pushes": result.get("pushes"),
        # every kind's, and the hand-backs'; None where the ledger client's result is partial
        "takeovers": None if takeovers is None else len(takeovers),
        "unknown_pushes": result.get("unknown_pushes"),
        "applied_twice_by_shard": result.get("applied_twice_by_shard"),
        "servers_copy_side": result.get("servers_copy_side"),
        "push_errors": result.get("errors", []),
        "problems": problems,
        "stuck": stuck,
        "targets": {
            **TARGETS,
            "lease_s": args.lease_s,  # the ledger servers': the failover figure depends on it
            "lost_met": lost == 0,
            "applied_twice_met": twice == 0,
            "faults_met": len(events) >= TARGETS["faults"],
            "failover_met": failover["max"] is not None
            and failover["max"] <= TARGETS["failover_max_s"]
            and not failover["unfinished"],
            "accuracy_met": None if gap is None else gap <= TARGETS["accuracy_points"],
            "leaks_met": leak_total == 0,
        },
        "events": events,
        "settings": {
            "seed": args.seed,
            "quick": args.quick,
            "kinds": args.kinds,
            "cut_s": args.cut_s,
            "stall_s": args.stall_s,
            "down_s": args.down_s,
            "gap_s": args.gap_s,
            "push_every_s": args.push_every_s,
            "faults_within_s": args.faults_within_s,
            "stuck_s": args.stuck_s,
            "lease_s": args.lease_s,
            "epochs": args.epochs,
            "subset": args.subset,
            "train": not args.no_train,
            "hosts": "ledger servers and etcd members on hosts 1-3; the ledger client on host 4; "
            + (
                "the training job's driver and a Ray head without CPUs on host 4, its roles on "
                f"Ray nodes of {RAY_CPUS} CPUs on hosts 1-3"
                if args.launcher == "ray"
                else "the training job (local launcher) on host 4"
            )
            + " (its controller the etcd cluster)",
        },
        "wall_s": round(time.monotonic() - started, 1),
        "load_1min": spread([e["load_1min"] for e in events]),  # read as each fault was undone
        "machine": describe_machine(),
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    why = harness.unavailable()
    if why is not None:
        print(f"python bench/figures/partitions.py: error: no namespace hosts: {why}",
              file=sys.stderr)  # fmt: skip
        return 2
    started = time.perf_counter()
    try:
        with terminate_as_interrupt():  # SIGTERM unwinds: the hosts and the jobs are stopped
            record = measure(args)
    except (RuntimeError, OSError, json.JSONDecodeError, subprocess.SubprocessError) as exc:
        print(f"python bench/figures/partitions.py: error: {exc}", file=sys.stderr)
        return 2
    emit_record(stamp(record, __file__, argv, started), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
