"""The Python API: the same engine as the CLI, for notebooks and scripts.

``train`` resolves a config (a :class:`~hogwild.config.Config`, a TOML path, or the bundled
default), applies keyword overrides, loads the data (MNIST idx files, or the manifest of an LMDB
image cache made by ``hogwild data ingest``) and runs the multi-process trainer.
``load_checkpoint`` gives back a :class:`TrainedModel` that predicts in this process;
``evaluate`` measures it on the test split of the same kinds of data.

Worker processes are started with spawn, which re-imports the calling script: as with
``multiprocessing`` and PyTorch, a script that calls ``train`` must guard it with
``if __name__ == "__main__":``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hogwild.config import Config, config_from_dict, load_config
from hogwild.data.arrays import INPUTS_AS_GIVEN, array_data
from hogwild.data.datasets import cache_dataset, is_map_dataset
from hogwild.data.mnist import MnistData
from hogwild.data.plan import CacheData, augmenting, load_data, with_source
from hogwild.data.tables import is_table, read_table
from hogwild.errors import CheckpointError, ConfigError, DataError
from hogwild.model.network import Network, build_network
from hogwild.outputs import writable_directory, writable_file
from hogwild.training.checkpoint import Checkpoint
from hogwild.training.checkpoint import load_checkpoint as _load_checkpoint_files
from hogwild.training.tensorboard import TENSORBOARD_DIR
from hogwild.training.torch_bridge import TorchModel
from hogwild.training.trainer import TrainResult, run_training

PREDICT_BATCH = 64  # examples per forward pass when predicting
TEST_FRACTION = 0.2  # the share of a CSV or .npz file's rows held back as its test split

_KEYWORDS = {
    "workers": "train.workers",
    "epochs": "train.epochs",
    "batch": "train.batch",
    "batch_size": "train.batch",  # the CLI's --batch-size
    "lr": "optim.lr",
    "sync": "train.sync",
    "epoch_fraction": "train.epoch_fraction",
    "seed": "train.seed",
    "subset": "train.subset",
    "evaluate_every": "train.evaluate_every",
    "checkpoint_dir": "output.checkpoint_dir",
    "metrics": "output.metrics",
    "progress": "output.progress",
    "tensorboard": "output.tensorboard",
}


def resolve_config(
    config: Config | str | os.PathLike | None = None,
    overrides: dict[str, Any] | None = None,
    **options: Any,
) -> Config:
    """A config from an object, a TOML path or the bundled default, with overrides applied.

    ``options`` are the CLI's named flags (``workers``, ``epochs``, ``batch``, ``lr``, ``sync``,
    ``epoch_fraction``, ``seed``, ``subset``, ``evaluate_every``, ``checkpoint_dir``, ``metrics``,
    ``progress``, ``tensorboard``);
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


def train(
    config: Config | TorchModel | str | os.PathLike | None = None,
    data: MnistData | CacheData | tuple | str | os.PathLike | None = None,
    *,
    test_data: tuple | None = None,
    target: str | None = None,
    test_fraction: float = TEST_FRACTION,
    resume: bool = False,
    overwrite: bool = False,
    overrides: dict[str, Any] | None = None,
    on_epoch_end: Callable[[dict], Any] | None = None,
    job: Config | str | os.PathLike | None = None,
    **options: Any,
) -> TrainResult:
    """Train with the single-node Hogwild engine and return the metrics.

    Args:
        config: a Config, a TOML file, None for the bundled Adam MNIST model, or a PyTorch
            module's model (:func:`hogwild.from_torch`): the bundled job's settings with its
            layers, starting from its weights; the result's ``state_dict()`` has its names.
        data: ``(X, y)`` numpy arrays (:mod:`hogwild.data.arrays`: uint8 pixels scaled as
            every image source, floats used as given; any shape and number of classes), MNIST
            as loaded data, a directory of idx files, an LMDB image cache, or None for
            ``data.source`` of the config (default: MNIST in the data directory, downloaded on
            first use).
            Or a ``.npz`` or CSV file (:mod:`hogwild.data.tables`), read into such arrays, or
            a map-style ``torch.utils.data.Dataset`` of ``(image, label)``, read once into an
            image cache for this run (:mod:`hogwild.data.datasets`; ``test_data`` one too).
        test_data: ``(X, y)`` arrays tested on after every epoch, with ``data`` as arrays or a
            file (then nothing is held back).
        target: a CSV file's column of class indices.
        test_fraction: the share of a CSV file's rows (or of a ``.npz`` file's ``x`` and ``y``)
            held back as the test split when ``test_data`` is not given.
        resume: continue from the last checkpoint in ``checkpoint_dir``.
        overwrite: replace the checkpoints already in ``checkpoint_dir`` (without it, or
            ``resume``, a directory holding another run's checkpoints is refused).
        overrides: ``{"section.key": value}`` pairs, as the CLI's ``--section.key=value``.
        on_epoch_end: called in this process after every epoch, once it is evaluated (where
            ``evaluate_every`` says so) and checkpointed, with that epoch's metrics record (a
            dict: ``epoch`` from 0, ``train_loss``, ``test_loss``, ``test_accuracy``, ``lr``,
            ``examples_per_s``...).
            An exception it raises stops the job (workers stopped, shared memory removed).
        job: with a PyTorch module's model, the job whose other settings it trains with (a
            Config or a TOML file; default: the bundled job).
        **options: ``workers``, ``epochs``, ``batch``, ``lr``, ``sync``, ``epoch_fraction``,
            ``seed``, ``subset``, ``evaluate_every`` (epochs between evaluations on the test
            set; 0: only after the last), ``checkpoint_dir``, ``metrics``, ``progress``,
            ``tensorboard``.
    """
    torch_model = config if isinstance(config, TorchModel) else None
    if torch_model is not None:
        base = job if isinstance(job, Config) else load_config(job)
        config = replace(base, model=torch_model.model)
    resolved = resolve_config(config, overrides, **options)
    if resolved.model.partitions > 1:  # not trained here: the partitioned trainer is another
        raise ConfigError(
            "model.partitions > 1: train with hogwild.partition.runtime.train_partitioned (the "
            "same arguments, the job's own model on MNIST idx data) or hogwild train --partitions K"
        )
    check_outputs(resolved)  # before any data is read or downloaded
    if is_map_dataset(data):
        with tempfile.TemporaryDirectory(prefix="hogwild-dataset-") as scratch:
            cache = cache_dataset(
                data, Path(scratch) / "cache", test_data, progress=resolved.output.progress
            )
            return _run(
                resolved,
                CacheData.from_manifest(cache),
                torch_model,
                resume,
                overwrite,
                on_epoch_end,
            )
    if is_table(data):
        fraction = 0.0 if test_data is not None else test_fraction
        data, held_back = read_table(data, target, fraction, resolved.train.seed)
        test_data = held_back if test_data is None else test_data
    elif target is not None:
        raise DataError("target names a CSV file's label column: give data='file.csv'")
    if isinstance(data, tuple | list):
        regression = resolved.model.layers[-1].type == "mse"
        data = array_data(data, test_data, regression=regression)
    elif test_data is not None:
        raise DataError("test_data goes with data given as (X, y) arrays")
    return _run(resolved, load_data(resolved, data), torch_model, resume, overwrite, on_epoch_end)


def check_outputs(config: Config) -> None:
    """Fail at once, naming the path, where the job could only fail to write later."""
    if config.output.metrics:
        writable_file(config.output.metrics, "metrics file (--metrics)")
    if config.output.checkpoint_dir:
        writable_directory(config.output.checkpoint_dir, "checkpoint directory (--checkpoint-dir)")
    if config.output.tensorboard:
        writable_directory(config.output.tensorboard, TENSORBOARD_DIR)


def _run(
    config: Config,
    loaded,
    torch_model: TorchModel | None,
    resume: bool,
    overwrite: bool,
    on_epoch_end: Callable[[dict], Any] | None,
) -> TrainResult:
    """Train ``config`` on the loaded data, from the PyTorch module's weights if there is one."""
    config = with_source(config, loaded)
    if torch_model is None:
        return run_training(
            config, loaded, resume=resume, overwrite=overwrite, on_epoch_end=on_epoch_end
        )
    return run_training(
        config,
        loaded,
        resume=resume,
        overwrite=overwrite,
        on_epoch_end=on_epoch_end,
        initial=torch_model.weights,
        names=torch_model.names,
    )


@dataclass
class TrainedModel:
    """A checkpoint's network and weights, ready to predict in this process."""

    config: Config
    network: Network
    params: np.ndarray
    checkpoint: Checkpoint | None = None  # None: a model not loaded from a checkpoint

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """The weights under PyTorch's names and layouts (views, no copies)."""
        return self.network.views(self.params)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The weights as numpy arrays (copies) under the names of the PyTorch module the model
        came from (:func:`hogwild.from_torch`), else the engine's (``conv1.weight``)."""
        names = self.checkpoint.info.get("torch_names", {}) if self.checkpoint else {}
        return {names.get(name, name): view.copy() for name, view in self.weights.items()}

    def predict_proba(self, images: np.ndarray) -> np.ndarray:
        """Class probabilities ``[n, classes]`` of images: uint8 pixels or floats in [0, 1], or,
        for a model trained on float arrays, floats as they were given."""
        from hogwild.model.context import TrainingContext
        from hogwild.model.loops import predict_batch

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
        info = self.checkpoint.info if self.checkpoint else {}
        if info.get("inputs") == INPUTS_AS_GIVEN and images.dtype != np.uint8:
            return np.ascontiguousarray(flat, dtype=np.float32)  # trained on floats as given
        pixels = flat.astype(np.float32) / (255.0 if images.dtype == np.uint8 else 1.0)
        data = self.config.data
        return np.ascontiguousarray((pixels - data.mean) / data.std, dtype=np.float32)


def load_checkpoint(path: str | os.PathLike) -> TrainedModel:
    """Load a checkpoint (a directory, its ``.json`` sidecar or its ``.safetensors`` file)."""
    checkpoint = _load_checkpoint_files(Path(path))
    if "config" not in checkpoint.info:
        raise CheckpointError(f"checkpoint {checkpoint.path} records no config")
    config = config_from_dict(checkpoint.info["config"], origin=str(checkpoint.path))
    network = build_network(config.model, int(checkpoint.info.get("n_classes", 10)))
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


def evaluate(
    checkpoint: str | os.PathLike,
    data: MnistData | CacheData | str | os.PathLike | None = None,
    target: str | None = None,
    test_fraction: float = TEST_FRACTION,
):
    """Test loss and accuracy of a checkpoint, computed in this process; for a regression
    (an ``mse`` last layer) its test mean squared and mean absolute errors instead.

    ``data`` is as for :func:`train` (default: the checkpoint's ``data.source``). Images reach the
    model as in training: an image cache's, and augmented jobs' (a crop, say), through a data
    feed's deterministic centre view. A ``.npz`` or CSV file (``target`` naming a CSV's label or
    target column) gives its test split as :func:`train` chose it: its ``x_test`` and ``y_test``,
    or the ``test_fraction`` of its rows held back with the checkpoint's seed.

    Raises:
        DataError: The data has no test examples, or they do not fit the model, or a regression
            checkpoint was given no table of targets.
    """
    model = load_checkpoint(checkpoint)
    if is_table(data):
        _, held_back = read_table(data, target, test_fraction, model.config.train.seed)
        if held_back is None:
            raise DataError(f"{data}: no test rows to evaluate on (test_fraction {test_fraction})")
        result = evaluate_arrays(model, *held_back)
    elif model.network.regression:
        raise DataError(
            f"{model.checkpoint.path} is a regression: evaluate it on a .npz or CSV file of "
            "targets (--data FILE.csv --target COLUMN)"
        )
    else:
        result = evaluate_model(model, load_data(model.config, data))
    return {**result, "checkpoint": str(model.checkpoint.path), "epoch": model.checkpoint.epoch}


def evaluate_arrays(model: TrainedModel, x: np.ndarray, y: np.ndarray) -> dict:
    """``model`` on arrays: test loss and accuracy of class indices ``y``, or for a regression
    the mean squared error (``test_loss``, ``test_mse``: PyTorch's ``MSELoss``, the mean over
    every value) and mean absolute error of target values ``y``."""
    outputs = model.predict_proba(x)  # a regression's: its values
    if not model.network.regression:
        labels = np.asarray(y)
        classes = outputs.shape[1]
        if labels.shape != (len(outputs),) or not np.all(np.isin(labels, np.arange(classes))):
            raise DataError(
                f"labels of shape {labels.shape} must be {len(outputs)} class indices 0 .. "
                f"{classes - 1}"
            )
        labels = labels.astype(np.int64)
        chosen = outputs[np.arange(len(labels)), labels]
        loss = float(-np.log(np.maximum(chosen, 1e-30)).sum()) / len(labels)
        correct = int((outputs.argmax(axis=1) == labels).sum())
        return {"examples": len(labels), "test_loss": loss, "test_accuracy": correct / len(labels)}
    targets = np.asarray(y, dtype=np.float64).reshape(len(outputs), -1)
    if targets.shape != outputs.shape:
        raise DataError(
            f"targets of shape {np.shape(y)} for a model of {outputs.shape[1]} output value(s)"
        )
    error = outputs.astype(np.float64) - targets
    mse = float(np.mean(error * error))
    return {
        "examples": len(outputs),
        "test_loss": mse,
        "test_mse": mse,
        "test_mae": float(np.mean(np.abs(error))),
        "test_accuracy": None,
    }


def evaluate_model(model: TrainedModel, loaded: MnistData | CacheData, threads: int = 1) -> dict:
    """Examples, test loss and test accuracy of ``model`` on ``loaded``'s test split.

    ``threads``: threads predicting parts of an in-memory test split at once (the kernels
    release the GIL); for more than one, limit BLAS to one thread per caller first
    (:func:`hogwild.blas.limit_blas_threads`), or they queue on its thread pool.
    """
    if isinstance(loaded, CacheData) or augmenting(model.config):
        loss, correct, count = _evaluate_through_feed(model, loaded)
    else:
        probabilities = _predict_in_threads(model, loaded.test_images, threads)
        labels = loaded.test_labels.astype(np.int64)
        chosen = probabilities[np.arange(len(labels)), labels]
        loss = float(-np.log(np.maximum(chosen, 1e-30)).sum())
        correct, count = int((probabilities.argmax(axis=1) == labels).sum()), len(labels)
    return {"examples": count, "test_loss": loss / count, "test_accuracy": correct / count}


def _predict_in_threads(model: TrainedModel, images: np.ndarray, threads: int) -> np.ndarray:
    """``model.predict_proba(images)``, the images cut into ``threads`` parts predicted at once
    (each call has its own activations: they share only the read-only weights)."""
    if threads <= 1 or len(images) < 2 * threads:
        return model.predict_proba(images)
    parts = np.array_split(np.arange(len(images)), threads)
    with ThreadPoolExecutor(threads, thread_name_prefix="hogwild-predict") as pool:
        return np.concatenate(list(pool.map(lambda part: model.predict_proba(images[part]), parts)))


def _evaluate_through_feed(model: TrainedModel, data: MnistData | CacheData):
    """(summed loss, number correct, examples) of the test split, read through a data feed."""
    from hogwild.data.augment import AugmentSpec
    from hogwild.data.feed import ArrayReader, WorkerFeed
    from hogwild.data.plan import check_input_shape

    if isinstance(data, CacheData):
        from hogwild.data.cache import open_cache

        if not data.n_test:
            raise DataError(f"{data.path}: the image cache has no 'test' split to evaluate on")
        check_input_shape(model.config, data.shape, f"the image cache {data.path}")
        reader = open_cache(data.path, "test")
    else:
        reader = ArrayReader(data.test_images, data.test_labels.astype(np.int32))
    text = model.config.data.augment.strip()
    spec = AugmentSpec.parse(text) if text else None
    loss, correct, count = 0.0, 0, 0
    try:
        with WorkerFeed(reader, batch=1024, augment=spec, train=False) as feed:
            feed.start_epoch(0, np.arange(len(reader.labels), dtype=np.int64))
            for batch in feed:
                probabilities = model.predict_proba(batch.images)
                labels = batch.labels.astype(np.int64)
                chosen = probabilities[np.arange(len(labels)), labels]
                loss += float(-np.log(np.maximum(chosen, 1e-30)).sum())
                correct += int((probabilities.argmax(axis=1) == labels).sum())
                count += len(labels)
    finally:
        if hasattr(reader, "close"):
            reader.close()
    return loss, correct, count
