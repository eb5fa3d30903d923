"""What a training job shares between the parent and its workers, and how it is laid out.

One arena (a POSIX shared-memory segment, :mod:`hogwild.shm.arena`) holds everything the workers
share: the parameter store's regions (the parameters and the momentum velocity, updated in place
without locks; one copy, or copies per worker or per NUMA node: :mod:`hogwild.store`), the examples
(one copy for all workers), this epoch's permutation, a small control block the parent writes and
workers poll, and one 64-byte row of statistics per worker (padded so that two workers' counters
never share a cache line).

A job trains either on examples in the arena (MNIST idx files, copied in once) or on an LMDB
image cache (:class:`CacheData`): then the arena holds no examples, and every worker opens the
cache itself and reads its shard through a prefetching :class:`~hogwild.data.feed.WorkerFeed`
(LMDB environments are never inherited across process creation). :class:`DataPlan` is what the
parent tells the workers about the data; :func:`feed_input_shape` is the shape the feed delivers,
which must be the model's ``input``.

Control block (int64): ``CONTROL_EPOCH`` is the epoch workers may train; the parent sets it to
``EPOCH_CLOSED`` to end an epoch early (Adam section 3.2.5), and workers still inside their shard
stop at their next look (every ``train.chunk`` examples). ``CONTROL_COMPILED`` is set once the
parent's compile step is done; a starting worker waits for it before it loads its kernels.
Statistics (float64, per worker): examples trained in total, summed training loss, number correct,
and a heartbeat (the system's monotonic clock when the worker last showed life), which the parent
watches to name a worker that is alive but stuck.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from hogwild.config import Config
from hogwild.errors import ConfigError, DataError
from hogwild.model.engine import LABEL_DTYPE
from hogwild.model.network import Network
from hogwild.shm.arena import ArenaLayout

CONTROL_EPOCH = 0
EPOCH_CLOSED = -1
CONTROL_COMPILED = 1  # set by the trainer once its compile step is done: workers load then
CONTROL_SLOTS = 8  # one cache line of int64

STAT_EXAMPLES, STAT_LOSS, STAT_CORRECT, STAT_BEAT = 0, 1, 2, 3
STAT_SLOTS = 8  # one cache line of float64 per worker


def job_layout(
    network: Network,
    n_workers: int,
    n_train: int,
    n_test: int,
    image_bytes: int | None = None,
    store=None,
) -> ArenaLayout:
    """The arena layout of a job: the parameter store's regions, data, control, statistics.

    Args:
        network: The model.
        n_workers: Worker processes (one statistics row each).
        n_train: Training examples of an epoch (the permutation's length).
        n_test: Test examples held in the arena.
        image_bytes: Bytes of one stored example (default: the model's input size); 0 leaves
            the examples out (a job that reads an image cache).
        store: The job's :class:`~hogwild.store.protocol.ParameterStore`, which adds its
            regions (None: none, for a layout without parameters).
    """
    image_bytes = network.input_size if image_bytes is None else image_bytes
    layout = ArenaLayout()
    if store is not None:
        store.add_regions(layout)
    layout.add("control", np.int64, (CONTROL_SLOTS,))
    layout.add("stats", np.float64, (n_workers, STAT_SLOTS))
    layout.add("order", np.int64, (n_train,))
    if image_bytes:
        layout.add("train_images", np.uint8, (n_train, image_bytes))
        layout.add("train_labels", LABEL_DTYPE, (n_train,))  # the kernels' one label type
        layout.add("test_images", np.uint8, (n_test, image_bytes))
        layout.add("test_labels", LABEL_DTYPE, (n_test,))
    return layout


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
        from hogwild.data.cache import read_manifest

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


def training_unit(config: Config) -> int:
    """Examples trained as one: a minibatch (``train.batch``) or, at batch 1, a group of
    examples whose fully connected updates are applied together (``train.update_every``)."""
    train = config.train
    return train.batch if train.batch > 1 else max(1, train.update_every)


def whole_units(config: Config) -> int:
    """``train.chunk`` rounded down to whole units (at least one), so no chunk cuts a minibatch."""
    unit = training_unit(config)
    return max(unit, config.train.chunk // unit * unit)


def subset_indices(seed: int, n_total: int, subset: int) -> np.ndarray | None:
    """The training examples of ``train.subset``: a seeded random choice, in ascending order.

    None when every example is used. A random choice rather than the first records, which in a
    cache made from class folders are the first classes.
    """
    if not subset or subset >= n_total:
        return None
    chosen = np.random.default_rng([seed, 0x5B5E7]).choice(n_total, subset, replace=False)
    return np.sort(chosen).astype(np.int64)


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The example order of ``epoch``: a fresh shuffle per epoch, reproducible from the seed."""
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)


def shard_bounds(n: int, n_workers: int) -> list[tuple[int, int]]:
    """Split ``range(n)`` into ``n_workers`` contiguous, nearly equal shards."""
    edges = np.linspace(0, n, n_workers + 1).round().astype(int)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(n_workers)]


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
    if config.data.servers:
        return _plan_served(config)
    if isinstance(data, CacheData):
        check_input_shape(config, data.shape, f"the image cache {data.path}")
        budget = config.data.ram_budget_mb * (1 << 20) // max(n_workers, 1)
        plan = DataPlan(data.path, data.shape, len(data.classes), True, budget)
        return plan, data.n_train, data.n_test
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
    served = describe_servers(servers, keys=config.ps.keys or None, timeout_s=config.data.timeout_s)
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
