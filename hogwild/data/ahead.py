"""Augmentation ahead of demand: whole epochs of variants rendered by background processes.

Adam's data servers transform the images "in advance ... because some of the image
transformations are compute intensive", and stream the results when asked (section 3.1). An
:class:`AheadAugmenter` is that role on one machine: a pool of spawned processes, each opening
the LMDB cache itself, renders every image of a split for an epoch into one ``.npy`` file
(uint8 ``[N, *output_shape]``) while training runs on an earlier epoch. Workers then read the
variants with :class:`EpochVariants` -- a memory-mapped gather, shared through the page cache --
instead of augmenting on the fly.

Files are rendered under a temporary name and renamed when complete, so a file named
``epoch-NNNNN.npy`` is always whole. The variant of an image is the same as
:class:`~hogwild.data.augment.Augmenter` renders for (seed, epoch, index): precomputing changes
when the work is done, not what the network sees.

Invariants: the augmenter owns its pool and its directory; :meth:`AheadAugmenter.close` (also on
exceptions, as a context manager) stops the processes and removes every file it made. Rendering
processes die with their parent (:mod:`hogwild.data.pool`). Every wait has a timeout.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import numpy as np

from hogwild.data.augment import AugmentSpec
from hogwild.data.pool import spawn_pool
from hogwild.errors import DataError

_TASK_RECORDS = 2048  # records per rendering task
_caches: dict = {}  # per rendering process: (path, split) -> open ImageCache


class EpochVariants:
    """The rendered variants of one epoch, read like a cache: ``read(indices, out, labels_out)``.

    Args:
        path: An ``epoch-NNNNN.npy`` file made by :class:`AheadAugmenter`.
        labels: int ``[N]``, the split's labels (``ImageCache.labels``).
    """

    def __init__(self, path: str | os.PathLike, labels: np.ndarray) -> None:
        try:
            self.images = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: cannot read the rendered variants ({exc})") from None
        if self.images.dtype != np.uint8 or len(self.images) != len(labels):
            raise DataError(
                f"{path}: expected uint8 variants of {len(labels)} images, found "
                f"{self.images.dtype} {list(self.images.shape)}"
            )
        self.labels = labels
        self.shape = self.images.shape[1:]

    def __len__(self) -> int:
        return len(self.labels)

    def read(self, indices, out: np.ndarray, labels_out: np.ndarray) -> None:
        """Copy variants ``indices`` into ``out[:n]`` and their labels into ``labels_out[:n]``."""
        from hogwild.data.feed import checked_indices

        idx = checked_indices(indices, len(self.labels))
        n = idx.shape[0]
        np.take(self.images, idx, axis=0, out=out[:n].reshape(n, *self.shape), mode="clip")
        np.take(self.labels, idx, out=labels_out[:n], mode="clip")


class AheadAugmenter:
    """Render epochs of augmented variants of one cache split in background processes.

    Args:
        cache_path: The LMDB image cache.
        split: Which split to render.
        spec: The augmentation.
        seed: The job's seed (variants are those of ``Augmenter(spec, seed)``).
        processes: Rendering processes.
        channels_first: Store ``[C, oh, ow]`` images (the model's layout) instead of HWC.
        directory: Where the epoch files go (default: a new temporary directory, removed on
            close).
    """

    def __init__(
        self,
        cache_path: str | os.PathLike,
        split: str,
        spec: AugmentSpec,
        seed: int,
        *,
        processes: int = 1,
        channels_first: bool = True,
        directory: str | os.PathLike | None = None,
    ) -> None:
        from hogwild.data.cache import read_manifest

        self.cache_path, self.split = str(cache_path), split
        self.spec, self.seed, self.channels_first = spec, seed, channels_first
        manifest = read_manifest(cache_path)
        if split not in manifest.splits:
            raise DataError(
                f"{cache_path}: no split {split!r} (it holds {sorted(manifest.splits)})"
            )
        self.count = manifest.splits[split].count
        oh, ow, c = spec.output_shape(manifest.shape)
        self.output_shape = (c, oh, ow) if channels_first else (oh, ow, c)
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="hogwild-variants-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self._jobs: dict[int, list[Future]] = {}
        self._pool = spawn_pool(processes)

    def path(self, epoch: int) -> Path:
        """The file holding ``epoch``'s variants once rendered."""
        return self.directory / f"epoch-{epoch:05d}.npy"

    def prepare(self, epoch: int) -> None:
        """Start rendering ``epoch`` (no-op if it is rendered or under way)."""
        if epoch in self._jobs:
            return
        tmp = self.directory / f".epoch-{epoch:05d}.npy.part"
        shape = (self.count, *self.output_shape)
        np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape).flush()
        args = (
            self.cache_path,
            self.split,
            self.spec,
            self.seed,
            epoch,
            str(tmp),
            self.channels_first,
        )
        self._jobs[epoch] = [
            self._pool.submit(_render, *args, lo, min(lo + _TASK_RECORDS, self.count))
            for lo in range(0, self.count, _TASK_RECORDS)
        ]

    def wait(self, epoch: int, timeout_s: float = 600.0) -> Path:
        """Wait until ``epoch`` is rendered (starting it if needed); its file's path.

        Raises:
            DataError: Rendering failed or a process died (the message says which), or it did
                not finish in ``timeout_s``.
        """
        self.prepare(epoch)
        final = self.path(epoch)
        if final.exists():
            return final
        try:
            for future in self._jobs[epoch]:
                future.result(timeout=timeout_s)
        except FutureTimeout:
            raise DataError(
                f"rendering epoch {epoch} of {self.cache_path} took over {timeout_s:.0f} s"
            ) from None
        except Exception as exc:
            raise DataError(f"rendering epoch {epoch} of {self.cache_path} failed: {exc}") from exc
        os.replace(self.directory / f".epoch-{epoch:05d}.npy.part", final)
        return final

    def release(self, epoch: int) -> None:
        """Delete ``epoch``'s variants (once every worker is done with them)."""
        for future in self._jobs.pop(epoch, []):
            future.cancel()  # a task already running finishes on the unlinked file
        for name in (f"epoch-{epoch:05d}.npy", f".epoch-{epoch:05d}.npy.part"):
            (self.directory / name).unlink(missing_ok=True)

    def close(self) -> None:
        """Stop the rendering processes and remove the files (and the directory if made here)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)
        else:
            for file in list(self.directory.glob("epoch-*.npy")) + list(
                self.directory.glob(".epoch-*.npy.part")
            ):
                file.unlink(missing_ok=True)

    def __enter__(self) -> AheadAugmenter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _render(cache_path, split, spec, seed, epoch, out_path, channels_first, lo, hi) -> int:
    """Render records lo..hi of ``epoch`` into their rows of ``out_path`` (in a pool process)."""
    from hogwild.data.augment import Augmenter
    from hogwild.data.cache import open_cache

    key = (cache_path, split)
    if key not in _caches:  # opened here, in the process that reads it
        _caches[key] = open_cache(cache_path, split)
    cache = _caches[key]
    out = np.load(out_path, mmap_mode="r+")
    augmenter = Augmenter(spec, seed, channels_first=channels_first)
    step = 256
    raw = np.empty((step, *cache.shape), dtype=np.uint8)
    labels = np.empty(step, dtype=np.int32)
    for start in range(lo, hi, step):
        idx = np.arange(start, min(start + step, hi), dtype=np.int64)
        images, _ = cache.read(idx, raw, labels)
        augmenter(images, out[idx[0] : idx[-1] + 1], epoch, idx)
    out.flush()
    del out
    return hi - lo
