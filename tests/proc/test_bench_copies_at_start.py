"""``bench/figures/copies_at_start.py`` on a slice of MNIST: the shape of its JSON line.

One seed, two workers, two contenders (the default store's copies and one shared copy), one
epoch of the 10,000-example slice each. Checks: one result per contender and worker count with
each run's seed, accuracy in [0, 1], training loss and speed, the dead runs counted by the
threshold it states, the median of the runs; a contender it does not know is refused naming the
known ones. Whether copies die is the full run's finding (bench/results/copies_at_start.md),
not something a smoke run can show.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.bench_runs import run_bench, small_mnist

SCRIPT = "bench/figures/copies_at_start.py"


@pytest.mark.slow
def test_one_seed_of_two_contenders_prints_every_field(
    tmp_path, mnist_dir, tmp_path_factory, repo_root
):
    data = small_mnist(mnist_dir, tmp_path_factory)
    out = tmp_path / "copies.json"
    command = [sys.executable, str(repo_root / SCRIPT), "--data", str(data), "--workers", "2",
               "--seeds", "1", "--contenders", "copies,shared", "--out", str(out)]  # fmt: skip
    record = run_bench(command, out, timeout=600, cwd=repo_root)

    assert record["benchmark"] == "copies_at_start" and record["dead_below"] == 0.5
    assert record["command"].startswith(f"python {SCRIPT} --data")
    assert set(record["results"]) == {"copies/2", "shared/2"}
    for result in record["results"].values():
        (run,) = result["each"]
        assert run["seed"] == 1 and 0.0 <= run["test_accuracy"] <= 1.0
        assert run["train_loss"] > 0 and run["examples_per_s"] > 0
        assert result["runs"] == 1
        assert result["dead"] == (run["test_accuracy"] < 0.5)
        assert result["median_test_accuracy"] == result["min_test_accuracy"] == run["test_accuracy"]


def test_an_unknown_contender_is_refused_naming_the_known_ones(repo_root, tmp_path):
    done = subprocess.run(
        [sys.executable, str(repo_root / SCRIPT), "--data", str(tmp_path), "--contenders", "nope"],
        capture_output=True, text=True, timeout=60, cwd=repo_root,
    )  # fmt: skip
    assert done.returncode == 2
    known = "copies, copies-unramped, copies-push8, shared"
    assert f"--contenders: nope unknown; known: {known}" in done.stderr
