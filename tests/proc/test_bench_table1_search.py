"""``bench/figures/table1_search.py``: its runs, its log and its resume, on a small slice of MNIST.

Two recipes (the default and ``epochs-x2``, the one that scales the length), one seed, one
screening epoch (two for ``epochs-x2``) on 500 training examples: real ``hogwild train`` runs.
Checks: one log line per run with the recipe, seed, length and its final accuracy (the metrics
file's last epoch); the summary's JSON line; a rerun runs nothing the log holds and only what it
lacks. Not the accuracy: the committed log is for that.
"""

from __future__ import annotations

import json
import sys

import pytest

from bench.figures import table1_search as search
from tests.bench_runs import run_bench, small_mnist

SCRIPT = "bench/figures/table1_search.py"
EXTRA = ["--train.subset=500", "--train.workers=2"]


def read(log):
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.slow
def test_the_search_logs_each_run_once_and_resumes(
    tmp_path, mnist_dir, tmp_path_factory, repo_root
):
    data = small_mnist(mnist_dir, tmp_path_factory)  # what a smoke run needs of MNIST
    log, out = tmp_path / "search.jsonl", tmp_path / "summary.json"
    command = [sys.executable, str(repo_root / SCRIPT), "--data", str(data), "--epochs", "1"]
    command += ["--log", str(log), "--out", str(out), "--metrics-dir", str(tmp_path / "runs")]
    first = run_bench([*command, "--recipes", "default", "epochs-x2", *EXTRA], out, timeout=300)

    runs = read(log)
    assert [(r["recipe"], r["seed"], r["epochs"]) for r in runs] == [
        ("default", 1, 1),
        ("epochs-x2", 1, 2),
    ]
    for run in runs:
        assert run["extra"] == EXTRA and run["command"].startswith("hogwild train ")
        assert f"--train.epochs={run['epochs']}" in run["command"]
        epochs = [json.loads(x) for x in open(run["metrics"]) if '"event": "epoch"' in x]
        assert len(epochs) == run["epochs"] == len(run["per_epoch"])
        # the log's figure is the metrics file's last epoch's; not that it learned: one epoch
        # of 500 examples at the default recipe's rate (0.003) ended at 0.0945 in a full run
        assert run["test_accuracy"] == epochs[-1]["test_accuracy"]
        assert 0.0 < run["test_accuracy"] <= 1.0
    summary = {(r["recipe"], r["epochs"]): r for r in first["summary"]}
    assert set(summary) == {("default", 1), ("epochs-x2", 2)}
    assert "vs_default" not in summary["epochs-x2", 2]  # no default run of that length

    page = tmp_path / "search.md"
    command += ["--markdown", str(page)]
    second = run_bench([*command, "--recipes", "epochs-x2", "sync", *EXTRA], out, timeout=300)
    again = read(log)
    assert again[:2] == runs  # epochs-x2 was in the log: not run again
    assert [(r["recipe"], r["epochs"]) for r in again[2:]] == [("sync", 1)]
    assert "--sync" in again[2]["command"].split()
    text = page.read_text()
    for run in again:  # a row per run, then one per recipe and length with what it tries
        assert f"| {run['recipe']} | {run['epochs']} | {run['seed']} | " in text
        why = search.recipes()[run["recipe"]].why
        assert text.count(f" | {why} |") == 1
    summary = {(r["recipe"], r["epochs"]): r for r in second["summary"]}
    assert summary["sync", 1]["vs_default"] == pytest.approx(
        again[2]["test_accuracy"] - runs[0]["test_accuracy"]
    )
