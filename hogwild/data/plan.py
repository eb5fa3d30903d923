"""A job's data as the trainer sees it, and what the workers are told about it.

A job trains either on examples copied into the arena (MNIST idx files, :class:`~hogwild.data.mnist.
MnistData`) or on an LMDB image cache (:class:`CacheData`: the parent reads its manifest only, and
every worker opens the cache itself and reads its shard through a prefetching
:class:`~hogwild.data.feed.WorkerFeed`, since LMDB environments are never inherited across process
creation), or from data servers (``data.servers``). :func:`load_data` finds which;
:func:`plan_data` turns it into the :class:`DataPlan` the workers get (plain values: it crosses
process creation), after checking that ``model.input`` is the shape the data reaches the model in
(:func:`feed_input_shape`, after augmentation).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from hogwild.config import Config
from hogwild.data.arrays import ArrayData
from hogwild.data.mnist import MnistData, load_mnist
from hogwild.errors import ConfigError, DataError


@dataclass(frozen=True)
class CacheData:
    """An LMDB image cache as the parent sees it: its manifest only (workers open the cache).

    Attributes:
        path: The cache directory.
        shape: (H, W, C) of every image.
        classes: Class names; label ``i`` is ``classes[i]``.
        n_train: Records of the ``train`` split.
        n_test: Records of the ``test`` split (0: the cache has none, and nothing is evaluated).
    """

    path: str
    shape: tuple[int, int, int]
    classes: tuple[str, ...]
    n_train: int
    n_test: int

    @classmethod
    def from_manifest(cls, path: str | os.PathLike) -> CacheData:
        """Read the manifest of the cache at ``path`` (the environment is closed again).

        Raises:
            DataError: Not a complete hogwild image cache, or it has no ``train`` split.
        """
        from hogwild.data.layout import read_manifest

        manifest = read_manifest(path)
        if "train" not in manifest.splits:
            raise DataError(
                f"{path}: the image cache has no 'train' split (it holds {sorted(manifest.splits)})"
            )
        test = manifest.splits.get("test")
        return cls(
            str(Path(path)),
            tuple(manifest.shape),
            tuple(manifest.classes),
            manifest.splits["train"].count,
            test.count if test is not None else 0,
        )


@dataclass(frozen=True)
class DataPlan:
    """What the workers are told about the data (plain values: it crosses process creation).

    Attributes:
        cache: The image cache each worker opens, or "" (the examples are in the arena); with
            data servers, where they serve from (the arena holds no examples either).
        shape: (H, W, C) of a stored example.
        n_classes: Classes of the softmax.
        feed: Train and evaluate through a :class:`~hogwild.data.feed.WorkerFeed` (a cache, or
            augmentation); False keeps the zero-copy arena path.
        ram_budget_bytes: Cache bytes each worker copies into its own memory.
        servers: Data servers (``HOST:PORT``) the workers read from instead (``data.servers``).
        data_id: The id of the data those servers described (a worker checks it is served).
    """

    cache: str
    shape: tuple[int, int, int]
    n_classes: int
    feed: bool
    ram_budget_bytes: int = 0
    servers: tuple[str, ...] = ()
    data_id: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DataPlan:
        servers = tuple(data.get("servers", ()))
        return cls(**{**data, "shape": tuple(data["shape"]), "servers": servers})


def augmenting(config: Config) -> bool:
    """Whether ``data.augment`` changes anything (``""`` and ``"none"`` do not)."""
    if not config.data.augment.strip():
        return False
    from hogwild.data.augment import AugmentSpec

    return AugmentSpec.parse(config.data.augment) != AugmentSpec()


def feed_input_shape(config: Config, shape: tuple[int, int, int], what: str) -> tuple[int, ...]:
    """The [C, H, W] examples of ``shape`` (H, W, C) reach the model as, after augmentation.

    Raises:
        ConfigError: The crop of ``data.augment`` is larger than the images of ``what``.
    """
    height, width, channels = shape
    if not config.data.augment.strip():
        return (channels, height, width)
    from hogwild.data.augment import AugmentSpec

    try:
        oh, ow, _ = AugmentSpec.parse(config.data.augment).output_shape(shape)
    except ValueError as exc:
        raise ConfigError(
            f"{config.origin}: data.augment = {config.data.augment!r} does not fit the images of "
            f"{what}: {exc}"
        ) from None
    return (channels, oh, ow)


def check_input_shape(config: Config, shape: tuple[int, int, int], what: str) -> None:
    """ConfigError naming both shapes unless ``model.input`` is what the data feed delivers."""
    delivered = feed_input_shape(config, shape, what)
    if tuple(config.model.input) != delivered:
        via = f" after data.augment = {config.data.augment!r}" if config.data.augment else ""
        raise ConfigError(
            f"{config.origin}: model.input {list(config.model.input)} does not match the images "
            f"of {what}: {shape[0]}x{shape[1]}x{shape[2]} (HxWxC), delivered as "
            f"{list(delivered)} (C, H, W){via}; set model.input = {list(delivered)}"
        )


def plan_data(config: Config, data, n_workers: int) -> tuple[DataPlan, int, int]:
    """The workers' :class:`DataPlan`, the training examples available and the test examples.

    Args:
        config: The job.
        data: :class:`~hogwild.data.mnist.MnistData` (copied into the arena) or
            :class:`CacheData` (read by the workers); unused (may be None) when ``data.servers``
            lists data servers, which the workers read from and which are asked for the data's
            description here.
        n_workers: Worker processes (the RAM budget is split between them).

    Raises:
        ConfigError: ``model.input`` is not the shape the data reaches the model in, or the data
            servers render another augmentation or seed than the job's.
        DataError: No data server answered, or two serve different data.
    """
    regression = config.model.layers[-1].type == "mse"
    if regression and not (isinstance(data, ArrayData) and data.n_targets):
        raise ConfigError(
            f"{config.origin}: a model that ends in mse (regression) trains on target values "
            "given as arrays, data=(X, y) with float X and y; image files, caches and data "
            "servers hold class labels"
        )
    if config.data.servers:
        return _plan_served(config)
    if isinstance(data, CacheData):
        check_input_shape(config, data.shape, f"the image cache {data.path}")
        budget = config.data.ram_budget_mb * (1 << 20) // max(n_workers, 1)
        plan = DataPlan(data.path, data.shape, len(data.classes), True, budget)
        return plan, data.n_train, data.n_test
    if isinstance(data, ArrayData):
        channels, height, width = data.shape
        shape = (height, width, channels)
        if augmenting(config):
            raise ConfigError(
                f"{config.origin}: data.augment = {config.data.augment!r} applies to image files "
                "and caches, not to examples given as arrays; augment them before, or set "
                "data.augment = ''"
            )
        check_input_shape(config, shape, "the arrays given as data")
        units = [layer.units for layer in config.model.layers if layer.type == "fc"]
        classes = units[-1] if units else data.n_classes  # labels need not use every class
        if data.n_targets and data.n_targets != classes:
            raise DataError(
                f"y has {data.n_targets} target values per example, but the model's last fully "
                f"connected layer predicts {classes}"
            )
        if data.n_classes > classes:
            raise DataError(
                f"the labels go up to {data.n_classes - 1}, but the model's last fully "
                f"connected layer scores {classes} classes (labels 0 .. {classes - 1})"
            )
        plan = DataPlan("", shape, classes, False)
        return plan, len(data.train_labels), len(data.test_labels)
    height, width = data.train_images.shape[1:3]
    shape = (int(height), int(width), 1)
    check_input_shape(config, shape, f"the idx files of {data.source}")
    plan = DataPlan("", shape, 10, augmenting(config))
    return plan, len(data.train_labels), len(data.test_labels)


def _plan_served(config: Config) -> tuple[DataPlan, int, int]:
    """The plan of a job whose workers read from data servers: what the servers describe,
    checked against the job (augmentation, seed, ``model.input``)."""
    from dataclasses import asdict as as_dict

    from hogwild.data.augment import AugmentSpec
    from hogwild.data.remote import describe_servers

    servers = tuple(config.data.servers)
    served = describe_servers(
        servers, keys=config.ps.keys or None, timeout_s=config.data.timeout_s,
        wait_s=config.data.wait_s,
    )  # fmt: skip
    where = f"the data servers {', '.join(served['answering'])}"
    text = config.data.augment.strip()
    spec = AugmentSpec.parse(text) if text else AugmentSpec()
    wanted = json.loads(json.dumps(as_dict(spec))) if spec.random else None
    if served["augment"] != wanted or (spec.random and served["seed"] != config.train.seed):
        raise ConfigError(
            f"{config.origin}: data.augment = {config.data.augment!r} with train.seed = "
            f"{config.train.seed}, but {where} render augment {served['augment']} with seed "
            f"{served['seed']}; start them with this job's config (hogwild data serve SOURCE "
            "--config JOB.toml)"
        )
    if tuple(config.model.input) != tuple(served["shape"]):
        raise ConfigError(
            f"{config.origin}: model.input {list(config.model.input)} does not match the images "
            f"{where} deliver: {served['shape']} (C, H, W); set model.input = {served['shape']}"
        )
    source = f"{served['source']} via data servers {', '.join(servers)}"
    shape = tuple(served["stored_shape"])
    plan = DataPlan(source, shape, len(served["classes"]), True, 0, servers, served["data_id"])
    return plan, served["splits"]["train"], served["splits"]["test"]


def load_data(
    config: Config, data: MnistData | CacheData | str | os.PathLike | None
) -> MnistData | CacheData:
    """The examples: given, or from a path, or from the config's ``data.source``.

    A path is an LMDB image cache (a directory with ``data.mdb``; only its manifest is read
    here, the workers read the images) or a directory of MNIST idx files.

    Raises:
        DataError: The idx files or the cache are missing, incomplete or malformed.
    """
    if isinstance(data, MnistData | CacheData | ArrayData):
        return data
    source = data if data is not None else config.data.source
    if source not in (None, "mnist"):
        from hogwild.data.layout import is_image_cache

        if is_image_cache(source):
            return CacheData.from_manifest(source)
    return load_mnist(source, progress=config.output.progress)


def with_source(config: Config, data: MnistData | CacheData) -> Config:
    """``config`` with ``data.source`` naming where ``data`` was read from.

    The checkpoints record it, so ``hogwild eval DIR`` finds the same data without ``--data``.
    """
    source = data.path if isinstance(data, CacheData) else data.source
    if not source or source == config.data.source or not os.path.isdir(source):
        return config
    return config.override({"data.source": str(source)})
