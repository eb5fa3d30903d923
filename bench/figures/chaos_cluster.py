"""Chaos in a replicated ``hogwild cluster`` job (issue 12): kill roles while it trains.

The job is Adam's MNIST model on the schedule of :mod:`bench.support.paper_job` (12 epochs unless
``--epochs``) through ``hogwild cluster --ps 3 --cluster.copies=3 --replicas 2 --data-servers 1
--cluster.restarts=1000``: three parameter servers keeping three copies of every bucket under an
etcd the driver starts, and a driver that restarts whatever dies. In one run of this script:

1. **fault-free**: the job as it is (its ``examples_per_s`` and test accuracy are the yardsticks);
2. **copies = 1**: the same job with ``--cluster.copies=1`` (what the copies cost);
3. **chaos**: the job again, SIGKILLing a role every ``--kill-every-s`` (times 0.5 to 1.5,
   seeded) until its last epoch ends. The victims come in blocks of 20, shuffled: 12 parameter
   servers, 5 replicas, 3 data servers; the first is a server. Each kill waits until updates
   flow (every shard's version went up since: not while the driver evaluates between epochs, or
   while the replicas are down), so that every failover is measured on a job that pushes
   (``--quick``: its first victim goes at once, its job may be over in seconds, and each
   next victim waits until the last one serves again). A
   server victim is the primary of a random bucket holding shards, as etcd names it just before
   the kill, and is killed only once every such bucket has a live primary and another live
   in-sync copy (the promise needs a survivor). The waits are reported. The driver restarts
   every victim. **Failover**: for every bucket the victim was primary of, the seconds from the
   kill (``time.time()`` just before ``os.kill``) to the first update acknowledged after that
   bucket's next takeover, from the servers' statuses polled every 0.3 s
   (:class:`bench.support.ps_watch.ServerWatch`); ``takeover_s`` is to the takeover's win. A replica
   or data server killed within that time delays the first acknowledgement, and so does an
   epoch's end (the replicas wait while the driver pulls the model, evaluates it and starts the
   next epoch): those delays are in ``failover_s``; ``failover_within_epochs_s`` leaves out the
   failovers during which an epoch's record appeared (the metrics file is watched for them);
4. **ledger** (:mod:`bench.support.ps_ledger`): ``--ledger-kills`` SIGKILLs of primaries under a
   client that sums every acknowledged delta; ``acknowledged_lost`` counts the parameters the
   servers end with that differ from the ledger. A separate phase: a ledger client cannot push into
   a training job's parameters without changing them.

After every run, what it left behind (:mod:`bench.support.leaks`): segments, processes, ports.

Run: ``python bench/figures/chaos_cluster.py --out bench/results/chaos_cluster.json`` (``--quick``:
a smoke run of a few seconds' job: 2 epochs of 6,000 examples, the yardsticks 1 of 2,000, a
kill of each kind, 2 ledger kills under a client pushing at most every 0.05 s).
It prints one JSON line; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.cluster_run import ClusterRun
from bench.support.machine import describe_machine, versions
from bench.support.paper_job import PAPER_JOB, REPLICATED_JOB_ARGS
from bench.support.paths import SHARED_MNIST
from bench.support.ps_ledger import ledger_phase
from bench.support.ps_watch import ServerWatch, spread
from bench.support.record import emit_record, measured

JOB_ARGS = REPLICATED_JOB_ARGS
BLOCK = ["ps"] * 12 + ["replica"] * 5 + ["data"] * 3  # 60 % / 25 % / 15 %
QUICK_VICTIMS = ["ps", "replica", "data"]  # one of each kind
TARGETS = {"failover_max_s": 3.0, "acknowledged_lost": 0, "accuracy_points": 0.3, "kills": 30}
STALL_S = 60.0  # no update acknowledged, or no bucket map to kill in, for this long: stuck


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/figures/chaos_cluster.py", description=__doc__
    )
    add = parser.add_argument
    add("--epochs", type=int, default=None, help="the job's epochs (default: 12)")
    add("--kill-every-s", type=float, default=None, help="mean seconds between kills (3)")
    add("--ledger-kills", type=int, default=None, help="kills of the ledger phase (20)")
    add("--seed", type=int, default=0)
    add("--quick", action="store_true", help="a tiny job: a smoke test, not a measurement")
    add("--data", metavar="DIR", help="MNIST idx files (default $HOGWILD_TEST_DATA or the shared)")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    # quick: two kills of the ledger phase, the second after the first victim's restart
    defaults = {"epochs": 2, "kill_every_s": 1.0, "ledger_kills": 2} if args.quick else {
        "epochs": 12, "kill_every_s": 3.0, "ledger_kills": 20}  # fmt: skip
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.subset = 6000 if args.quick else 0
    args.yardstick_subset = 2000 if args.quick else 0  # quick: the record's shape, not a figure
    args.bound_s = 240.0 if args.quick else 3600.0
    # quick: the ledger client paced (the full run pushes back to back), as the partitions
    # smoke run paces its own: pushes still overlap every kill, and the servers do not
    # spend the phase replicating full models
    args.ledger_push_every_s = 0.05 if args.quick else 0.0
    args.data = args.data or os.environ.get("HOGWILD_TEST_DATA") or str(SHARED_MNIST)
    return args


def _log(text: str) -> None:
    print(f"chaos_cluster: {text}", file=sys.stderr, flush=True)


def job_args(args, copies: int, epochs: int | None = None, subset: int = 0) -> list[str]:
    """``hogwild cluster``'s arguments (run directory and metrics added per run); ``epochs``,
    ``subset``: other than ``--epochs`` and the run's subset."""
    out = ["cluster", "--data", args.data, *JOB_ARGS, *PAPER_JOB, f"--cluster.copies={copies}"]
    if epochs or args.epochs:
        out += ["--epochs", str(epochs or args.epochs)]
    if subset or args.subset:
        out += [f"--train.subset={subset or args.subset}"]
    return [*out, "--no-progress"]


# -- the chaos run ------------------------------------------------------------------------------


def run_job(args, folder: Path, name: str, copies: int, rng: random.Random | None) -> dict:
    """The job once (with chaos when ``rng`` is given); its figures."""
    # the quick run's yardsticks train one epoch of a third of the examples: their figures are
    # the record's shape there, while the chaos run needs its epochs to last through every kind
    # of kill
    yardstick = args.quick and rng is None
    subset = args.yardstick_subset if yardstick else 0
    command = job_args(args, copies, 1 if yardstick else None, subset)
    _log(f"{name}: hogwild {shlex.join(command)}")
    run = ClusterRun(command, folder, name)
    watch, kills, stuck = None, [], None
    try:
        run.wait_started()
        epochs = run.start["config"]["train"]["epochs"]
        if copies > 1:
            etcd = run.start["config"]["cluster"]["etcd"]
            watch = ServerWatch(
                run.start["ps_servers"],
                etcd,
                run.where["job"],
                interval_s=0.3 if rng else 2.0,
                alive=lambda i: run.pid_of(f"ps {i}") is not None,
            ).start()
        if rng is not None:
            kills, stuck = chaos(run, watch, rng, args, epochs)
        summary, error, leaked = run.finish(args.bound_s, stop=stuck is not None)
    finally:
        run.job.stop()
        if watch is not None:
            watch.stop()
    run.records()
    for event in kills:
        event["failovers"] = [
            watch.failover(event["at"], int(b), e) for b, e in event.get("buckets", {}).items()
        ]
        for failover in event["failovers"]:  # an epoch end inside: the replicas idled
            end = event["at"] + (failover["failover_s"] or 0.0)  # unfinished: counted as such
            failover["epoch_end"] = any(event["at"] <= t <= end for t in run.epoch_seen.values())
    summary = summary or {}
    _log(
        f"{name}: test accuracy {summary.get('test_accuracy')}, "
        f"{summary.get('examples_per_s') or 0:.0f} examples/s, {len(kills)} kills, leaked "
        f"{leaked['segments']} segments {leaked['processes']} processes {leaked['ports']} ports"
        + (f"; FAILED: {error}" if error else "")
        + (f"; STUCK: {stuck}" if stuck else "")
    )
    return {
        "test_accuracy": summary.get("test_accuracy"),
        "examples_per_s": summary.get("examples_per_s"),
        "epochs": summary.get("epochs"),
        "epoch_records_at_s": [  # seen while killing (only then is the file watched)
            round(t - run.started, 1) for _, t in sorted(run.epoch_seen.items())
        ]
        if rng is not None
        else None,
        "wall_s": summary.get("wall_s"),
        "restarts": summary.get("restarts"),
        "takeovers": len(watch.takeovers) if watch else None,
        "error": error,
        "stuck": stuck,
        "leaked": leaked,
        "kills": kills,
        "config": {k: run.start["config"][k] for k in ("cluster", "ps", "train")},
    }


def chaos(run: ClusterRun, watch: ServerWatch, rng: random.Random, args, epochs: int):
    """Kill roles of the running job until its last epoch ends: the kills, and None or, when
    the servers did not recover between two kills, what they looked like (the job is then
    stopped, not left to hang)."""
    kills, started = [], time.time()
    kinds = _victims(rng, args.quick)

    def going() -> bool:
        return run.running() and not run.last_epoch_done(epochs)

    kind = next(kinds, None)
    # The quick run's job may end within seconds: its first victim (a server) goes at once, not
    # after a pause and the updates' flow, so one of every kind its test checks is killed.
    first = args.quick
    next_at = time.monotonic() + (0.0 if first else args.kill_every_s * rng.uniform(0.5, 1.5))
    awaited = None  # quick: the last victim and the restart counts before its kill
    while kind is not None and going():
        if time.monotonic() < next_at:
            time.sleep(0.05)
            continue
        if awaited is not None:
            if not _back(run, *awaited, alive=going):
                if not going():
                    break  # the job ended first
                return kills, {
                    "after_s": round(time.time() - started, 3),
                    "why": f"{awaited[0]} not serving again for {STALL_S:.0f} s",
                    "map": watch.buckets(),
                    "servers": watch.snapshot(),
                }
            awaited = None
        flowing_s, flowing = (0.0, True) if first else watch.wait_flowing(STALL_S, alive=going)
        copies_s, seen = None, None
        if flowing and kind == "ps":
            copies_s, seen = watch.wait_copies(2, STALL_S, alive=going)
        if not going():
            break
        if not flowing or (kind == "ps" and seen is None):
            why = "no update acknowledged" if not flowing else "no live primary with a copy"
            return kills, {
                "after_s": round(time.time() - started, 3),
                "why": f"{why} for {STALL_S:.0f} s",
                "map": watch.buckets(),
                "servers": watch.snapshot(),
            }
        restarted = _restarts(run)  # before the kill: its victim's restart comes after
        event = _kill_ps(run, watch, rng, seen) if kind == "ps" else _kill_role(run, kind, rng)
        if event is not None:  # else: no live victim now, try again soon
            event["since_start_s"] = round(event["at"] - started, 3)
            event["waited_for_updates_s"] = round(flowing_s, 3)
            if copies_s is not None:
                event["waited_for_copies_s"] = round(copies_s, 3)
            kills.append(event)
            awaited = (event["role"], restarted) if args.quick else None
            first = False
            held = f", primary of buckets {sorted(event['buckets'])}" if kind == "ps" else ""
            _log(f"killed {event['role']} (pid {event['pid']}){held}")
            kind = next(kinds, None)
        pause = args.kill_every_s * rng.uniform(0.5, 1.5) if event is not None else 0.2
        next_at = time.monotonic() + pause
    return kills, None


def _restarts(run: ClusterRun) -> dict[str, int]:
    """How many times the driver has restarted each role so far (its restart records, written
    once a restarted role serves)."""
    counts: dict[str, int] = {}
    for record in run.records():
        if record.get("event") == "restart":
            counts[record["role"]] = counts.get(record["role"], 0) + 1
    return counts


def _back(run: ClusterRun, role: str, before: dict[str, int], alive) -> bool:
    """Whether ``role`` serves again: a restart record of it more than ``before`` (the counts
    just before it was killed). Waited for while ``alive()``, at most ``STALL_S``.

    The quick run kills its next victim only then: a role killed while another restarts can
    fail that restart (a replica starting while the data server is down gives up and is
    started again, over and over while the data server's own restart is slow), and the quick
    run checks that each kind of kill is survived, not how restarts pile up."""
    deadline = time.monotonic() + STALL_S
    while alive() and time.monotonic() < deadline:
        if _restarts(run).get(role, 0) > before.get(role, 0):
            return True
        time.sleep(0.05)
    return False


def _victims(rng: random.Random, quick: bool):
    if quick:
        yield from QUICK_VICTIMS
        return
    yield "ps"
    while True:
        block = list(BLOCK)
        rng.shuffle(block)
        yield from block


def _kill_role(run: ClusterRun, kind: str, rng: random.Random) -> dict | None:
    names = [f"{kind} {i}" for i in range(2 if kind == "replica" else 1)]
    live = [(n, p) for n in names if (p := run.pid_of(n)) is not None]
    if not live:
        return None
    name, pid = rng.choice(live)
    at = time.time()
    os.kill(pid, signal.SIGKILL)
    return {"kind": kind, "role": name, "pid": pid, "at": at}


def _kill_ps(run: ClusterRun, watch: ServerWatch, rng: random.Random, seen: dict) -> dict | None:
    """SIGKILL the primary of a random bucket holding shards (``seen``: the map just read)."""
    victim = seen[rng.choice(sorted(seen))]["primary"]
    pid = run.pid_of(f"ps {victim}")
    if pid is None:
        return None
    held = {b: v["epoch"] for b, v in seen.items() if v["primary"] == victim}
    watch.poll()  # what the victim won so far
    at = time.time()
    os.kill(pid, signal.SIGKILL)
    return {"kind": "ps", "role": f"ps {victim}", "pid": pid, "at": at, "buckets": held}


# -- the record -----------------------------------------------------------------------------------


def measure(args) -> dict:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-chaos-cluster-") as tmp:
        folder = Path(tmp)
        fault_free = run_job(args, folder, "fault_free", 3, None)
        copies_1 = run_job(args, folder, "copies_1", 1, None)
        chaotic = run_job(args, folder, "chaos", 3, rng)
    _log(f"ledger phase: {args.ledger_kills} kills")
    ledger = ledger_phase(
        args.ledger_kills,
        args.kill_every_s,
        args.seed,
        log=_log,
        push_every_s=args.ledger_push_every_s,
    )
    kills = chaotic["kills"]
    failovers = [f for k in kills for f in k.get("failovers", [])]
    counts = {kind: sum(k["kind"] == kind for k in kills) for kind in ("ps", "replica", "data")}
    failover = spread([f["failover_s"] for f in failovers])
    within = spread([f["failover_s"] for f in failovers if not f["epoch_end"]])
    accuracies = (chaotic["test_accuracy"], fault_free["test_accuracy"])
    # quick: the yardsticks train a smaller job than the chaos run, so there is no gap to measure
    unlike = args.quick or None in accuracies
    gap = None if unlike else abs(accuracies[0] - accuracies[1]) * 100
    rates = (fault_free["examples_per_s"], copies_1["examples_per_s"])
    runs = {"chaos": chaotic, "fault_free": fault_free, "copies_1": copies_1}
    leaked = {name: run["leaked"] for name, run in runs.items()} | {"ledger": ledger["leaked"]}
    leak_total = sum(v[k] for v in leaked.values() for k in ("segments", "processes", "ports"))
    stuck = chaotic["stuck"]
    return {
        "benchmark": "chaos_cluster",
        "kills": counts | {"total": len(kills)},
        "failover_s": failover,
        "failover_within_epochs_s": within,
        "takeover_s": spread([f["takeover_s"] for f in failovers]),
        "waited_for_updates_s": spread([k["waited_for_updates_s"] for k in kills]),
        "waited_for_copies_s": spread(
            [k["waited_for_copies_s"] for k in kills if "waited_for_copies_s" in k]
        ),
        "acknowledged_lost": ledger["lost"],
        "ledger": {k: v for k, v in ledger.items() if k != "leaked"},
        "test_accuracy": chaotic["test_accuracy"],
        "fault_free_test_accuracy": fault_free["test_accuracy"],
        "copies_1_test_accuracy": copies_1["test_accuracy"],
        "accuracy_gap_points": None if gap is None else round(gap, 3),
        "copies_3_vs_1": {
            "ratio": rates[0] / rates[1] if None not in rates else None,
            "copies_3_examples_per_s": fault_free["examples_per_s"],
            "copies_1_examples_per_s": copies_1["examples_per_s"],
        },
        "leaked": leaked,
        "targets": {
            **TARGETS,
            "failover_met": failover["max"] is not None
            and failover["max"] <= TARGETS["failover_max_s"]
            and not failover["unfinished"]
            and not stuck,
            "failover_within_epochs_met": within["max"] is not None
            and within["max"] <= TARGETS["failover_max_s"]
            and not within["unfinished"],
            "lost_met": ledger["lost"] == 0 and not ledger["problems"],
            "accuracy_met": gap is not None and gap <= TARGETS["accuracy_points"],
            "leaks_met": leak_total == 0,
            "kills_met": len(kills) >= TARGETS["kills"],
        },
        "runs": {
            name: {k: v for k, v in run.items() if k not in ("leaked", "kills", "config")}
            for name, run in runs.items()
        },
        "events": kills,
        "job": {
            "command": shlex.join(["hogwild", *job_args(args, 3)]),
            "epochs": chaotic["epochs"],
            "settings": chaotic["config"],
        },
        "settings": {
            "kill_every_s": args.kill_every_s,
            "victims": {"ps": 0.6, "replica": 0.25, "data": 0.15},
            "ledger_kills": args.ledger_kills,
            "ledger_push_every_s": args.ledger_push_every_s,
            "seed": args.seed,
            "quick": args.quick,
            "subset": args.subset,
            "yardstick_subset": args.yardstick_subset or args.subset,
            "data": args.data,
        },
        "machine": describe_machine(),
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    record = measured(__file__, argv, lambda: measure(args))
    if record is None:
        return 2
    emit_record(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
