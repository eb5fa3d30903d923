"""Runs and their checkpoint directories: refused, overwritten, resumed.

A fresh run into a directory holding another run's checkpoints is refused (it would mix the two
runs) unless ``--overwrite`` replaces them or ``--resume`` continues them; a resume restores the
weights *and* the momentum exactly, into every copy the store keeps, refuses another architecture
naming the difference, and reports the other settings that changed. A run whose loss overflows
stops at that epoch's end with an error, before its weights replace anything written; one that
stays at chance is warned of, once.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import hogwild
from hogwild.data.mnist import load_mnist
from hogwild.errors import CheckpointError
from hogwild.training.checkpoint import load_checkpoint
from hogwild.training.health import TrainingDiverged
from hogwild.training.trainer import Trainer


@pytest.fixture(scope="module")
def mnist(mnist_dir):
    return load_mnist(mnist_dir)


OPTIONS = {"workers": 2, "subset": 600, "progress": False}


def sidecars(directory):
    return sorted(p.name for p in directory.glob("epoch-*.json"))


def test_a_fresh_run_into_a_used_directory_is_refused_and_overwrite_replaces_it(
    tmp_path, mnist, mnist_dir
):
    ck = tmp_path / "ck"
    hogwild.train(data=mnist, epochs=2, checkpoint_dir=ck, evaluate_every=0, **OPTIONS)
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    with pytest.raises(CheckpointError, match="already holds checkpoints of another run"):
        hogwild.train(data=mnist, epochs=1, checkpoint_dir=ck, **OPTIONS)
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before  # nothing lost
    out = subprocess.run(
        [sys.executable, "-m", "hogwild.cli", "train", "--data", str(mnist_dir), "--epochs",
         "1", "--subset", "300", "--checkpoint-dir", str(ck), "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "--resume" in out.stderr and "--overwrite" in out.stderr
    hogwild.train(data=mnist, epochs=1, checkpoint_dir=ck, overwrite=True, **OPTIONS)
    assert sidecars(ck) == ["epoch-0000.json"]  # the old run's epoch 1 is gone
    assert load_checkpoint(ck).info["config"]["train"]["epochs"] == 1


def test_resume_restores_weights_and_momentum_into_every_copy(tmp_path, mnist):
    ck = tmp_path / "ck"
    overrides = {"optim.rule": "momentum"}
    hogwild.train(data=mnist, epochs=1, checkpoint_dir=ck, overrides=overrides, **OPTIONS)
    saved = load_checkpoint(ck)
    assert any(np.abs(v).max() > 0 for v in saved.optimizer_state.values())
    config = hogwild.load_config(
        overrides={**overrides, "train.workers": 2, "train.subset": 600, "train.epochs": 2,
                   "output.checkpoint_dir": str(ck), "output.progress": False}
    )  # fmt: skip
    trainer = Trainer(config, mnist, resume=True)
    try:
        trainer.plan_store({})
        start_epoch, _ = trainer._prepare_arena()
        assert start_epoch == 1
        params, velocity = trainer.store.snapshot()
        views, momentum = trainer.network.views(params), trainer.network.views(velocity)
        for name, tensor in saved.weights.items():
            np.testing.assert_array_equal(views[name], tensor)
            np.testing.assert_array_equal(momentum[name], saved.optimizer_state[f"{name}.momentum"])
        for copy in trainer.store.copies[:2]:  # the workers' copies: parameters and velocity
            for row in copy:
                np.testing.assert_array_equal(row, copy[0])
        np.testing.assert_array_equal(trainer.store.copies[0][0], params)
        np.testing.assert_array_equal(trainer.store.copies[1][0], velocity)
    finally:
        trainer._shutdown()


def test_resume_refuses_another_architecture_and_reports_other_changes(tmp_path, mnist, capsys):
    ck = tmp_path / "ck"
    hogwild.train(data=mnist, epochs=1, checkpoint_dir=ck, **OPTIONS)
    with pytest.raises(
        CheckpointError, match=r"model.layers\[7\].units is 400, the config's is 300"
    ):
        hogwild.train(
            data=mnist, epochs=2, checkpoint_dir=ck, resume=True,
            overrides={"model.layers.7.units": 300}, **OPTIONS,
        )  # fmt: skip
    result = hogwild.train(
        data=mnist, epochs=2, checkpoint_dir=ck, resume=True, lr=0.002,
        **{**OPTIONS, "progress": True},
    )  # fmt: skip
    assert result.metrics["epochs_run"] == 1
    err = capsys.readouterr().err
    assert "resuming with changed settings" in err
    assert "optim.lr: 0.006 -> 0.002" in err and "train.epochs: 1 -> 2" in err
    assert json.loads(json.dumps(result.metrics["config"]))["optim"]["lr"] == 0.002


def test_a_run_whose_loss_overflows_stops_before_saving_and_the_old_run_is_kept(tmp_path, mnist):
    ck = tmp_path / "ck"
    hogwild.train(data=mnist, epochs=1, checkpoint_dir=ck, evaluate_every=0, **OPTIONS)
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    metrics = tmp_path / "metrics.jsonl"
    overflowing = {"optim.weight_decay": 0.0, "output.metrics": str(metrics)}
    said = r"after epoch 1 the weights hold NaN.*lower --optim.lr \(now 1e\+30\).*The run stopped"
    with pytest.raises(TrainingDiverged, match=said + "; the checkpoints written before it are"):
        hogwild.train(data=mnist, epochs=3, checkpoint_dir=ck, overwrite=True, lr=1e30,
                      overrides=overflowing, **OPTIONS)  # fmt: skip
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before  # overflowed weights unsaved
    events = [json.loads(line)["event"] for line in metrics.read_text().splitlines()]
    assert events == ["start", "epoch", "diverged"]  # no second epoch trained from them


def test_a_run_at_chance_is_warned_of_once_after_enough_updates(tmp_path, mnist, capsys):
    metrics = tmp_path / "metrics.jsonl"
    options = {**OPTIONS, "subset": 5000, "overrides": {"output.metrics": str(metrics)}}
    hogwild.train(data=mnist, epochs=3, evaluate_every=0, lr=1e-12, **options)  # below rounding
    events = [json.loads(line) for line in metrics.read_text().splitlines()]
    # 5,000 updates after epoch 1: not judged yet; 10,000 after epoch 2: warned; then not again
    assert [e["event"] for e in events] == ["start", "epoch", "epoch", "at_chance", "epoch",
                                            "final"]  # fmt: skip
    assert events[3]["epoch"] == 1
    said = capsys.readouterr().err
    assert said.count("is at chance (ln 10 = 2.3026)") == 1, said
    assert "hogwild train: WARNING: epoch 2's training loss" in said
    assert "unless the learning rate is meant to be tiny" in said  # what killed it, if not that
    assert "--train.parameters=shared (now 'replicate')" in said
