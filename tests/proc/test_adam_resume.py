"""A resumed Adam job continues exactly as the unbroken one: its checkpoints keep every worker's
moments and step count (:mod:`hogwild.training.moments`), and ``--resume`` writes them back."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import hogwild
from hogwild.data.mnist import load_mnist
from hogwild.training.checkpoint import load_checkpoint, write_checkpoint

ADAM = {"optim.rule": "adam", "optim.lr": 0.001}
# the tests compare weights and moments: only the last epoch is evaluated
OPTIONS = {"subset": 300, "progress": False, "evaluate_every": 0, "overrides": ADAM}


@pytest.fixture(scope="module")
def mnist(mnist_dir):
    return load_mnist(mnist_dir)


def copy_epoch(source, destination, epoch: int) -> None:
    destination.mkdir()
    for path in source.glob(f"epoch-{epoch:04d}*"):
        shutil.copy(path, destination / path.name)


def test_a_resumed_adam_job_continues_exactly_as_the_unbroken_one(tmp_path, mnist, capsys):
    whole = tmp_path / "whole"
    unbroken = hogwild.train(data=mnist, epochs=2, workers=1, checkpoint_dir=whole, **OPTIONS)
    first = load_checkpoint(whole / "epoch-0000.json")
    assert first.optimizer_state["adam_step"].tolist() == [300.0]  # batch 1: a step an example
    assert np.abs(first.optimizer_state["fc1.weight.exp_avg_sq.worker0"]).max() > 0

    resumed_dir = tmp_path / "resumed"
    copy_epoch(whole, resumed_dir, 0)
    resumed = hogwild.train(
        data=mnist, epochs=2, workers=1, checkpoint_dir=resumed_dir, resume=True, **OPTIONS
    )
    assert resumed.metrics["epochs_run"] == 1
    for name, value in unbroken.weights.items():
        np.testing.assert_array_equal(resumed.weights[name], value, err_msg=name)
    last, again = load_checkpoint(whole), load_checkpoint(resumed_dir)
    assert last.optimizer_state.keys() == again.optimizer_state.keys()
    for key, value in last.optimizer_state.items():
        np.testing.assert_array_equal(again.optimizer_state[key], value, err_msg=key)

    # the control: the same checkpoint without its moments does not continue the same way
    bare_dir = tmp_path / "bare"
    momentum = {k: v for k, v in first.optimizer_state.items() if k.endswith(".momentum")}
    write_checkpoint(bare_dir, 0, first.weights, momentum, first.info)
    capsys.readouterr()
    bare = hogwild.train(
        data=mnist, epochs=2, workers=1, checkpoint_dir=bare_dir, resume=True,
        **{**OPTIONS, "progress": True},
    )  # fmt: skip
    assert "holds no Adam moments" in capsys.readouterr().err
    assert any(
        not np.array_equal(bare.weights[name], value) for name, value in unbroken.weights.items()
    )


def test_every_workers_moments_are_saved_and_resumed_by_another_count(tmp_path, mnist, capsys):
    ck = tmp_path / "ck"
    hogwild.train(data=mnist, epochs=1, workers=2, checkpoint_dir=ck, **OPTIONS)
    saved = load_checkpoint(ck).optimizer_state
    steps = saved["adam_step"]
    assert steps.shape == (2,) and steps.sum() == 300  # each worker counted its own shard
    assert not np.array_equal(saved["conv1.weight.exp_avg.worker0"],
                              saved["conv1.weight.exp_avg.worker1"])  # fmt: skip
    capsys.readouterr()
    result = hogwild.train(
        data=mnist, epochs=2, workers=1, checkpoint_dir=ck, resume=True,
        **{**OPTIONS, "progress": True},
    )  # fmt: skip
    assert result.metrics["epochs_run"] == 1
    assert "worker w continues from saved worker w % 2" in capsys.readouterr().err
    assert load_checkpoint(ck).optimizer_state["adam_step"].tolist() == [steps[0] + 300]
