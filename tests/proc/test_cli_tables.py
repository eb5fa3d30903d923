"""A tabular PyTorch model from a file, trained and evaluated through the command line:
``hogwild train --model FILE.py:build --data FILE.csv --target COLUMN`` takes its input shape
from the file's features, ``--loss mse`` makes it a regression, and ``hogwild eval`` gives the
held-back rows' accuracy, or mean squared and absolute errors, as training measured them.

``hogwild train`` runs as its own process (its workers are processes); ``hogwild eval``, which
starts none, and a ``train`` refused before any worker starts, run through the same entry inside the
test's process (:mod:`tests.cli_in_process`): as a process, each cost an interpreter start and
imports of PyTorch and hogwild, more than the evaluation of 80 rows."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.cli_in_process import hogwild_cli

torch = pytest.importorskip("torch")

REGRESSION_FILE = """
import torch.nn as nn


def build():
    return nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
"""

CLASSIFIER_FILE = """
import torch.nn as nn


def build():
    return nn.Sequential(nn.Linear(3, 12), nn.ReLU(), nn.Linear(12, 2))
"""

HOGWILD = [sys.executable, "-m", "hogwild.cli"]
TRAIN = ["--epochs", "4", "--workers", "1", "--batch", "4", "--lr", "0.01", "--no-progress",
         "--optim.rule=adam", "--optim.warmup_epochs=0", "--optim.weight_decay=0"]  # fmt: skip


def write_table(path, target: str, rows: int = 400) -> np.ndarray:
    """Columns f1, the target, f2, f3: ``y``, a linear map of the features, or ``kind``, its
    sign as a class index. Returns ``y``."""
    rng = np.random.default_rng(5)
    x = rng.normal(0.0, 1.0, (rows, 3))
    y = x[:, 0] - 0.5 * x[:, 1] + 0.25 * x[:, 2]
    values = y if target == "y" else (y > 0).astype(int)
    lines = [f"f1,{target},f2,f3"] + [
        f"{a:.5f},{t},{b:.5f},{c:.5f}" for (a, b, c), t in zip(x, values, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    return y


def run(*args, expect: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run([*HOGWILD, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == expect, done.stderr
    return done


def evaluate(capsys, *args, expect: int = 0) -> tuple[str, str]:
    """``hogwild eval ARGS`` in this process: its stdout and stderr, once it exited with
    ``expect``."""
    code, out, err = hogwild_cli(capsys, "eval", *args)
    assert code == expect, err
    return out, err


def final_record(metrics) -> dict:
    return [json.loads(line) for line in metrics.read_text().splitlines()][-1]


def test_a_regression_from_a_file_trains_on_a_csv_and_evaluates_as_trained(tmp_path, capsys):
    table, model = tmp_path / "table.csv", tmp_path / "net.py"
    targets = write_table(table, "y")
    model.write_text(REGRESSION_FILE)
    ck, metrics = tmp_path / "ck", tmp_path / "metrics.jsonl"
    run("train", "--model", f"{model}:build", "--loss", "mse", "--data", str(table), "--target",
        "y", "--checkpoint-dir", str(ck), "--metrics", str(metrics), *TRAIN)  # fmt: skip
    trained = final_record(metrics)
    assert trained["test_accuracy"] is None
    assert trained["config"]["model"]["input"] == [1, 1, 3]  # the file's three features
    assert trained["test_loss"] < np.var(targets) / 10  # it learned the linear map

    shown = json.loads(evaluate(capsys, ck, "--data", table, "--target", "y", "--json")[0])
    assert shown["examples"] == 80  # the 20 % training held back
    assert shown["test_mse"] == pytest.approx(trained["test_loss"], rel=1e-4)
    assert 0 < shown["test_mae"] <= np.sqrt(shown["test_mse"]) + 1e-12  # mean |e| <= rms e
    line, _ = evaluate(capsys, ck, "--data", table, "--target", "y")
    assert "test mse" in line and "test mae" in line and "on 80 examples" in line

    _, refused = evaluate(capsys, ck, expect=2)  # no targets to measure against
    assert "is a regression" in refused and "--target" in refused


def test_a_classifier_from_a_file_evaluates_to_the_accuracy_training_reported(tmp_path, capsys):
    table, model = tmp_path / "table.csv", tmp_path / "net.py"
    write_table(table, "kind")
    model.write_text(CLASSIFIER_FILE)
    ck, metrics = tmp_path / "ck", tmp_path / "metrics.jsonl"
    run("train", "--model", f"{model}:build", "--data", str(table), "--target", "kind",
        "--checkpoint-dir", str(ck), "--metrics", str(metrics), *TRAIN)  # fmt: skip
    trained = final_record(metrics)
    assert trained["test_accuracy"] > 0.8  # chance is a half
    shown = json.loads(evaluate(capsys, ck, "--data", table, "--target", "kind", "--json")[0])
    assert shown["examples"] == 80
    assert shown["test_accuracy"] == trained["test_accuracy"]
    assert shown["test_loss"] == pytest.approx(trained["test_loss"], rel=1e-4)


def test_loss_without_a_model_is_refused(tmp_path, capsys):
    """Refused before any process starts: through the same entry, in this process."""
    table = tmp_path / "table.csv"
    write_table(table, "y", rows=20)
    code, _, err = hogwild_cli(capsys, "train", "--loss", "mse", "--data", table, "--target", "y")
    assert code == 2
    assert "--loss goes with --model" in err
