"""bench/support/digits.py: scikit-learn's digits as MNIST-shaped idx files that hogwild reads.

Checks: every image is the original 8x8 image, each pixel a 3x3 block inside a blank 2-pixel
border, grey levels 0..16 scaled to 0..255; the split is stratified, seeded and disjoint; the
files load through hogwild's own MNIST reader unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.support.digits import digits_arrays, write_digits
from hogwild.data.mnist import load_mnist


def pairs(images: np.ndarray, labels) -> list:
    """The (image bytes, label) pairs, sorted: the examples as a multiset."""
    flat = images.reshape(len(images), -1)
    return sorted(zip(map(bytes, flat), np.asarray(labels).tolist(), strict=True))


def test_each_image_is_the_original_upsampled_and_padded():
    # here, not at the top: scikit-learn takes over a second to import, which every pytest
    # worker would pay while collecting, whether or not it runs this file
    from sklearn.datasets import load_digits

    original = load_digits()
    train_x, train_y, test_x, test_y = digits_arrays(seed=3)
    images = np.concatenate([train_x, test_x])
    labels = np.concatenate([train_y, test_y])
    assert images.shape == (1797, 28, 28) and images.dtype == np.uint8
    assert not images[:, :2].any() and not images[:, -2:].any()  # the border is blank
    assert not images[:, :, :2].any() and not images[:, :, -2:].any()
    small = images[:, 2:-2:3, 2:-2:3]  # one pixel of every 3x3 block
    blocks = np.kron(small, np.ones((1, 3, 3), np.uint8))
    assert (blocks == images[:, 2:-2, 2:-2]).all()  # every block is one value
    want = np.rint(original.images * 255 / 16).astype(np.uint8)
    assert pairs(small, labels) == pairs(want, original.target)  # scikit-learn's examples, all


def test_the_split_is_stratified_seeded_and_disjoint():
    train_x, train_y, test_x, test_y = digits_arrays(seed=0, test_fraction=0.25)
    assert len(test_y) == 450 and len(train_y) == 1347
    counts = np.bincount(test_y, minlength=10) / np.bincount(np.concatenate([train_y, test_y]))
    assert np.allclose(counts, 0.25, atol=0.01)  # a quarter of every class
    again = digits_arrays(seed=0)
    assert all(
        (a == b).all() for a, b in zip(again, (train_x, train_y, test_x, test_y), strict=True)
    )
    other = digits_arrays(seed=1)
    assert not np.array_equal(other[3], test_y) or not np.array_equal(other[2], test_x)
    with pytest.raises(ValueError, match="test_fraction"):
        digits_arrays(test_fraction=1.0)


def test_the_files_load_as_mnist(tmp_path):
    described = write_digits(tmp_path / "digits", seed=0)
    assert described["train"] == 1347 and described["test"] == 450
    data = load_mnist(tmp_path / "digits")
    train_x, train_y, test_x, test_y = digits_arrays(seed=0)
    assert (data.train_images == train_x).all() and (data.train_labels == train_y).all()
    assert (data.test_images == test_x).all() and (data.test_labels == test_y).all()
