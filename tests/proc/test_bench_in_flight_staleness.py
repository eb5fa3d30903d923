"""``bench/figures/in_flight_staleness.py --quick``: the delayed update alone, on the real MNIST
files. With one example in flight it is per-example SGD and the model learns; every record says
whether its weights stayed finite and whether it reached the floor."""

from __future__ import annotations

import sys

from tests.bench_runs import run_bench

SCRIPT = "bench/figures/in_flight_staleness.py"


def test_quick_run_trains_with_one_and_four_in_flight(tmp_path, mnist_dir, repo_root):
    out = tmp_path / "staleness.json"
    command = [sys.executable, str(repo_root / SCRIPT), "--quick", "--data", str(mnist_dir)]
    record = run_bench(command + ["--out", str(out)], out, timeout=600, cwd=repo_root)
    assert record["benchmark"] == "in_flight_staleness"
    assert record["command"].startswith(f"python {SCRIPT} --quick")
    runs = {r["in_flight"]: r for r in record["results"]}
    assert set(runs) == {1, 4}
    for run in runs.values():
        assert run["factor"] == 1 and run["connections"] == 756_000 and run["lr"] == 0.003
        assert run["learned"] == (run["test_accuracy"] >= record["settings"]["learned_floor"])
    # 100 examples of per-example SGD on the small model: far above one class (about 0.1)
    assert runs[1]["finite"] and runs[1]["test_accuracy"] > 0.3
