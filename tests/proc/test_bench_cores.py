"""``hogwild bench cores``: a tiny run end to end through the CLI, the plot, and the CLI's errors.

The tiny run (one worker, batches 1 and 32, 100 timed examples, one repetition) checks the shape
and the sanity of the JSON line, not the speed: every field is present, rates are positive, the
ratio to the peer is ours over the peer's, and the fraction of the sgemm peak is the trained
FLOP/s (6 x connections per example) over the peak the run measured. Not that it lies below 1:
the tiny run's peak is one 0.1 s sgemm beside whatever else the host runs then (another test), so
on a loaded host it can fall below the training's rate, measured at another moment. It
asks for 1 and 2 workers with a time budget spent before the second count, which the record then
names as not measured.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from hogwild import cli_commands
from tests.bench_runs import small_mnist
from tests.cli_in_process import hogwild_cli

ROW_FIELDS = (
    "batch",
    "workers",
    "examples_per_s",
    "examples_per_s_range",
    "connections_per_s",
    "speedup",
    "peer_examples_per_s",
    "ratio_vs_peer",
    "fraction_of_peak",
    "peak_gflops",
    "control_examples_per_s",
    "control_speedup",
    "peer_control_examples_per_s",
    "worker_private_mb",
    "worker_private_growth_mb",
    "worker_beyond_runtime_mb",
    "context_mb",
)


@pytest.mark.slow
def test_tiny_run_prints_every_field(tmp_path, mnist_dir, tmp_path_factory):
    pytest.importorskip("torch")
    data = small_mnist(mnist_dir, tmp_path_factory)  # what a smoke run needs of MNIST
    out = tmp_path / "results" / "cores.json"
    command = [sys.executable, "-m", "hogwild.cli", "bench", "cores", "--workers", "1,2"]
    command += ["--batches", "1,32", "--examples", "100", "--warmup", "50", "--repeats", "1"]
    command += ["--time-budget", "0.001"]  # spent before the second worker count starts
    command += ["--sgemm-s", "0.1"]  # the peak's shape, not its figure
    command += ["--data", str(data), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout  # one JSON line, progress on stderr
    record = json.loads(lines[0])
    assert out.read_text().strip() == lines[0]

    assert record["connections"] == 756_000
    assert record["command"].startswith("hogwild bench cores --workers 1,2")
    assert record["settings"]["workers"] == [1]
    assert record["settings"]["workers_not_measured"] == [2]
    assert "--time-budget spent; not measured: [2]" in done.stderr
    assert {"cpu_model", "logical_cores", "memory_gib"} <= set(record["machine"])
    assert record["machine"]["logical_cores"] >= 1 and record["machine"]["memory_gib"] > 0
    assert {"python", "numpy", "numba", "torch"} <= set(record["versions"])
    assert record["versions"]["torch"] and record["versions"]["numba"]
    assert record["sgemm_gflops"]["per_core"] > 0 and record["sgemm_gflops"]["all_cores"] > 0
    assert record["settings"]["sgemm_s"] == 0.1
    assert record["worker_runtime_mb"] > 0

    rows = record["results"]
    assert sorted((row["batch"], row["workers"]) for row in rows) == [(1, 1), (32, 1)]
    for row in rows:
        missing = [field for field in ROW_FIELDS if field not in row]
        assert not missing, f"row {row} lacks {missing}"
        for field in ("examples_per_s", "peer_examples_per_s", "control_examples_per_s"):
            assert math.isfinite(row[field]) and row[field] > 0, (field, row)
        assert row["connections_per_s"] == pytest.approx(row["examples_per_s"] * 756_000)
        ratio = row["examples_per_s"] / row["peer_examples_per_s"]
        assert row["ratio_vs_peer"] == pytest.approx(ratio)
        flops = 6 * 756_000 * row["examples_per_s"]  # a timing beside a timing: not bounded
        assert row["fraction_of_peak"] == pytest.approx(flops / (row["peak_gflops"] * 1e9))
        assert row["peak_gflops"] > 0
        assert row["speedup"] == pytest.approx(1.0) and row["control_speedup"] == pytest.approx(1)
        low, high = row["examples_per_s_range"]
        assert low <= row["examples_per_s"] <= high
        assert row["worker_private_mb"] > row["context_mb"] > 0
        assert math.isfinite(row["worker_private_growth_mb"])


def test_plot_draws_fig8(tmp_path, repo_root, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.syspath_prepend(str(repo_root))
    from bench.support.plot_adam_fig8 import plot_cores

    rows = []
    for batch in (1, 32):
        for workers in (1, 2):
            rate = 1000.0 * workers * (1.5 if batch == 32 else 1.0)
            rows.append(
                {
                    "batch": batch,
                    "workers": workers,
                    "examples_per_s": rate,
                    "examples_per_s_range": [rate * 0.9, rate * 1.1],
                    "peer_examples_per_s": rate / 4,
                    "peer_examples_per_s_range": [rate / 5, rate / 3],
                    "control_speedup": float(workers) * 0.9,
                }
            )
    record = {"connections": 756_000, "machine": {"cpu_model": "test", "usable_cores": 2}}
    path = plot_cores({**record, "results": rows}, tmp_path / "plots" / "fig8.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_without_source_tree_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli_commands, "bench_dir", lambda: tmp_path / "bench")
    code, _, error = hogwild_cli(capsys, "bench", "cores", "--workers", "1")
    assert code == 2
    assert "needs the source tree" in error and str(tmp_path / "bench") in error


def test_bench_arguments_are_checked(capsys):
    with pytest.raises(SystemExit) as exit_info:
        hogwild_cli(capsys, "bench", "cores", "--workers", "0")
    assert exit_info.value.code == 2
    assert "positive integers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        hogwild_cli(capsys, "bench", "cores", "--time-budget", "0")
    assert exit_info.value.code == 2
    assert "--time-budget must be a positive number" in capsys.readouterr().err
