"""End-to-end training with real worker processes on the real MNIST files.

Proves the acceptance example (two workers on a 5,000-example subset reach 95 % test accuracy),
that the metrics file and checkpoints hold what the README promises, that a checkpoint loads into
the equivalent ``torch.nn`` model with ``load_state_dict`` and predicts the same, that ``--resume``
continues where the last checkpoint left off (with epochs ``train.evaluate_every`` left without
test figures), and that ``--sync`` trains with one worker.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import hogwild
from bench.support.paper_job import PAPER_OVERRIDES  # Adam's model on the old schedule: learns fast
from hogwild.data.mnist import load_mnist
from hogwild.training.checkpoint import latest_checkpoint
from hogwild.training.metrics import read_metrics
from tests.bench_runs import small_slice

FINAL_KEYS = {
    "connections",
    "examples_per_s",
    "connections_per_s",
    "train_loss",
    "test_accuracy",
    "workers",
    "epochs",
    "wall_s",
}


@pytest.fixture(scope="module")
def mnist(mnist_dir):
    return load_mnist(mnist_dir)


@pytest.fixture(scope="module")
def small(mnist):
    """A slice of it for the runs that check what training does, not what it reaches: every run
    tests its model on the whole test set it is given."""
    return small_slice(mnist)


# The tests of one trained run: on one worker under ``pytest -n 2``, so the run is made once.
ON_THE_TRAINED_RUN = pytest.mark.xdist_group("test_training.trained")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, mnist):
    """Two workers, 5,000 examples, four epochs, with checkpoints and metrics. The tests look at
    the last epoch's figures only: the first three go without an evaluation."""
    out = tmp_path_factory.mktemp("trained")
    result = hogwild.train(
        data=mnist,
        workers=2,
        epochs=4,
        subset=5000,
        evaluate_every=0,
        checkpoint_dir=out / "ckpt",
        metrics=out / "metrics.jsonl",
        progress=False,
        overrides=PAPER_OVERRIDES,  # no dropout: the torch model below is the paper's
    )
    return result, out


@ON_THE_TRAINED_RUN
def test_two_workers_on_5000_examples_reach_95_percent(trained):
    result, _ = trained
    assert result.metrics["workers"] == 2
    assert result.metrics["test_accuracy"] >= 0.95


@ON_THE_TRAINED_RUN
def test_metrics_file_has_epochs_and_final_figures(trained):
    _, out = trained
    records = read_metrics(out / "metrics.jsonl")
    events = [r["event"] for r in records]
    assert events == ["start", "epoch", "epoch", "epoch", "epoch", "final"]
    final = records[-1]
    assert FINAL_KEYS <= set(final)
    assert final["connections"] == 756_000
    assert 0.0 <= final["test_accuracy"] <= 1.0
    assert final["connections_per_s"] == pytest.approx(final["examples_per_s"] * 756_000)
    assert final["config"]["train"]["workers"] == 2
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1, 2, 3]
    assert all(r["examples"] == 5000 for r in epochs)
    assert [r.get("evaluated", True) for r in epochs] == [False, False, False, True]
    assert final["test_accuracy"] == epochs[3]["test_accuracy"]


@ON_THE_TRAINED_RUN
def test_checkpoint_predicts_like_the_equivalent_torch_model(trained, mnist):
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    _, out = trained
    sidecar = latest_checkpoint(out / "ckpt")
    assert sidecar is not None and sidecar.name == "epoch-0003.json"
    info = json.loads(sidecar.read_text())["info"]
    assert info["epoch"] == 3 and info["config"]["train"]["subset"] == 5000

    class AdamMnist(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(1, 10, 5)
            self.conv2 = torch.nn.Conv2d(10, 20, 5)
            self.fc1 = torch.nn.Linear(320, 400)
            self.fc2 = torch.nn.Linear(400, 400)
            self.fc3 = torch.nn.Linear(400, 10)

        def forward(self, x):
            f = torch.nn.functional
            x = f.max_pool2d(f.relu(self.conv1(x)), 2)
            x = f.max_pool2d(f.relu(self.conv2(x)), 2)
            x = f.relu(self.fc1(x.flatten(1)))
            x = f.relu(self.fc2(x))
            return self.fc3(x)

    model = AdamMnist()
    state = safetensors_torch.load_file(str(sidecar.with_suffix(".safetensors")))
    model.load_state_dict(state)  # strict: the names and shapes must match exactly
    images = mnist.test_images[:2000]
    x = torch.from_numpy((images.astype(np.float32) / 255.0 - 0.1307) / 0.3081).unsqueeze(1)
    with torch.no_grad():
        torch_labels = model(x).argmax(1).numpy()
    ours = hogwild.load_checkpoint(out / "ckpt").predict(images)
    assert (ours == torch_labels).mean() >= 0.999  # float32 rounding may flip a near-tie
    assert (ours == mnist.test_labels[:2000]).mean() >= 0.95


@ON_THE_TRAINED_RUN
def test_evaluate_matches_the_training_run(trained, mnist):
    result, out = trained
    evaluation = hogwild.evaluate(out / "ckpt", data=mnist)
    assert evaluation["examples"] == 10_000
    assert evaluation["test_accuracy"] == pytest.approx(result.metrics["test_accuracy"], abs=1e-4)


def test_resume_continues_after_the_last_checkpoint(tmp_path, small):
    """With ``evaluate_every=2`` (one run for both): epoch 0 of three goes without test figures,
    in the history, the metrics file and the checkpoint, epoch 1 (the second) and epoch 2 (the
    last) are evaluated; the resumed run keeps that history and continues after epoch 2."""
    options = dict(data=small, workers=2, subset=1000, progress=False, evaluate_every=2)
    first = hogwild.train(
        epochs=3, checkpoint_dir=tmp_path / "ck", metrics=tmp_path / "first.jsonl", **options
    )
    assert first.metrics["epochs_run"] == 3
    rows = [r for r in read_metrics(tmp_path / "first.jsonl") if r["event"] == "epoch"]
    assert first.history == rows
    assert [r.get("evaluated", True) for r in rows] == [False, True, True]
    assert rows[0]["test_accuracy"] is None and rows[0]["test_loss"] is None
    assert rows[0]["train_loss"] > 0 and rows[0]["examples"] == 1000
    for row in rows[1:]:
        assert 0.0 < row["test_accuracy"] <= 1.0 and row["test_loss"] > 0
    assert first.metrics["test_accuracy"] == rows[2]["test_accuracy"]
    saved = hogwild.load_checkpoint(tmp_path / "ck").checkpoint.info
    assert saved["history"][0]["evaluated"] is False

    resumed = hogwild.train(
        epochs=4,
        checkpoint_dir=tmp_path / "ck",
        metrics=tmp_path / "m.jsonl",
        resume=True,
        **options,
    )
    assert resumed.metrics["epochs_run"] == 1
    assert [h["epoch"] for h in resumed.history] == [0, 1, 2, 3]
    assert [h.get("evaluated", True) for h in resumed.history] == [False, True, True, True]
    epochs = [r["epoch"] for r in read_metrics(tmp_path / "m.jsonl") if r["event"] == "epoch"]
    assert epochs == [3]
    assert resumed.metrics["test_accuracy"] == resumed.history[3]["test_accuracy"] is not None
    assert latest_checkpoint(tmp_path / "ck").name == "epoch-0003.json"


def test_sync_trains_with_one_worker(small):
    result = hogwild.train(data=small, sync=True, workers=2, epochs=1, subset=500, progress=False)
    assert result.metrics["workers"] == 1
    assert result.metrics["sync"] is True
    assert result.history[0]["examples"] == 500


def test_epoch_fraction_closes_the_epoch_early(small):
    result = hogwild.train(
        data=small,
        workers=2,
        epochs=1,
        subset=4000,
        epoch_fraction=0.5,
        progress=False,
        overrides={"train.chunk": 16},
    )
    examples = result.history[0]["examples"]
    # One worker finishing its 2,000 closes the epoch; the other stops within one chunk.
    assert 2000 <= examples <= 4000


def test_a_chunk_boundary_never_cuts_a_minibatch(small, tmp_path):
    """Minibatches of 100 with chunks of 256 were trained as 100, 100, 56; 500 as 256."""

    def weights(batch: int, chunk: int) -> np.ndarray:
        directory = tmp_path / f"b{batch}-c{chunk}"
        hogwild.train(
            data=small,
            sync=True,  # one worker: the same examples in the same order, deterministic
            epochs=1,
            subset=1000,
            batch=batch,
            lr=0.05,
            checkpoint_dir=directory,
            progress=False,
            overrides={"train.chunk": chunk},
        )
        return hogwild.load_checkpoint(directory).params

    for batch in (100, 500):
        np.testing.assert_array_equal(weights(batch, 256), weights(batch, 1000))


def test_epoch_fraction_ends_the_epoch_without_the_straggler(small, tmp_path):
    """Worker 1 is stopped; worker 0 finishing its half closes the epoch for both."""
    import os
    import threading
    import time

    import psutil

    metrics = tmp_path / "m.jsonl"
    done = threading.Event()

    def straggle():
        deadline = time.monotonic() + 120
        while not (metrics.exists() and '"start"' in metrics.read_text()):
            if done.is_set() or time.monotonic() > deadline:
                return
            time.sleep(0.02)
        worker = next(
            p
            for p in psutil.Process(os.getpid()).children(recursive=True)
            if p.name() == "hogwild-w1"
        )
        time.sleep(0.2)
        worker.suspend()
        done.wait(4.0)  # worker 0 trains its 4,000 examples meanwhile
        worker.resume()

    thread = threading.Thread(target=straggle)
    thread.start()
    try:
        result = hogwild.train(
            data=small,
            workers=2,
            epochs=1,
            subset=8000,
            epoch_fraction=0.5,
            metrics=metrics,
            progress=False,
            overrides={"train.chunk": 16},
        )
    finally:
        done.set()
        thread.join()
    examples = result.history[0]["examples"]
    assert 4000 <= examples < 7000  # without the early close: all 8,000


def test_a_subset_is_a_seeded_random_choice_not_the_first_records(mnist):
    from hogwild.data.mnist import MnistData
    from hogwild.training.trainer import Trainer

    by_class = np.argsort(mnist.train_labels, kind="stable")  # a class-folder cache's order
    sorted_data = MnistData(
        mnist.train_images[by_class],
        mnist.train_labels[by_class],
        mnist.test_images,
        mnist.test_labels,
        mnist.source,
    )
    config = hogwild.load_config(
        overrides={"train.subset": 1000, "train.workers": 1, "output.progress": False}
    )
    trainer = Trainer(config, sorted_data)
    try:
        trainer.plan_store({})
        trainer._prepare_arena()
        counts = np.bincount(trainer.arena.array("train_labels"), minlength=10)
        assert counts.sum() == 1000 and counts.min() >= 50  # every class, not just 0s
        again = Trainer(config, sorted_data)
        np.testing.assert_array_equal(again.subset, trainer.subset)  # seeded
    finally:
        trainer._shutdown()
