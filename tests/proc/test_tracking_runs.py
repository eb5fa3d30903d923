"""Tracking a real training run: ``on_epoch_end``, TensorBoard's scalars, the compile notice and
the metrics file of an earlier run, with real worker processes on a slice of the real MNIST
files."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hogwild
import hogwild.training.trainer as trainer
from hogwild.data.mnist import load_mnist
from hogwild.training.metrics import read_metrics
from tests.bench_runs import small_mnist, small_slice
from tests.cli_in_process import hogwild_cli
from tests.unit.test_tracking import tensorboard_scalars

OPTIONS = {"workers": 2, "subset": 600, "progress": False}


@pytest.fixture(scope="module")
def mnist(mnist_dir):
    """A slice of MNIST: every run tests its model on the whole test set it is given, and these
    check what is recorded, not what is reached."""
    return small_slice(load_mnist(mnist_dir))


def test_epoch_callback_and_tensorboard_see_what_the_metrics_file_records(
    tmp_path, mnist, monkeypatch, capsys
):
    pytest.importorskip("tensorboardX", reason="the tensorboard extra")
    # As on a first run: no compile record, so the trainer compiles (numba loads its cache).
    monkeypatch.setattr(trainer, "compile_once", lambda what, compile: compile() or True)
    seen = []
    result = hogwild.train(
        data=mnist, epochs=2, metrics=tmp_path / "m.jsonl", tensorboard=tmp_path / "tb",
        on_epoch_end=seen.append, evaluate_every=2,  # epoch 0 goes without test figures
        overrides={"output.tensorboard_every": 20}, **OPTIONS,
    )  # fmt: skip
    assert trainer.COMPILING in capsys.readouterr().err
    epochs = [r for r in read_metrics(tmp_path / "m.jsonl") if r["event"] == "epoch"]
    assert seen == result.history == epochs
    assert [r["epoch"] for r in seen] == [0, 1]
    scalars = tensorboard_scalars(tmp_path / "tb")
    assert epochs[0]["evaluated"] is False and epochs[0]["test_accuracy"] is None
    assert scalars["epoch/test_accuracy"] == [(2, pytest.approx(epochs[1]["test_accuracy"]))]
    assert [step for step, _ in scalars["epoch/train_loss"]] == [1, 2]
    steps = [step for step, _ in scalars["train/loss"]]
    assert steps == sorted(set(steps)) and steps[-1] <= 2 * 600  # batch 1: a step an example


def test_an_exception_in_the_callback_stops_the_job(tmp_path, mnist):
    def stop(record):
        raise RuntimeError(f"enough after epoch {record['epoch']}")

    with pytest.raises(RuntimeError, match="enough after epoch 0"):
        hogwild.train(data=mnist, epochs=3, on_epoch_end=stop, **OPTIONS)
    # the autouse leak check: no worker, segment or socket left behind


def test_a_second_run_into_the_same_metrics_file_needs_resume_or_overwrite(
    tmp_path, mnist_dir, tmp_path_factory, capsys
):
    """The runs that train are processes, as a user's; the refused one stops before any
    process starts, and runs through the same entry in this process (tests/cli_in_process.py)."""
    metrics = tmp_path / "m.jsonl"
    data = small_mnist(mnist_dir, tmp_path_factory)
    command = [sys.executable, "-m", "hogwild.cli", "train", "--data", str(data),
               "--epochs", "1", "--subset", "600", "--workers", "2", "--no-progress",
               "--metrics", str(metrics)]  # fmt: skip
    first = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    before = metrics.read_text()
    code, _, err = hogwild_cli(capsys, *command[3:])  # without the interpreter and -m
    assert code == 2
    assert "already holds another run's records; pass --resume" in err
    assert metrics.read_text() == before
    replaced = subprocess.run(
        [*command, "--overwrite"], capture_output=True, text=True, timeout=300
    )
    assert replaced.returncode == 0, replaced.stderr
    records = read_metrics(metrics)
    assert [r["event"] for r in records] == ["start", "epoch", "final"]  # the new run alone
