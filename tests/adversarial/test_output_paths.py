"""Ordinary mistakes with output paths end in one line naming the path, before any work begins.

``hogwild ps keys`` into an existing file; ``--metrics``, ``--checkpoint-dir`` and ``--out``
under a path that cannot be written (here: below a regular file, which no user, root included,
can write under): each exits with status 2 and one ``hogwild: error:`` line naming the path, no
traceback, and before a worker starts or an epoch is trained. A :class:`~hogwild.config.Config`
built in Python is validated as one loaded from a file is.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hogwild.config import Config, ConfigError, OptimConfig, PsConfig, load_config
from hogwild.data.idx import write_idx
from hogwild.data.ingest import ingest_arrays
from tests.cli_in_process import hogwild_cli


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("not a directory\n")
    return path


def one_error_line(capsys, argv, path) -> str:
    code, _, err = hogwild_cli(capsys, *argv)
    err = err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("hogwild: error:"), err
    assert str(path) in err[0], err
    return err[0]


def test_ps_keys_into_an_existing_file(capsys, a_file):
    one_error_line(capsys, ["ps", "keys", a_file], a_file)
    assert a_file.read_text() == "not a directory\n"


def test_ps_keys_below_a_file(capsys, a_file):
    one_error_line(capsys, ["ps", "keys", a_file / "keys"], a_file / "keys")


@pytest.mark.parametrize("flag", ["--metrics", "--checkpoint-dir", "--tensorboard"])
def test_train_outputs_below_a_file_are_refused_before_training(capsys, a_file, flag):
    target = a_file / "out"
    line = one_error_line(
        capsys, ["train", flag, target, "--epochs", "1", "--train.subset=64"], target
    )
    assert "cannot be written" in line or "not a directory" in line.lower()


@pytest.mark.parametrize("flag", ["--metrics", "--checkpoint-dir", "--tensorboard"])
def test_cluster_outputs_below_a_file_are_refused_before_any_role_starts(
    capsys, a_file, flag, mnist_dir
):
    target = a_file / "out"
    argv = ["cluster", flag, target, "--epochs", "1", "--subset", "64", "--no-progress",
            "--data", mnist_dir]  # fmt: skip
    line = one_error_line(capsys, argv, target)
    assert "cannot be written" in line or "not a directory" in line.lower()


def test_data_outputs_below_a_file(capsys, a_file, tmp_path):
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (8, 28, 28), np.uint8), rng.integers(0, 10, 8)
    source = tmp_path / "idx"
    source.mkdir()
    write_idx(source / "train-images-idx3-ubyte", images)
    write_idx(source / "train-labels-idx1-ubyte", labels.astype(np.uint8))
    cache = tmp_path / "cache"
    ingest_arrays(cache, {"train": (images, labels), "test": (images, labels)})
    one_error_line(capsys, ["data", "preview", cache, "--out", a_file / "p.png"], a_file / "p.png")
    one_error_line(capsys, ["data", "ingest", source, "--out", a_file / "c"], a_file / "c")


def test_plot_out_below_a_file(capsys, a_file, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"event": "epoch", "epoch": 1, "train_loss": 1.0}\n')
    one_error_line(capsys, ["plot", metrics, "--out", a_file / "p.png"], a_file / "p.png")


def test_a_config_built_in_python_is_validated():
    config = load_config()
    with pytest.raises(ConfigError, match="model.layers is empty"):
        Config()  # the defaults alone hold no model
    with pytest.raises(ConfigError, match="optim.lr"):
        Config(model=config.model, optim=OptimConfig(lr=-1.0))
    with pytest.raises(ConfigError, match="ps.nonfinite"):
        Config(model=config.model, ps=PsConfig(nonfinite="ignore"))
    with pytest.raises(ConfigError, match="ps.momentum"):
        dataclasses.replace(config, ps=dataclasses.replace(config.ps, momentum=1.5))
