"""Tracking a run: the metrics file is one run's, ``hogwild plot`` draws runs, TensorBoard's
scalars land where and when they should. (A real training run writing them:
tests/proc/test_tracking_runs.py.)"""

from __future__ import annotations

import json
import struct
import sys

import pytest

import hogwild.cli as cli
from hogwild.errors import CheckpointError, DataError, HogwildError
from hogwild.training.curves import plot_runs, read_curve
from hogwild.training.metrics import MetricsWriter, read_metrics
from hogwild.training.tensorboard import TensorBoardLog

PNG = b"\x89PNG\r\n\x1a\n"


def write_run(path, accuracies, seconds_per_epoch=2.0):
    writer = MetricsWriter(path)
    writer.write({"event": "start", "config": {}})
    for epoch, accuracy in enumerate(accuracies):
        writer.write({
            "event": "epoch", "epoch": epoch, "train_s": seconds_per_epoch,
            "train_loss": 1.0 / (epoch + 1), "test_loss": 1.2 / (epoch + 1),
            "test_accuracy": accuracy,
        })  # fmt: skip
    writer.write({"event": "final", "test_accuracy": accuracies[-1]})


def test_a_new_run_refuses_an_earlier_runs_metrics_file(tmp_path):
    path = tmp_path / "m.jsonl"
    write_run(path, [0.9])
    with pytest.raises(CheckpointError, match="already holds another run's records; pass --res"):
        MetricsWriter(path)
    with pytest.raises(CheckpointError, match="is a directory"):
        MetricsWriter(tmp_path)
    (tmp_path / "empty.jsonl").touch()
    MetricsWriter(tmp_path / "empty.jsonl").write({"event": "start"})  # nothing to lose


def test_resume_appends_and_overwrite_replaces_at_the_first_line(tmp_path):
    path = tmp_path / "m.jsonl"
    write_run(path, [0.9])
    before = len(read_metrics(path))
    MetricsWriter(path, resume=True).write({"event": "epoch", "epoch": 1})
    assert len(read_metrics(path)) == before + 1
    replacing = MetricsWriter(path, overwrite=True)
    assert len(read_metrics(path)) == before + 1  # kept until the new run writes
    replacing.write({"event": "start", "new": True})
    replacing.write({"event": "epoch", "epoch": 0})
    assert read_metrics(path) == [{"event": "start", "new": True}, {"event": "epoch", "epoch": 0}]


def test_a_curve_reads_epochs_and_sums_training_seconds(tmp_path):
    write_run(tmp_path / "metrics.jsonl", [0.5, 0.8, 0.9], seconds_per_epoch=1.5)
    curve = read_curve(tmp_path)  # a run directory stands for its metrics.jsonl
    assert curve.epochs == [1, 2, 3]
    assert curve.seconds == [1.5, 3.0, 4.5]
    assert curve.test_accuracy == pytest.approx([50.0, 80.0, 90.0])


def test_plot_draws_several_runs_into_one_image(tmp_path, capsys):
    write_run(tmp_path / "a.jsonl", [0.5, 0.8])
    (tmp_path / "b").mkdir()
    write_run(tmp_path / "b" / "metrics.jsonl", [0.6, 0.7, 0.95])
    out = tmp_path / "curves.png"
    assert cli._dispatch(["plot", str(tmp_path / "a.jsonl"), str(tmp_path / "b"), "--out",
                          str(out)]) == 0  # fmt: skip
    assert out.read_bytes().startswith(PNG)
    width, height = struct.unpack(">II", out.read_bytes()[16:24])
    assert width > 800 and height > 600
    assert f"wrote {out}" in capsys.readouterr().out


def test_plot_names_a_run_without_metrics(tmp_path):
    with pytest.raises(DataError, match="no metrics file"):
        plot_runs([tmp_path / "missing"], tmp_path / "x.png")
    (tmp_path / "bad.jsonl").write_text("not json\n")
    with pytest.raises(DataError, match="not a metrics file"):
        plot_runs([tmp_path / "bad.jsonl"], tmp_path / "x.png")
    (tmp_path / "started.jsonl").write_text(json.dumps({"event": "start"}) + "\n")
    with pytest.raises(DataError, match="no epoch recorded yet"):
        plot_runs([tmp_path / "started.jsonl"], tmp_path / "x.png")


def test_plot_without_matplotlib_says_what_to_install(tmp_path, monkeypatch):
    write_run(tmp_path / "a.jsonl", [0.5])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it fails
    with pytest.raises(HogwildError, match=r"needs matplotlib: pip install 'hogwild\[bench\]'"):
        plot_runs([tmp_path / "a.jsonl"], tmp_path / "x.png")


def tensorboard_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under ``directory``: tag -> [(step, value)]."""
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(directory.rglob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):  # TFRecord: length, its crc, the record, its crc
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_tensorboard_writes_epochs_and_steps_at_their_steps(tmp_path):
    pytest.importorskip("tensorboardX", reason="the tensorboard extra")
    log = TensorBoardLog(str(tmp_path / "tb"), every=10, batch=4)  # a point per 40 examples
    log.training(30, 2.0, 100.0)  # not yet
    log.training(45, 1.5, 110.0)  # step 11
    log.training(50, 1.4, 120.0)  # same interval: no point
    log.training(170, 1.0, 130.0)  # step 42
    log.epoch({"epoch": 0, "train_loss": 1.1, "test_accuracy": 0.9, "lr": 0.01,
               "test_loss": None})  # fmt: skip
    log.close()
    scalars = tensorboard_scalars(tmp_path / "tb")
    assert scalars["train/loss"] == [(11, 1.5), (42, 1.0)]
    assert [s for s, _ in scalars["train/examples_per_s"]] == [11, 42]
    assert scalars["epoch/train_loss"] == [(1, pytest.approx(1.1))]
    assert scalars["epoch/test_accuracy"] == [(1, pytest.approx(0.9))]
    assert "epoch/test_loss" not in scalars  # no test split: nothing, not a zero


def test_no_directory_writes_nothing(tmp_path):
    log = TensorBoardLog("", every=1, batch=1)
    log.training(100, 1.0, 1.0)
    log.epoch({"epoch": 0, "train_loss": 1.0})
    log.close()
    assert not list(tmp_path.iterdir())


def test_the_metrics_listeners_see_every_record_and_tensorboard_takes_the_epochs(tmp_path):
    pytest.importorskip("tensorboardX", reason="the tensorboard extra")
    log = TensorBoardLog(str(tmp_path / "tb"), every=1, batch=1)
    seen = []
    writer = MetricsWriter(None, listeners=(seen.append, log.record))  # no file: listeners only
    records = [{"event": "start"}, {"event": "epoch", "epoch": 0, "test_accuracy": 0.5},
               {"event": "final", "test_accuracy": 0.5}]  # fmt: skip
    for record in records:
        writer.write(record)
    log.close()
    assert seen == records
    assert tensorboard_scalars(tmp_path / "tb") == {"epoch/test_accuracy": [(1, 0.5)]}
