"""``bench/figures/drop_in.py --quick``: the shape and the sanity of its JSON line, not speed.

The quick run trains pytorch/examples' MNIST network for one epoch on 1,000 examples with hogwild
(through ``from_torch``) and with the example's own loop (torch on one thread), and tests both on
1,000. Checks: every key the full run reports is there, rates are positive, accuracies lie in
[0, 1], a side that did not reach the target reports null (and the ratio is null then), and the
weights hogwild trained, loaded back into the module with ``to_torch``, give torch the accuracy
hogwild reported.
"""

from __future__ import annotations

import sys

import pytest

from tests.bench_runs import run_bench, small_mnist

SCRIPT = "bench/figures/drop_in.py"


@pytest.mark.slow
def test_quick_run_prints_every_field(tmp_path, mnist_dir, tmp_path_factory, repo_root):
    pytest.importorskip("torch")
    data = small_mnist(mnist_dir, tmp_path_factory)  # what a smoke run needs of MNIST
    out = tmp_path / "drop_in.json"
    command = [sys.executable, str(repo_root / SCRIPT), "--quick", "--data", str(data)]
    record = run_bench([*command, "--out", str(out)], out, timeout=600, cwd=repo_root)

    assert record["benchmark"] == "drop_in"
    assert record["command"].startswith(f"python {SCRIPT} --quick")
    assert record["versions"]["torch"] and record["target_ratio"] == 2.0
    for side in ("hogwild", "example"):
        assert record[f"{side}_examples_per_s"] > 0
        assert 0.0 <= record[f"{side}_test_accuracy"] <= 1.0
        curve = record[f"{side}_epochs"]
        assert [e["epoch"] for e in curve] == [1]
        seconds = record[f"{side}_seconds_to_target"]
        reached = curve[-1]["test_accuracy"] >= record["target_accuracy"]
        assert (seconds is not None) == reached
        assert record[f"{side}_examples_to_target"] == (1000 if reached else None)
    both = record["hogwild_seconds_to_target"] and record["example_seconds_to_target"]
    assert (record["ratio"] is None) == (not both)
    # what a PyTorch user gets back predicts as hogwild did (up to one example in 1,000)
    assert abs(record["hogwild_torch_test_accuracy"] - record["hogwild_test_accuracy"]) <= 1e-3
    assert record["hogwild_test_accuracy"] > 0.5  # it learned: one epoch of 1,000 examples
    assert record["settings"]["train_examples"] == 1000
    assert record["settings"]["example"]["threads"] == 1  # quick: torch on one thread
