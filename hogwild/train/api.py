"""The Python API: the same engine as the CLI, for notebooks and scripts.

``train`` resolves a config (a :class:`~hogwild.config.Config`, a TOML path, or the bundled
default), applies keyword overrides, loads the data and runs the multi-process trainer.
``load_checkpoint`` gives back a :class:`TrainedModel` that predicts in this process.

Worker processes are started with spawn, which re-imports the calling script: as with
``multiprocessing`` and PyTorch, a script that calls ``train`` must guard it with
``if __name__ == "__main__":``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hogwild.config import Config, config_from_dict, load_config
from hogwild.data.mnist import MnistData, load_mnist
from hogwild.errors import CheckpointError, DataError
from hogwild.model.network import Network, build_network
from hogwild.train.checkpoint import Checkpoint
from hogwild.train.checkpoint import load_checkpoint as _load_checkpoint_files
from hogwild.train.trainer import TrainResult, run_training

PREDICT_BATCH = 64  # examples per forward pass when predicting

_KEYWORDS = {
    "workers": "train.workers",
    "epochs": "train.epochs",
    "batch": "train.batch",
    "lr": "optim.lr",
    "sync": "train.sync",
    "epoch_fraction": "train.epoch_fraction",
    "seed": "train.seed",
    "subset": "train.subset",
    "checkpoint_dir": "output.checkpoint_dir",
    "metrics": "output.metrics",
    "progress": "output.progress",
}


def resolve_config(
    config: Config | str | os.PathLike | None = None,
    overrides: dict[str, Any] | None = None,
    **options: Any,
) -> Config:
    """A config from an object, a TOML path or the bundled default, with overrides applied.

    ``options`` are the CLI's named flags (``workers``, ``epochs``, ``batch``, ``lr``, ``sync``,
    ``epoch_fraction``, ``seed``, ``subset``, ``checkpoint_dir``, ``metrics``, ``progress``);
    ``overrides`` takes any ``section.key`` of the config.
    """
    if not isinstance(config, Config):
        config = load_config(config)
    merged: dict[str, Any] = {}
    for name, value in options.items():
        if name not in _KEYWORDS:
            raise TypeError(f"unknown option {name!r}; known: {', '.join(_KEYWORDS)}")
        if value is not None:
            merged[_KEYWORDS[name]] = str(value) if isinstance(value, os.PathLike) else value
    merged.update(overrides or {})
    return config.override(merged) if merged else config


def load_data(config: Config, data: MnistData | str | os.PathLike | None) -> MnistData:
    """The examples: given, or from a directory, or from the config's ``data.source``."""
    if isinstance(data, MnistData):
        return data
    source = data if data is not None else config.data.source
    return load_mnist(source, progress=config.output.progress)


def train(
    config: Config | str | os.PathLike | None = None,
    data: MnistData | str | os.PathLike | None = None,
    *,
    resume: bool = False,
    overrides: dict[str, Any] | None = None,
    **options: Any,
) -> TrainResult:
    """Train with the single-node Hogwild engine and return the metrics.

    Args:
        config: a Config, a TOML file, or None for the bundled Adam MNIST model.
        data: MNIST as loaded data, a directory of idx files, or None for the data directory
            (downloaded on first use).
        resume: continue from the last checkpoint in ``checkpoint_dir``.
        overrides: ``{"section.key": value}`` pairs, as the CLI's ``--section.key=value``.
        **options: ``workers``, ``epochs``, ``batch``, ``lr``, ``sync``, ``epoch_fraction``,
            ``seed``, ``subset``, ``checkpoint_dir``, ``metrics``, ``progress``.
    """
    resolved = resolve_config(config, overrides, **options)
    return run_training(resolved, load_data(resolved, data), resume=resume)


@dataclass
class TrainedModel:
    """A checkpoint's network and weights, ready to predict in this process."""

    config: Config
    network: Network
    params: np.ndarray
    checkpoint: Checkpoint

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """The weights under PyTorch's names and layouts (views, no copies)."""
        return self.network.views(self.params)

    def predict_proba(self, images: np.ndarray) -> np.ndarray:
        """Class probabilities ``[n, classes]`` of images: uint8 pixels or floats in [0, 1]."""
        from hogwild.model.engine import predict_batch
        from hogwild.train.context import TrainingContext

        inputs = self._normalise(images)
        context = TrainingContext.allocate(self.network, PREDICT_BATCH)
        probabilities = np.zeros((len(inputs), self.network.n_classes), dtype=np.float32)
        predict_batch(
            self.network.ops,
            self.params,
            context.act,
            context.aux,
            context.scratch,
            inputs,
            probabilities,
        )
        return probabilities

    def predict(self, images: np.ndarray) -> np.ndarray:
        """The most probable class of each image."""
        return self.predict_proba(images).argmax(axis=1)

    def _normalise(self, images: np.ndarray) -> np.ndarray:
        images = np.asarray(images)
        size = self.network.input_size
        if images.ndim == len(self.network.input_shape) or images.size == size:
            images = images.reshape(1, -1)
        if images.size % size or images.size == 0:
            raise DataError(
                f"images of shape {images.shape} do not hold whole examples of shape "
                f"{self.network.input_shape} ({size} values each)"
            )
        flat = images.reshape(-1, size)
        pixels = flat.astype(np.float32) / (255.0 if images.dtype == np.uint8 else 1.0)
        data = self.config.data
        return np.ascontiguousarray((pixels - data.mean) / data.std, dtype=np.float32)


def load_checkpoint(path: str | os.PathLike) -> TrainedModel:
    """Load a checkpoint (a directory, its ``.json`` sidecar or its ``.safetensors`` file)."""
    checkpoint = _load_checkpoint_files(Path(path))
    if "config" not in checkpoint.info:
        raise CheckpointError(f"checkpoint {checkpoint.path} records no config")
    config = config_from_dict(checkpoint.info["config"], origin=str(checkpoint.path))
    network = build_network(config.model)
    params = np.zeros(network.n_params, dtype=np.float32)
    for name, view in network.views(params).items():
        tensor = checkpoint.weights.get(name)
        if tensor is None or tensor.shape != view.shape:
            found = None if tensor is None else tensor.shape
            raise CheckpointError(
                f"checkpoint {checkpoint.path}: {name} should have shape {view.shape}, "
                f"found {found}"
            )
        view[...] = tensor
    return TrainedModel(config, network, params, checkpoint)


def evaluate(checkpoint: str | os.PathLike, data: MnistData | str | os.PathLike | None = None):
    """Test loss and accuracy of a checkpoint, computed in this process."""
    model = load_checkpoint(checkpoint)
    mnist = load_data(model.config, data)
    probabilities = model.predict_proba(mnist.test_images)
    labels = mnist.test_labels.astype(np.int64)
    chosen = probabilities[np.arange(len(labels)), labels]
    return {
        "examples": len(labels),
        "test_loss": float(-np.log(np.maximum(chosen, 1e-30)).mean()),
        "test_accuracy": float((probabilities.argmax(axis=1) == labels).mean()),
        "checkpoint": str(model.checkpoint.path),
        "epoch": model.checkpoint.epoch,
    }
