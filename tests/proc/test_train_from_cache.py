"""Training from an LMDB image cache and with augmentation, with real worker processes.

Real MNIST (the shared idx files) is ingested into a cache once; two workers train on a
3,000-example subset for two epochs from it with small random translations and must reach 90 %
test accuracy, reporting the seconds their compute loops waited for the prefetching feed
(``data_wait_s``), which must stay small beside the training time; the checkpoint evaluated in
this process from the cache gives the workers' figure. The same runs from the idx files with
augmentation (the arena's examples read through an ``ArrayReader``, under forkserver), and
without it (the zero-copy arena path, which waits for nothing). An epoch closed early cancels a
feed's read-ahead and the next epoch still trains. A model whose input does not match the cache
is a one-line ConfigError through the CLI (refused before any process starts, it runs through the
command line's entry in this process, as ``hogwild data info`` does), and a folder of real JPEG
and PNG files (two of them corrupt) is ingested and trained end to end through ``hogwild data
ingest`` and ``hogwild train --data CACHE``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

import hogwild
from bench.support.paper_job import PAPER_OVERRIDES  # Adam's model on the old schedule: learns fast
from hogwild.config import load_config
from hogwild.data.ingest import ingest
from hogwild.data.mnist import load_mnist
from hogwild.data.plan import CacheData, load_data
from hogwild.errors import ConfigError
from hogwild.training.metrics import read_metrics
from hogwild.training.trainer import Trainer
from tests.cli_in_process import hogwild_cli as hogwild_here

SMALL_SHIFTS = "translate=0.05"  # up to 1.4 pixels on MNIST's 28
SUBSET = 6000


def run_cli(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hogwild.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def mnist_cache(tmp_path_factory, mnist_dir) -> Path:
    out = tmp_path_factory.mktemp("cache") / "mnist"
    report = ingest(mnist_dir, out, progress=False)
    assert report.written == {"train": 60000, "test": 10000}
    return out


@pytest.fixture(scope="module")
def mnist(mnist_dir):
    return load_mnist(mnist_dir)


def _check_waits(result, records) -> None:
    """``data_wait_s`` in every epoch record, summed in the final one, small beside training."""
    epochs = [r for r in records if r["event"] == "epoch"]
    final = records[-1]
    assert all(r["data_wait_s"] >= 0.0 for r in epochs)
    assert final["data_wait_s"] == pytest.approx(sum(r["data_wait_s"] for r in epochs))
    assert result.metrics["data_wait_s"] < 0.5 * result.metrics["train_s"]


def test_two_workers_train_from_the_cache_with_augmentation(mnist_cache, tmp_path):
    data = load_data(load_config(), str(mnist_cache))
    assert isinstance(data, CacheData) and (data.n_train, data.n_test) == (60000, 10000)
    # The parent read only the manifest: no LMDB environment of the cache stays open in it.
    assert not [f for f in psutil.Process().open_files() if f.path.endswith("data.mdb")]
    result = hogwild.train(
        data=mnist_cache,
        workers=2,
        epochs=2,
        subset=SUBSET,
        evaluate_every=0,  # the final figures only
        metrics=tmp_path / "metrics.jsonl",
        checkpoint_dir=tmp_path / "ck",
        progress=False,
        # 2 MiB: each worker holds its first 1,297 records in RAM, reads the rest from LMDB.
        overrides={**PAPER_OVERRIDES, "data.augment": SMALL_SHIFTS, "data.ram_budget_mb": 2},
    )
    # 6,000 examples, not 3,000: on 3,000 two asynchronous workers landed at 0.922-0.942 on a
    # quiet machine and once at 0.8995 in the suite; on 6,000 at 0.945-0.969, far from the floor.
    assert result.metrics["test_accuracy"] >= 0.9
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["event"] for r in records] == ["start", "epoch", "epoch", "final"]
    assert all(r["examples"] == SUBSET for r in records if r["event"] == "epoch")
    assert records[0]["config"]["data"]["augment"] == SMALL_SHIFTS
    _check_waits(result, records)
    # In this process, through a feed of the cache's test split: the workers' figure.
    evaluation = hogwild.evaluate(tmp_path / "ck", data=mnist_cache)
    assert evaluation["examples"] == 10000
    assert evaluation["test_accuracy"] == pytest.approx(result.metrics["test_accuracy"], abs=1e-4)


def test_a_cache_job_keeps_no_examples_in_the_arena(mnist_cache):
    config = load_config(
        overrides={
            "train.subset": 1000,
            "output.progress": False,
            "train.parameters": "shared",
            "train.workers": 2,
        }
    )
    trainer = Trainer(config, CacheData.from_manifest(mnist_cache))
    try:
        trainer.plan_store({})
        trainer._prepare_arena()
        assert set(trainer.arena.layout.regions) == {
            "params", "velocity", "control", "stats", "order",
        }  # fmt: skip
        assert trainer.arena.layout.regions["order"].shape == (1000,)
    finally:
        trainer._shutdown()


def test_idx_files_with_augmentation_under_forkserver(mnist, tmp_path):
    result = hogwild.train(
        data=mnist,
        workers=2,
        epochs=2,
        subset=3000,
        evaluate_every=0,  # the final figures only
        metrics=tmp_path / "metrics.jsonl",
        progress=False,
        overrides={
            **PAPER_OVERRIDES,
            "data.augment": SMALL_SHIFTS,
            "train.start_method": "forkserver",
        },
    )
    assert result.metrics["test_accuracy"] >= 0.9
    _check_waits(result, read_metrics(tmp_path / "metrics.jsonl"))
    assert result.metrics["data_wait_s"] > 0.0  # a feed: the first batch is always waited for


def test_the_arena_path_waits_for_nothing(mnist):
    result = hogwild.train(data=mnist, workers=1, epochs=1, subset=500, progress=False)
    assert result.history[0]["data_wait_s"] == 0.0 and result.metrics["data_wait_s"] == 0.0


def test_an_epoch_closed_early_cancels_the_read_ahead(mnist_cache):
    result = hogwild.train(
        data=mnist_cache, workers=2, epochs=2, subset=4000, epoch_fraction=0.5, progress=False,
        overrides={"train.chunk": 16, "data.augment": "mnist"},
    )  # fmt: skip
    for record in result.history:  # the straggler stops within one batch, in both epochs
        assert 2000 <= record["examples"] <= 4000
        assert record["test_accuracy"] is not None


def test_model_input_that_does_not_match_the_cache_is_one_clear_line(mnist_cache, capsys):
    # refused before any process starts: through the command line's entry, in this process
    code, _, err = hogwild_here(
        capsys, "train", "--data", mnist_cache, "--model.input=[3, 32, 32]", "--epochs", "1",
        "--no-progress",
    )  # fmt: skip
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "[3, 32, 32]" in lines[0] and "[1, 28, 28]" in lines[0] and str(mnist_cache) in lines[0]
    with pytest.raises(ConfigError, match=r"data\.augment = 'crop=40'.*larger than the image"):
        hogwild.train(data=mnist_cache, progress=False, overrides={"data.augment": "crop=40"})


def _write_image_folder(root: Path) -> None:
    """3 classes x 20 images of 32x32 RGB, PNG and JPEG, with class-dependent stripes; and two
    corrupt files."""
    rng = np.random.default_rng(0)
    for label, name in enumerate(("horizontal", "vertical", "checks")):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(20):
            image = rng.integers(0, 60, (32, 32, 3), dtype=np.uint8)
            rows, cols = np.indices((32, 32))
            stripes = [rows % 8 < 4, cols % 8 < 4, (rows // 4 + cols // 4) % 2 == 0][label]
            image[stripes] += np.uint8(150)
            suffix = ".png" if i % 2 else ".jpg"
            Image.fromarray(image).save(folder / f"{i:02d}{suffix}")
    whole = (root / "horizontal" / "00.jpg").read_bytes()
    (root / "horizontal" / "truncated.jpg").write_bytes(whole[: len(whole) // 3])
    (root / "vertical" / "garbage.png").write_bytes(b"this is not a PNG file" * 8)


SMALL_RGB_MODEL = """
[model]
input = [3, 32, 32]

[[model.layers]]
type = "conv"
maps = 4
kernel = 5

[[model.layers]]
type = "relu"

[[model.layers]]
type = "maxpool"
size = 2

[[model.layers]]
type = "fc"
units = 16

[[model.layers]]
type = "relu"

[[model.layers]]
type = "fc"
units = 3

[[model.layers]]
type = "softmax"

[data]
mean = 0.4
std = 0.3
augment = "translate=0.1,hflip"

[train]
epochs = 1
workers = 2
chunk = 16
"""


def test_image_folder_ingests_and_trains_end_to_end(tmp_path, capsys):
    _write_image_folder(tmp_path / "images")
    cache = tmp_path / "cache"
    ingested = run_cli(
        "data", "ingest", str(tmp_path / "images"), "--out", str(cache), "--size", "32",
        "--channels", "3", "--workers", "1", "--no-progress",
    )  # fmt: skip
    assert ingested.returncode == 0, ingested.stderr
    assert "skipped 2 unreadable image(s)" in ingested.stderr
    assert "truncated.jpg" in ingested.stderr and "garbage.png" in ingested.stderr
    code, out, err = hogwild_here(capsys, "data", "info", cache, "--json")  # reads a file
    assert code == 0, err
    manifest = json.loads(out)
    assert manifest["shape"] == [32, 32, 3] and manifest["splits"]["train"]["count"] == 60
    assert manifest["classes"] == ["checks", "horizontal", "vertical"]

    config = tmp_path / "small.toml"
    config.write_text(SMALL_RGB_MODEL)
    metrics = tmp_path / "metrics.jsonl"
    trained = run_cli(
        "train", "--data", str(cache), "--config", str(config), "--metrics", str(metrics),
        "--checkpoint-dir", str(tmp_path / "ck"), "--no-progress",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    records = read_metrics(metrics)
    assert [r["event"] for r in records] == ["start", "epoch", "final"]
    assert records[1]["examples"] == 60
    assert records[1]["test_accuracy"] is None  # a folder of classes only: no test split
    assert records[-1]["data_wait_s"] >= 0.0
    summary = json.loads(trained.stdout.strip().splitlines()[-1])
    assert summary["epochs"] == 1
    model = hogwild.load_checkpoint(tmp_path / "ck")  # three classes, from the checkpoint
    assert model.predict_proba(np.zeros((2, 3, 32, 32), np.uint8)).shape == (2, 3)
