"""``bench/figures/sandblaster_members.py --quick``: the shape of its JSON line, not its speed.

Both modes ran (replica threads on the coordinator's board, member processes through the board
service), each its passes over the same batch in the same portions, and the ratio is the best
runs' passes/s; nothing is left behind (the suite's leak check).
"""

from __future__ import annotations

import sys

import pytest

from tests.bench_runs import run_bench, small_mnist

SCRIPT = "bench/figures/sandblaster_members.py"


def test_quick_run_times_threads_and_member_processes_side_by_side(
    tmp_path, mnist_dir, tmp_path_factory, repo_root
):
    data = small_mnist(mnist_dir, tmp_path_factory)  # what a smoke run needs of MNIST
    out = tmp_path / "members.json"
    command = [sys.executable, str(repo_root / SCRIPT), "--quick", "--data", str(data),
               "--out", str(out)]  # fmt: skip
    record = run_bench(command, out, timeout=240, cwd=repo_root)
    assert record["benchmark"] == "sandblaster_members"
    assert record["command"].startswith(f"python {SCRIPT} --quick")
    assert (record["examples"], record["workers"]) == (500, 2)
    results = record["results"]
    assert [r["mode"] for r in results] == ["threads", "processes"]
    for r in results:
        assert r["passes"] == 2 and r["portions"] == 16 and r["seconds"] > 0
        assert r["passes_per_s"] == pytest.approx(2 / r["seconds"], rel=0.05)
    ratio = results[1]["passes_per_s"] / results[0]["passes_per_s"]
    assert record["processes_vs_threads"] == pytest.approx(ratio, abs=0.002)
    assert {"cpu_model", "logical_cores"} <= set(record["machine"])
