"""What ``hogwild cluster``'s driver writes for each epoch (:mod:`hogwild.cluster.records`).

Real parts throughout: the bundled job config, the paper's network with its seeded initial
weights, MNIST's real test images (the first 500), the metrics writer and the checkpoint writer;
the checkpoints are read back with the loader ``hogwild eval`` uses. The jobs in
``tests/cluster`` check the same records end to end, through every role.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hogwild.cluster.records import EVALUATING, EndedEpoch, EpochRecords, merge_histograms
from hogwild.cluster.status import LiveStatus
from hogwild.config import load_config
from hogwild.data.mnist import MnistData, load_mnist
from hogwild.model.network import build_network
from hogwild.progress import Progress
from hogwild.training import checkpoint as ckpt
from hogwild.training.health import TrainingDiverged
from hogwild.training.metrics import MetricsWriter
from hogwild.training.resume import starting_point

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels

N_TEST = 500


@pytest.fixture(scope="module")
def data(mnist_dir) -> MnistData:
    full = load_mnist(mnist_dir)
    return MnistData(
        full.train_images, full.train_labels, full.test_images[:N_TEST],
        full.test_labels[:N_TEST], full.source,
    )  # fmt: skip


def make_records(
    tmp_path: Path,
    data,
    *,
    between: bool,
    n_test: int = N_TEST,
    replace_old: bool = False,
    evaluate_every: int = 1,
):
    config = load_config().override(
        {"output.checkpoint_dir": str(tmp_path / "run"), "output.progress": False,
         "output.metrics": str(tmp_path / "metrics.jsonl"), "train.epochs": 5,
         "train.evaluate_every": evaluate_every}
    )  # fmt: skip
    network = build_network(config.model, 10)
    records = EpochRecords(
        config, network, data, n_test=n_test, n_classes=10, n_train=60000,
        metrics=MetricsWriter(config.output.metrics, overwrite=replace_old),
        progress=Progress(False, 1),
        live=LiveStatus(False), replace_old=replace_old, between=between, eval_threads=1,
    )  # fmt: skip
    params, velocity, _, _ = starting_point(config, network, 10, False, print)
    return records, params, velocity


def ended_epoch(epoch: int, params: np.ndarray, velocity: np.ndarray) -> EndedEpoch:
    record = {
        "event": "epoch", "epoch": epoch, "lr": 0.01, "examples": 1000 + epoch,
        "train_loss": 2.0, "train_s": 2.0, "examples_per_s": 1000.0, "data_wait_s": 0.5,
        "fetch_wait_s": 0.25, "updates_per_s": 10.0, "staleness": {"0": 3, "1": epoch},
    }  # fmt: skip
    # each epoch's own weights: the records must pair an epoch with its model
    return EndedEpoch(record, params * (1 + epoch), velocity.copy())


def lines(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("between", [True, False])
def test_each_epoch_is_written_in_order_with_its_test_figures_and_checkpoint(
    tmp_path, data, between
):
    records, params, velocity = make_records(tmp_path, data, between=between)
    try:
        for epoch in range(3):
            records.ended(ended_epoch(epoch, params, velocity))
            records.write()  # as the driver does once the next epoch has begun
            if between:  # the driver waited for it: written before the next epoch starts
                assert [r["epoch"] for r in records.history] == list(range(epoch + 1))
            else:  # beside training: never more than EVALUATING epochs behind
                assert len(records.history) >= epoch + 1 - EVALUATING
        final = records.final({"replicas": 2, "restarts": {}}, wall_start=0.0)
    finally:
        records.close()

    written = lines(tmp_path)
    assert [r["event"] for r in written] == ["epoch", "epoch", "epoch", "final"]
    assert [r["epoch"] for r in written[:3]] == [0, 1, 2]
    for record in written[:3]:
        assert 0.0 <= record["test_accuracy"] <= 1.0 and record["test_loss"] > 0
        assert record["eval_s"] > 0
    assert final == written[3]
    assert final["examples"] == 1000 + 1001 + 1002 and final["examples_per_s"] == 3003 / 6.0
    assert final["replicas"] == 2 and final["epochs"] == 5
    assert final["test_accuracy"] == written[2]["test_accuracy"]
    assert final["data_wait_s"] == 1.5 and final["fetch_wait_s"] == 0.75
    assert final["staleness"] == {"0": 3, "1": 2}  # the last epoch's

    # the last checkpoint holds the last epoch's weights, and the history of all three
    loaded = ckpt.load_checkpoint(tmp_path / "run")
    assert str(loaded.path) == final["checkpoint"] and loaded.epoch == 2
    assert [r["epoch"] for r in loaded.info["history"]] == [0, 1, 2]
    restored = np.zeros_like(params)
    ckpt.restore_parameters(records.network, restored, loaded.weights, loaded.path, "")
    np.testing.assert_array_equal(restored, params * 3)


@pytest.mark.parametrize("between", [True, False])
def test_evaluate_every_writes_the_skipped_epochs_without_test_figures(tmp_path, data, between):
    records, params, velocity = make_records(tmp_path, data, between=between, evaluate_every=2)
    try:
        for epoch in range(5):
            records.ended(ended_epoch(epoch, params, velocity))
            records.write()
        final = records.final({}, wall_start=0.0)
    finally:
        records.close()
    written = lines(tmp_path)
    assert [r["epoch"] for r in written[:5]] == [0, 1, 2, 3, 4]
    for record in written[:5]:
        if record["epoch"] in (1, 3, 4):  # every second epoch, and the last
            assert 0.0 <= record["test_accuracy"] <= 1.0 and record["eval_s"] > 0
            assert "evaluated" not in record
        else:
            assert record["evaluated"] is False
            assert record["test_accuracy"] is record["test_loss"] is record["eval_s"] is None
    assert final["test_accuracy"] == written[4]["test_accuracy"]
    # every epoch still has its checkpoint, the skipped ones' included
    assert ckpt.load_checkpoint(tmp_path / "run").epoch == 4
    assert [r.get("evaluated", True) for r in records.history] == [False, True, False, True, True]


def test_a_resumed_job_keeps_its_history_and_without_a_test_split_says_so(tmp_path, data):
    records, params, velocity = make_records(tmp_path, data, between=True, n_test=0)
    records.history.extend([{"event": "epoch", "epoch": 0, "test_accuracy": 0.9}])
    try:
        records.ended(ended_epoch(1, params, velocity))
        final = records.final({}, wall_start=0.0)
    finally:
        records.close()
    assert [r["epoch"] for r in records.history] == [0, 1]
    epoch = lines(tmp_path)[0]
    assert epoch["test_accuracy"] is None and epoch["eval_s"] is None
    assert final["test_accuracy"] is None and final["examples"] == 1001
    assert [r["epoch"] for r in ckpt.load_checkpoint(tmp_path / "run").info["history"]] == [0, 1]


def test_a_stopped_job_keeps_the_epochs_already_evaluated(tmp_path, data):
    records, params, velocity = make_records(tmp_path, data, between=True)
    try:
        records.ended(ended_epoch(0, params, velocity))
        records.stopped()
        assert [r["epoch"] for r in records.history] == [0]
        with pytest.raises(RuntimeError):  # nothing more is evaluated once stopped
            records.ended(ended_epoch(1, params, velocity))
    finally:
        records.close()
    assert [r["epoch"] for r in lines(tmp_path)] == [0]
    assert ckpt.load_checkpoint(tmp_path / "run").epoch == 0


def test_with_overwrite_the_old_checkpoints_go_before_the_first_new_one_is_written(tmp_path, data):
    records, params, velocity = make_records(tmp_path, data, between=True)
    try:
        for epoch in range(3):  # an earlier job's three checkpoints
            records.ended(ended_epoch(epoch, params, velocity))
        records.final({}, wall_start=0.0)
    finally:
        records.close()
    old = sorted(p.name for p in (tmp_path / "run").glob("epoch-*.json"))
    assert old == ["epoch-0001.json", "epoch-0002.json"]  # output.keep_checkpoints = 2
    records, params, velocity = make_records(tmp_path, data, between=True, replace_old=True)
    try:
        records.ended(ended_epoch(0, params, velocity))
        records.write()
    finally:
        records.close()
    assert [p.name for p in (tmp_path / "run").glob("epoch-*.json")] == ["epoch-0000.json"]
    assert ckpt.load_checkpoint(tmp_path / "run").info["history"] == records.history


def test_an_overflowed_model_stops_the_job_before_its_checkpoint_and_nothing_after_is_written(
    tmp_path, data
):
    """The servers' model after epoch 1 holds a NaN: the driver's records raise
    TrainingDiverged naming the epoch and the cluster's own settings, write a ``diverged``
    record after that epoch's line, keep epoch 0's checkpoint as the newest, and write nothing
    of epoch 2 (already evaluated: the driver waited for it) when the stopped job writes what it
    has."""
    records, params, velocity = make_records(tmp_path, data, between=True)  # each evaluated
    broken = params.copy()
    broken[7] = np.nan
    try:
        records.ended(ended_epoch(0, params, velocity))
        records.write(0)
        records.ended(EndedEpoch(ended_epoch(1, params, velocity).record, broken, velocity))
        records.ended(ended_epoch(2, broken, velocity))
        with pytest.raises(TrainingDiverged, match=r"after epoch 2 the weights hold NaN") as err:
            records.write(0)
        records.stopped()
    finally:
        records.close()
    said = str(err.value)
    assert "--cluster.replicas (now 2)" in said and "--train.workers" not in said
    assert [(r["event"], r.get("epoch")) for r in lines(tmp_path)] == [
        ("epoch", 0), ("epoch", 1), ("diverged", 1),
    ]  # fmt: skip
    loaded = ckpt.load_checkpoint(tmp_path / "run")
    restored = np.zeros_like(params)
    ckpt.restore_parameters(records.network, restored, loaded.weights, loaded.path, "")
    assert loaded.epoch == 0 and np.array_equal(restored, params)  # epoch 0's weights


def test_a_model_at_chance_is_warned_of_once_naming_the_replicas_counting_a_resumed_history(
    tmp_path, data, capfd
):
    """Epochs whose training loss sits at ln 10 with 10 % accuracy: once the job has trained
    AT_CHANCE_AFTER updates, a resumed job's epochs counted, one ``at_chance`` record and one
    warning on the cluster's log (stderr), whose hints name the replicas and not the
    single-node store; the job goes on and checkpoints."""
    records, params, velocity = make_records(tmp_path, data, between=True)
    capfd.readouterr()
    at_chance = {"train_loss": 2.3026, "train_accuracy": 0.1, "examples": 4000}
    try:
        records.history.extend([{"event": "epoch", "epoch": 0, "examples": 4000}])
        for epoch in (1, 2, 3):
            ended = ended_epoch(epoch, params, velocity)
            records.ended(EndedEpoch({**ended.record, **at_chance}, ended.params, velocity))
            records.write(0)
    finally:
        records.close()
    said = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]
    warned = [r for r in lines(tmp_path) if r["event"] == "at_chance"]
    assert [r["epoch"] for r in warned] == [2]  # 12,000 examples at batch 1, the resumed 4,000 in
    assert said == [f"hogwild cluster: WARNING: {warned[0]['message']}"]
    assert "epoch 3's training loss" in said[0] and "--cluster.replicas (now 2)" in said[0]
    assert "--train.parameters" not in said[0]
    assert ckpt.load_checkpoint(tmp_path / "run").epoch == 3


def test_histograms_add_up_and_a_missing_one_counts_nothing():
    merged = merge_histograms([{"0": 2, "3": 1}, None, {"3": 4, "7": np.int64(1)}, {}])
    assert merged == {"0": 2, "3": 5, "7": 1}
    assert all(type(v) is int for v in merged.values())
