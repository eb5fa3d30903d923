"""Fault injection: kill ``hogwild train`` at random moments and count what it leaves behind.

Each trial starts a small job (``hogwild train`` on MNIST, two workers, many short epochs),
waits a random time (start-up included: from 0 s, before the workers exist, to well into
training), and sends a random signal (SIGKILL, SIGTERM or SIGINT) to the parent or to one of its
workers (when there are any yet). Then it checks what a user would:

- the job ends within a bound (a signal to a worker stops the job with an error; SIGINT to a
  worker is ignored by design, so the trial then stops the parent with SIGTERM);
- after SIGTERM or SIGINT of the parent: exit status 143 or 130 (or the end by SIGINT a shell
  also reports as 130, once the job printed that it was interrupted), no segment, no process;
- after SIGKILL of the parent: no process (the workers notice and leave), and no segment once
  ``hogwild shm gc`` has run (an orphaned worker removes the arena itself; gc is the net);
- every process the job ever had (watched every 20 ms) is gone.

``python bench/figures/chaos_train.py --trials 200`` prints one JSON line: trials, counts per target
and signal, ``leaked_segments``, ``leftover_processes``, ``unexpected_status`` and every failing
trial's description. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.machine import describe_machine, versions
from bench.support.process_watch import Watcher
from bench.support.record import emit_record

SHM = Path("/dev/shm")
EXIT_TIMEOUT_S = 45.0
IGNORED_S = 2.0
WORKER_EXIT_S = 20.0
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}


def _job_args(data: Path, directory: Path) -> list[str]:
    return [
        sys.executable, "-m", "hogwild.cli", "train", "--data", str(data), "--workers", "2",
        "--epochs", "1000", "--subset", "400", "--checkpoint-dir", str(directory / "ck"),
        "--metrics", str(directory / "m.jsonl"), "--no-progress",
    ]  # fmt: skip


def _interactive_signals() -> None:
    """In the child: Ctrl-C as a terminal delivers it, even if this harness runs in the background.

    A shell starts background jobs with SIGINT ignored and their children inherit that (Python
    then installs no KeyboardInterrupt handler); a user's job in a terminal has the default.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _segments(pid: int) -> list[str]:
    try:
        return [n for n in os.listdir(SHM) if n.startswith(f"hogwild-train-{pid}-")]
    except FileNotFoundError:
        return []


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in processes:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def trial(rng: random.Random, data: Path, max_delay: float) -> dict:
    """One job, one signal at a random moment; what was left."""
    with tempfile.TemporaryDirectory(prefix="hogwild-chaos-") as tmp:
        job = subprocess.Popen(
            _job_args(data, Path(tmp)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_interactive_signals,
        )
        watcher = Watcher(psutil.Process(job.pid))
        delay = rng.uniform(0.0, max_delay)
        time.sleep(delay)
        name = rng.choice(sorted(SIGNALS))
        workers = watcher.workers()
        target = "parent" if not workers or rng.random() < 0.5 else "worker"
        started = _hogwild_started(job.pid)
        record = {"delay_s": round(delay, 3), "signal": name, "target": target}
        record["started"] = started
        try:
            if target == "parent":
                job.send_signal(SIGNALS[name])
            else:
                rng.choice(workers).send_signal(SIGNALS[name])
        except (ProcessLookupError, psutil.Error):
            pass
        ignored = target == "worker" and name == "SIGINT"  # by design: the parent owns Ctrl-C
        try:
            job.communicate(timeout=IGNORED_S if ignored else EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # the job goes on: stop it as a user would
            job.send_signal(signal.SIGTERM)
            try:
                job.communicate(timeout=EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                job.kill()
                job.communicate()
                record["hung"] = True
        record["status"] = job.returncode
        seen = watcher.stop()
        deadline = time.monotonic() + WORKER_EXIT_S
        while _alive(seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _alive(seen)
        record["leftover_processes"] = len(left)
        for proc in left:
            proc.kill()
        if target == "parent" and name == "SIGKILL":
            deadline = time.monotonic() + WORKER_EXIT_S
            while _segments(job.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            subprocess.run(
                [sys.executable, "-m", "hogwild.cli", "shm", "gc"], capture_output=True, timeout=60
            )
        leaked = _segments(job.pid)
        record["leaked_segments"] = len(leaked)
        for name_ in leaked:
            (SHM / name_).unlink(missing_ok=True)
        expected = _expected_status(target, name, started)
        record["unexpected_status"] = job.returncode not in expected
        return record


def _hogwild_started(pid: int) -> bool:
    """Whether the job's ``main`` has run: it catches SIGTERM first of all, which the kernel
    shows in ``/proc/PID/status`` (``SigCgt``). Before that the interpreter is still starting
    (on a busy machine that takes seconds), and the signals have their default effects."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass
    return False  # gone already, or unreadable: judged as still starting


def _expected_status(target: str, name: str, started: bool) -> set[int]:
    """The exit statuses a user may see.

    Before ``hogwild`` has installed its handlers (not ``started``) the interpreter may still be
    loading: SIGTERM then ends it by default (-15) and SIGINT interrupts an import (status 1)
    or, raised where nothing catches it, ends the interpreter by SIGINT (-2); nothing exists yet
    to leave behind, which the trial still checks.
    """
    if target == "parent":
        expected = {"SIGKILL": {-9}, "SIGTERM": {143}, "SIGINT": {130}}[name]
        if not started:
            expected |= {"SIGKILL": set(), "SIGTERM": {-15}, "SIGINT": {1, -2}}[name]
        return expected
    return {1, 143} if name == "SIGINT" else {1}  # a worker died; SIGINT: stopped by us


def run_trials(trials: int, data: Path, seed: int = 0, max_delay: float = 6.0) -> dict:
    """Run ``trials`` trials; a summary with counts and the failing trials."""
    rng = random.Random(seed)
    records = [trial(rng, data, max_delay) for _ in range(trials)]
    failing = [
        r for r in records
        if r["leaked_segments"] or r["leftover_processes"] or r["unexpected_status"]
        or r.get("hung")
    ]  # fmt: skip
    return {
        "benchmark": "chaos",
        "trials": trials,
        "signals": dict(Counter(f"{r['target']}:{r['signal']}" for r in records)),
        "leaked_segments": sum(r["leaked_segments"] for r in records),
        "leftover_processes": sum(r["leftover_processes"] for r in records),
        "unexpected_status": sum(r["unexpected_status"] for r in records),
        "hung": sum(bool(r.get("hung")) for r in records),
        "failing": failing,
        "seed": seed,
    }


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-delay", type=float, default=6.0, help="latest kill, seconds")
    parser.add_argument("--data", type=Path, default=None, help="MNIST idx files")
    parser.add_argument("--out", type=Path, help="also write the JSON line here")
    args = parser.parse_args(argv)
    data = args.data
    if data is None:
        from tests.mnist_files import mnist_dir

        data = mnist_dir()
    started = time.monotonic()
    summary = run_trials(args.trials, data, args.seed, args.max_delay)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    summary["machine"], summary["versions"] = describe_machine(), versions()
    emit_record(summary, args.out)
    return 0 if not summary["failing"] else 1


if __name__ == "__main__":
    sys.exit(main())
