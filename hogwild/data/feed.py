"""A training worker's data feed: read, augment and prefetch batches of its shard, per epoch.

This is the one object a worker process needs from the data package. It composes

- a *reader* with ``shape`` (H, W, C), ``labels`` and ``read(indices, out, labels_out)``: an
  :class:`~hogwild.data.cache.ImageCache` opened in this worker, an :class:`ArrayReader` over
  in-memory arrays (MNIST idx files, the arena's copy), or a data server's
  :class:`~hogwild.data.remote.RemoteReader`, whose epoch's variants arrive rendered;
- an optional :class:`~hogwild.data.augment.AugmentSpec`, rendered for (seed, epoch, index);
- a :class:`~hogwild.data.prefetch.Prefetcher`, whose thread does all of the above ahead of
  the compute loop, into a ring of preallocated buffers.

Batches come out as uint8 images in the model's layout (``[n, C, oh, ow]`` by default, or
``[n, oh, ow, C]``) and int32 labels. :attr:`WorkerFeed.wait_s` is the time the compute loop
spent waiting for data (the ``data_wait_s`` metric). The reading, augmenting and copying all
run in ``nogil`` numba kernels or numpy, so the thread overlaps the training kernels.

Invariant: no allocation per batch in the steady state -- the buffer ring and the one staging
buffer the thread decodes into are allocated when the feed is made.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from hogwild.data.augment import (
    Augmenter,
    AugmentSpec,
    augment_batch,
    draw_params,
    identity_params,
)
from hogwild.data.prefetch import DEFAULT_TIMEOUT_S, Prefetcher


def compile_data_kernels(*, render: bool = True, gather: bool = True) -> None:
    """Compile (or load from numba's cache) every data kernel a worker runs.

    The trainer calls it once (through :func:`hogwild.model.compile.compile_kernels`), or finds
    them compiled, before its workers load their kernels, as the model's kernels are: workers then
    load the compiled code instead of each compiling it. A data server asks only for what it
    runs (:attr:`hogwild.data.resident.Delivery.renders`, an LMDB cache's reads): one that runs
    neither does not call this, and never loads numba.

    Args:
        render: The augmentation's warp (:func:`hogwild.data.augment.augment_batch`).
        gather: The batched LMDB reads (:mod:`hogwild.data.lmdb_gather`), where liblmdb's C API
            is available.
    """
    for channels in (1, 3) if render else ():
        images = np.zeros((1, 4, 4, channels), np.uint8)
        out = np.empty_like(images)
        for params in (identity_params(1), draw_params(AugmentSpec(rotate=10), 0, 0, [0], (4, 4))):
            augment_batch(images, out, params)
    if not gather:
        return
    from hogwild.data import lmdb_gather  # loads liblmdb's C API: only for a cache's reads

    if lmdb_gather.AVAILABLE:  # an empty batch: typed and compiled, LMDB never called
        lmdb_gather.gather_records(
            0,
            0,
            np.zeros(1, np.uint64),
            np.zeros(0, np.int64),
            np.zeros((0, 24), np.uint8),
            np.zeros(0, np.int32),
            np.zeros(2, np.uint64),
            48,
            np.zeros(3, np.int64),
        )


def checked_indices(indices, count: int) -> np.ndarray:
    """``indices`` as int64, or IndexError if one is outside ``0..count-1``."""
    idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= count):
        bad = idx[(idx < 0) | (idx >= count)][0]
        raise IndexError(f"record index {bad} outside 0..{count - 1}")
    return idx


class ArrayReader:
    """In-memory images and labels, read like an :class:`~hogwild.data.cache.ImageCache`.

    Args:
        images: uint8 ``[N, H, W]`` or ``[N, H, W, C]``.
        labels: Integer ``[N]``.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        if images.dtype != np.uint8 or images.ndim not in (3, 4):
            raise ValueError(f"images must be uint8 [N,H,W(,C)], got {images.dtype} {images.shape}")
        if len(labels) != len(images):
            raise ValueError(f"{len(labels)} labels for {len(images)} images")
        self.images = images if images.ndim == 4 else images[:, :, :, None]
        self.labels = np.asarray(labels, dtype=np.int32)  # the feed's label buffers are int32
        self.shape = self.images.shape[1:]

    def __len__(self) -> int:
        return len(self.labels)

    def read(self, indices, out: np.ndarray, labels_out: np.ndarray):
        """Gather images ``indices`` into ``out[:n]`` and labels into ``labels_out[:n]``."""
        idx = checked_indices(indices, len(self.labels))
        n = idx.shape[0]
        # mode="clip" (the indices are checked): numpy buffers ``out`` in its default mode.
        np.take(self.images, idx, axis=0, out=out[:n].reshape(n, *self.shape), mode="clip")
        np.take(self.labels, idx, out=labels_out[:n], mode="clip")
        return out[:n], labels_out[:n]


@dataclass
class FeedBatch:
    """One batch lent by a :class:`WorkerFeed` until its next batch is asked for.

    Attributes:
        images: uint8 ``[n, C, oh, ow]`` (or ``[n, oh, ow, C]``), a view into the ring.
        labels: int32 ``[n]``, a view into the ring.
        indices: The record indices of the batch, in order.
        epoch: The epoch it belongs to.
    """

    images: np.ndarray
    labels: np.ndarray
    indices: np.ndarray
    epoch: int

    def __len__(self) -> int:
        return self.labels.shape[0]


class WorkerFeed:
    """Prefetched, augmented batches of one worker's shard.

    Args:
        reader: Where images come from (see the module docstring).
        batch: Largest number of images per batch (the buffers' size).
        augment: What varies between epochs; None renders the images as they are.
        seed: The job's seed.
        train: Random variants per (seed, epoch, index); False renders the deterministic centre
            view (the evaluation input: centre crop, no flip or rotation).
        channels_first: Deliver ``[n, C, oh, ow]`` (the model's layout) rather than HWC.
        depth: Batches prefetched ahead of the one in use.
        timeout_s: Longest wait for one batch before :class:`PrefetchTimeoutError`.
    """

    def __init__(
        self,
        reader,
        *,
        batch: int,
        augment: AugmentSpec | None = None,
        seed: int = 0,
        train: bool = True,
        channels_first: bool = True,
        depth: int = 2,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.reader, self.batch = reader, batch
        self.spec = augment or AugmentSpec()
        self.train, self.channels_first = train, channels_first
        self._augmenter = Augmenter(self.spec, seed, channels_first=channels_first)
        height, width, channels = reader.shape
        oh, ow, _ = self.spec.output_shape((height, width, channels))
        self.output_shape = (channels, oh, ow) if channels_first else (oh, ow, channels)
        # Images go straight into the ring when nothing changes them and the layout agrees.
        self._direct = (
            (not self.spec.random or not train)
            and (oh, ow) == (height, width)
            and (channels == 1 or not channels_first)
        )
        self._staging = None if self._direct else np.empty((batch, *reader.shape), np.uint8)
        self._variants = None
        shape = self.output_shape

        def allocate():
            return np.empty((batch, *shape), np.uint8), np.empty(batch, np.int32)

        self._prefetcher = Prefetcher(self._fetch, allocate, depth=depth, timeout_s=timeout_s)

    @property
    def wait_s(self) -> float:
        """Seconds the consumer spent blocked waiting for batches (``data_wait_s``)."""
        return self._prefetcher.wait_s

    def start_epoch(self, epoch: int, indices: np.ndarray, variants=None) -> None:
        """Queue ``indices`` (this worker's shard of the epoch's order) in batches.

        Args:
            epoch: The epoch, which selects the variants.
            indices: Record indices, in training order.
            variants: A reader of this epoch's variants, already rendered (a data server's
                :meth:`~hogwild.data.remote.RemoteReader.for_epoch`), read instead of
                rendering, or None.
        """
        idx = np.ascontiguousarray(indices, dtype=np.int64)
        chunks = [idx[lo : lo + self.batch] for lo in range(0, len(idx), self.batch)]
        self._prefetcher.start([(epoch, chunk, variants) for chunk in chunks])

    def next_batch(self, timeout_s: float | None = None) -> FeedBatch | None:
        """The next batch of the current epoch, or None at its end (see ``Prefetcher.get``)."""
        got = self._prefetcher.get(timeout_s)
        if got is None:
            return None
        epoch, idx, _ = got.request
        images, labels = got.buffers
        n = idx.shape[0]
        return FeedBatch(images[:n], labels[:n], idx, epoch)

    def __iter__(self) -> Iterator[FeedBatch]:
        """The batches of the current epoch."""
        while (batch := self.next_batch()) is not None:
            yield batch

    def cancel(self) -> None:
        """Abandon the queued epochs (one closed early); the thread stays for the next."""
        self._prefetcher.cancel()

    def _fetch(self, request, buffers) -> None:
        """Fill one ring slot (on the prefetch thread)."""
        epoch, idx, variants = request
        images, labels = buffers
        n = idx.shape[0]
        if variants is not None:
            variants.read(idx, images, labels)
        elif self._direct:
            self.reader.read(idx, images, labels)
        else:
            raw, _ = self.reader.read(idx, self._staging, labels)
            if self.train:
                self._augmenter(raw, images, epoch, idx)
            else:
                augment_batch(
                    raw,
                    images,
                    identity_params(n),
                    channels_first=self.channels_first,
                    fill=self.spec.fill,
                )

    def close(self) -> None:
        """Stop the prefetch thread (the reader stays open: its owner closes it)."""
        self._prefetcher.close()

    def __enter__(self) -> WorkerFeed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
