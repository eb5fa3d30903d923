"""A map-style ``torch.utils.data.Dataset`` read once into an LMDB image cache.

:func:`cache_dataset` reads every ``dataset[i]`` once, in order, with a progress bar, and writes
the examples as an image cache (:func:`hogwild.data.ingest.ingest_arrays`) that the workers then
read like any other. An example is ``(image, label)``: the image a tensor or array
``[channels, height, width]`` (what ``transforms.ToTensor`` gives) or ``[height, width]``, or a
PIL image; the label a class index.

The cache holds uint8 pixels, and the engine scales them itself (``(x / 255 - data.mean) /
data.std``), so images are taken as uint8 as they are, and float images only when every value is
``k / 255`` (``ToTensor`` of an 8-bit image): a ``Normalize`` in the transform is refused, with
the advice to set ``data.mean`` and ``data.std`` instead. torch is not imported here: the
dataset brings its own tensors.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from hogwild.errors import DataError


def is_map_dataset(data) -> bool:
    """Whether ``data`` looks like a map-style dataset: ``len()`` and ``[i]``, not an array,
    a path or a pair of arrays."""
    if isinstance(data, str | os.PathLike | tuple | list | np.ndarray | dict):
        return False
    return hasattr(data, "__getitem__") and hasattr(data, "__len__")


def _pixels(image, index: int, what: str) -> np.ndarray:
    """One example's image as uint8 ``[height, width, channels]``."""
    if hasattr(image, "detach"):  # a torch tensor
        image = image.detach().cpu().numpy()
    array = np.asarray(image)  # a PIL image becomes [h, w] or [h, w, c]
    pil = not isinstance(image, np.ndarray)
    if array.ndim == 2:
        array = array[:, :, None]
    elif array.ndim == 3 and not pil:
        array = np.transpose(array, (1, 2, 0))  # tensors and arrays are [c, h, w]
    elif array.ndim != 3:
        raise DataError(f"{what}[{index}]: an image of shape {array.shape}; expected [c, h, w]")
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    if not np.issubdtype(array.dtype, np.floating) and not np.issubdtype(array.dtype, np.integer):
        raise DataError(f"{what}[{index}]: image values of type {array.dtype}")
    scaled = array.astype(np.float64) * (255.0 if np.issubdtype(array.dtype, np.floating) else 1.0)
    levels = np.rint(scaled)
    if not np.all(np.abs(scaled - levels) < 1e-3) or levels.min() < 0 or levels.max() > 255:
        raise DataError(
            f"{what}[{index}]: image values are not 8-bit pixels (uint8, or floats k / 255 as "
            "transforms.ToTensor gives); hogwild caches pixels and normalises them itself: drop "
            "Normalize from the transform and set data.mean and data.std"
        )
    return levels.astype(np.uint8)


def read_dataset(dataset, what: str = "dataset", progress: bool = True):
    """``(uint8 images [n, h, w, c], int64 labels [n])`` of every example, read once."""
    n = len(dataset)
    if n == 0:
        raise DataError(f"{what} is empty")
    images, labels = None, np.zeros(n, dtype=np.int64)
    step = max(1, n // 100)
    for index in range(n):
        example = dataset[index]
        if not isinstance(example, tuple | list) or len(example) != 2:
            raise DataError(f"{what}[{index}] is not an (image, label) pair")
        image, label = example
        pixels = _pixels(image, index, what)
        if images is None:
            images = np.zeros((n, *pixels.shape), dtype=np.uint8)
        elif pixels.shape != images.shape[1:]:
            raise DataError(
                f"{what}[{index}]: an image of shape {pixels.shape} (h, w, c); the first was "
                f"{images.shape[1:]}: every example needs one shape"
            )
        images[index] = pixels
        value = label.item() if hasattr(label, "item") else label
        if isinstance(value, bool) or not float(value).is_integer() or value < 0:
            raise DataError(f"{what}[{index}]: label {value!r} is not a class index >= 0")
        labels[index] = int(value)
        if progress and (index + 1) % step == 0:
            done = (index + 1) / n
            bar = "#" * int(done * 30)
            print(f"\rreading {what}: [{bar:<30}] {index + 1:,}/{n:,}", end="", file=sys.stderr)
    if progress:
        print(file=sys.stderr)
    return images, labels


def cache_dataset(dataset, out: str | os.PathLike, test_dataset=None, progress: bool = True):
    """Read ``dataset`` (and ``test_dataset``) once into the image cache ``out``; its path.

    Raises:
        DataError: an example is not ``(image, label)``, its image not 8-bit pixels, or the
            shapes differ.
    """
    from hogwild.data.ingest import ingest_arrays

    splits = {"train": read_dataset(dataset, "dataset", progress)}
    if test_dataset is not None:
        splits["test"] = read_dataset(test_dataset, "test_dataset", progress)
        if splits["test"][0].shape[1:] != splits["train"][0].shape[1:]:
            raise DataError(
                f"test_dataset's images are {splits['test'][0].shape[1:]} (h, w, c), dataset's "
                f"{splits['train'][0].shape[1:]}"
            )
    report = ingest_arrays(out, splits, progress=progress)
    return Path(report.path)
