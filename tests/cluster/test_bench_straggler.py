"""``bench/figures/straggler.py --quick``: the shape of its JSON line and what it promises, not its
speed.

The quick run trains a one-epoch job of 1,000 examples through ``hogwild cluster`` (2 replicas, 1
parameter server) twice: in portions with a busy process on replica 1's CPU, and in fixed shards
without (the full run's other two, portions quiet and shards busy, run the same code of the script
and of the cluster; they only give the ratios, which the quick run then leaves null). Checks:
every field is there, every run trained the whole epoch, the busy run found replica 1's CPU, the
shards are fixed, and nothing is left spinning.
"""

from __future__ import annotations

import sys

import psutil
import pytest

from bench.figures.straggler import busy_code
from tests.bench_runs import run_bench, small_mnist


@pytest.mark.slow
def test_quick_run_reports_both_splits_busy_and_quiet(
    tmp_path, mnist_dir, tmp_path_factory, repo_root
):
    data = small_mnist(mnist_dir, tmp_path_factory)  # what a smoke run needs of MNIST
    out = tmp_path / "straggler.json"
    command = [sys.executable, str(repo_root / "bench" / "figures" / "straggler.py"), "--quick"]
    command += ["--data", str(data), "--out", str(out)]
    record = run_bench(command, out, timeout=600, cwd=repo_root)

    assert record["benchmark"] == "straggler"
    assert record["command"].startswith("python bench/figures/straggler.py --quick")
    assert {"cpu_model", "logical_cores", "memory_gib"} <= set(record["machine"])
    rows = {(r["split"], r["busy"]): r for r in record["results"]}
    assert set(rows) == {("portions", True), ("shards", False)}
    for (split, busy), row in rows.items():
        assert row["examples_per_s"] > 0 and len(row["samples"]) == 1
        assert sum(row["per_replica_examples"].values()) == 1000, (split, busy, row)
        assert set(row["per_replica_examples"]) == {"0", "1"}
        assert (row["busy_cpu"] is not None) == busy
    shards = rows[("shards", False)]["per_replica_examples"]
    assert shards == {"0": 500, "1": 500}  # one fixed shard each
    assert record["portions_vs_shards"] == {"busy": None, "quiet": None}  # no split both ways
    # the busy processes went with their runs: none runs the bench's own busy program (a looser
    # match, any "while True" in a command line, once caught a process of the CI machine's own)
    programs = [
        ["-c", busy_code(row["busy_cpu"])] for row in rows.values() if row["busy_cpu"] is not None
    ]
    running = psutil.process_iter(["cmdline"])
    spinning = [p for p in running if (p.info["cmdline"] or [])[1:] in programs]
    assert spinning == []
