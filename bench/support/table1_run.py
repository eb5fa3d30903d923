"""One training job of Adam's Table 1, run as a reader would type it, and what it ended with.

Both Table 1 scripts (``bench/figures/adam_table1.py``, the seeded table, and
``bench/figures/table1_search.py``, the recipe search) run their jobs through :func:`run_job`: a
``hogwild train`` (asynchronous, or ``--sync``) or a ``hogwild cluster`` subprocess on the job
config, the seed and the caller's overrides, its per-epoch metrics written to a JSON-lines file.
The result is the final summary's test accuracy, the best epoch's, every epoch's test accuracy
and the last training loss (whether the model still had something left to learn), and the command
that reproduces the run.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["JOB_COMMANDS", "Job", "JobFailed", "read_run_log", "run_job"]

JOB_COMMANDS = ("train", "cluster")
RUN_TIMEOUT_S = 3 * 3600.0  # a hang's bound: a 60-epoch job takes 6 to 25 minutes on 2 cores


class JobFailed(RuntimeError):
    """A job exited with an error (or printed no summary); the message ends with its stderr."""


@dataclass(frozen=True)
class Job:
    """One run: ``hogwild COMMAND --data DATA [--config CONFIG] --train.seed=SEED OVERRIDES``.

    ``command`` is ``train`` or ``cluster``; ``overrides`` are command-line arguments after the
    config (``--section.key=value`` and flags such as ``--sync``), in order: a later one wins.
    """

    command: str
    seed: int
    overrides: tuple[str, ...] = ()
    config: str = ""
    extra: tuple[str, ...] = field(default=())  # the caller's own, after the job's (they win)

    def __post_init__(self) -> None:
        if self.command not in JOB_COMMANDS:
            raise ValueError(f"job command {self.command!r}: expected one of {JOB_COMMANDS}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed {self.seed!r}: expected a non-negative integer")

    def argv(self, data: str, metrics: Path) -> list[str]:
        """The arguments after ``hogwild`` that run this job."""
        argv = [self.command, "--data", data, "--metrics", str(metrics)]
        if self.config:
            argv += ["--config", self.config]
        argv += [f"--train.seed={self.seed}", "--output.progress=false"]
        return argv + [*self.overrides, *self.extra]


def run_job(job: Job, data: str, metrics: Path, *, timeout: float = RUN_TIMEOUT_S) -> dict:
    """Run ``job`` to its end (a fresh ``metrics`` file: the trainer appends) and return its
    result: final and best test accuracy, per-epoch test accuracies, last training loss, wall
    time, examples/s and the command. Raises :class:`JobFailed` when the job fails."""
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.unlink(missing_ok=True)
    argv = job.argv(data, metrics)
    command = [sys.executable, "-m", "hogwild.cli", *argv]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    wall_s = time.perf_counter() - started
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise JobFailed(
            f"hogwild {shlex.join(argv)} exited with {done.returncode}:\n{done.stderr[-4000:]}"
        )
    summary = json.loads(lines[-1])
    records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines()]
    epochs = [r for r in records if r.get("event") == "epoch"]
    accuracies = [r["test_accuracy"] for r in epochs]
    return {
        "test_accuracy": summary["test_accuracy"],
        "best_test_accuracy": max(accuracies) if accuracies else None,
        "epochs": len(accuracies),
        "per_epoch": accuracies,
        "train_loss": epochs[-1].get("train_loss") if epochs else None,
        "wall_s": round(wall_s, 1),
        "examples_per_s": summary.get("examples_per_s"),
        "metrics": str(metrics),
        "command": shlex.join(["hogwild", *argv]),
    }


def read_run_log(path: Path, check: Callable[[dict], object], what: str) -> list[dict]:
    """The runs of a JSON-lines log (both Table 1 scripts resume from one), in order; ``check``
    raises ValueError, KeyError or TypeError for a line that is not ``what``. Such a line (a torn
    last line of a killed script) is an error naming the line, not silently dropped."""
    if not path.exists():
        return []
    runs = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
            check(line)
        except (ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"{path}:{number}: not a {what} ({exc}): {text[:200]}") from exc
        runs.append(line)
    return runs
