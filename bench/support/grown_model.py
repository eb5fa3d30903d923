"""The paper's MNIST model grown by its feature maps, and one-epoch CLI runs of it.

Project Adam (section 4.2, Fig. 10) grows a model by its feature maps. The partition benchmarks
(``bench/figures/adam_fig10_partitions.py``, ``partition_hosts.py``, ``in_flight_staleness.py``)
grow the bundled Adam MNIST model the same way: both convolutions' maps multiplied by a
``factor`` (10 and 20 maps at factor 1). This module names that growth once, as config overrides
and as CLI flags, gives the plan of a grown model split K ways (its connections and the bytes
crossing per example), and runs ``hogwild train`` one-epoch jobs of it from the command line,
several at once, returning each job's summary (its last stdout line).
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench.support.paper_job import PAPER_JOB

# the bundled model's layers whose maps grow: its two convolutions, and their maps at factor 1
GROWN_LAYERS = ((0, 10), (3, 20))


def grown_overrides(factor: int) -> dict[str, int]:
    """Config overrides that multiply both convolutions' feature maps by ``factor``."""
    return {f"model.layers.{layer}.maps": maps * factor for layer, maps in GROWN_LAYERS}


def grown_flags(factor: int) -> list[str]:
    """The same growth as ``hogwild`` command-line overrides."""
    return [f"--{key}={value}" for key, value in grown_overrides(factor).items()]


def grown_plan(factor: int, partitions: int) -> tuple[int, int]:
    """Connections and bytes crossing per example of the grown model split ``partitions``
    ways."""
    from hogwild.config import load_config
    from hogwild.model.network import model_network
    from hogwild.partition.plan import plan_partitions

    network = model_network(load_config(None, grown_overrides(factor)).model)
    return network.connections, plan_partitions(network, partitions).bytes_per_example


def one_epoch_command(data: str, examples: int, factor: int, extra: list[str]) -> list[str]:
    """``hogwild train``: one epoch of the first ``examples`` examples of ``data`` on the paper
    job grown by ``factor``; ``extra`` comes last, so that it wins over the paper job's flags."""
    return [
        sys.executable, "-m", "hogwild.cli", "train", "--data", str(data), "--epochs", "1",
        "--subset", str(examples), "--no-progress", *PAPER_JOB, *grown_flags(factor), *extra,
    ]  # fmt: skip


def finish(process: subprocess.Popen, timeout_s: float) -> dict:
    """Wait for a started job (killed past ``timeout_s``); its summary. A failed job raises
    RuntimeError with its stderr's tail."""
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise RuntimeError(f"a run took longer than {timeout_s:.0f} s") from None
    if process.returncode != 0:
        raise RuntimeError(f"run failed ({process.returncode}): {err.strip()[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def run_jobs(commands: list[list[str]], timeout_s: float) -> list[dict]:
    """Start ``commands`` at once; their summaries, in order. Every one still running when one
    fails (or on any exit) is killed and reaped."""
    processes = [
        subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for c in commands
    ]
    try:
        return [finish(p, timeout_s) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()


def accuracy_of(summary: dict) -> float:
    """A run's final test accuracy (0.0 when it reports none: such a run does not count)."""
    accuracy = summary.get("test_accuracy")
    return float(accuracy) if accuracy is not None else 0.0
