"""scikit-learn's handwritten digits as MNIST-shaped idx files: a second dataset nobody tuned for.

``sklearn.datasets.load_digits`` ships inside the scikit-learn wheel (no network): 1,797 images
of 8x8 pixels with 17 grey levels (0..16), ten classes, written by 43 people (UCI's "Optical
Recognition of Handwritten Digits"). :func:`write_digits` makes them the shape hogwild's bundled
model (Adam's MNIST network) takes, so that the same job runs on them unchanged:

* each pixel becomes a 3x3 block (8x8 to 24x24, nearest neighbour: no new values invented), then
  a border of 2 blank pixels (28x28; MNIST's digits sit in a 20x20 box inside 28x28 too);
* grey levels 0..16 are scaled to 0..255 (``round(v * 255 / 16)``), uint8 as MNIST's;
* a seeded, stratified split: ``test_fraction`` of every class is the test set (the data have no
  published split).

The files are MNIST's four names, plain (not gzipped), so ``--data DIR`` reads them as MNIST.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["digits_arrays", "write_digits"]

SCALE = 3  # 8x8 -> 24x24
PAD = 2  # 24x24 -> 28x28


def digits_arrays(seed: int = 0, test_fraction: float = 0.25):
    """``(train_images, train_labels, test_images, test_labels)``: uint8 [n, 28, 28], uint8 [n]."""
    from sklearn.datasets import load_digits

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)  # [n, 8, 8]
    images = np.kron(images, np.ones((1, SCALE, SCALE), np.uint8))
    images = np.pad(images, ((0, 0), (PAD, PAD), (PAD, PAD)))
    labels = digits.target.astype(np.uint8)
    rng = np.random.default_rng(seed)
    test = np.zeros(len(labels), bool)
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        test[members[: round(len(members) * test_fraction)]] = True
    return images[~test], labels[~test], images[test], labels[test]


def write_digits(directory: str | Path, seed: int = 0, test_fraction: float = 0.25) -> dict:
    """Write the four idx files into ``directory`` (made if needed); return what was written."""
    from hogwild.data.idx import write_idx

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    train_x, train_y, test_x, test_y = digits_arrays(seed, test_fraction)
    files = {"train-images-idx3-ubyte": train_x, "train-labels-idx1-ubyte": train_y,
             "t10k-images-idx3-ubyte": test_x, "t10k-labels-idx1-ubyte": test_y}  # fmt: skip
    for name, array in files.items():
        write_idx(folder / name, array, compress=False)
    pixels = train_x.astype(np.float64) / 255.0
    return {"train": len(train_y), "test": len(test_y), "shape": list(train_x.shape[1:]),
            "pixel_mean": round(float(pixels.mean()), 4),
            "pixel_std": round(float(pixels.std()), 4)}  # fmt: skip
