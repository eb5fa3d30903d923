"""Map-style torch datasets read into an image cache (``hogwild.data.datasets``): what is read,
and the refusals that name the example."""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.data.cache import open_cache
from hogwild.data.datasets import cache_dataset, is_map_dataset, read_dataset
from hogwild.errors import DataError

torch = pytest.importorskip("torch")


class Pixels(torch.utils.data.Dataset):
    """``ToTensor``-style examples: float [c, h, w] of k / 255, integer labels."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, scale: float = 255.0):
        self.images, self.labels, self.scale = images, labels, scale

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return torch.from_numpy(self.images[i].astype(np.float32) / self.scale), int(self.labels[i])


def test_tensor_images_are_read_back_as_their_pixels(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (7, 3, 5, 4), dtype=np.uint8)
    labels = np.array([0, 1, 2, 3, 0, 1, 2])
    assert is_map_dataset(Pixels(images, labels)) and not is_map_dataset((images, labels))
    pixels, read = read_dataset(Pixels(images, labels), progress=False)
    np.testing.assert_array_equal(pixels, images.transpose(0, 2, 3, 1))  # stored h, w, c
    np.testing.assert_array_equal(read, labels)
    cache = cache_dataset(Pixels(images, labels), tmp_path / "c", Pixels(images[:2], labels[:2]),
                          progress=False)  # fmt: skip
    reader = open_cache(cache, "train")
    try:
        assert len(reader.labels) == 7 and list(reader.labels) == list(labels)
    finally:
        reader.close()


def test_normalised_images_are_refused_with_the_advice():
    images = np.zeros((2, 1, 3, 3), dtype=np.uint8)
    with pytest.raises(DataError, match=r"dataset\[0\]: image values are not 8-bit .* data.mean"):
        read_dataset(Pixels(images + 1, np.array([0, 1]), scale=0.3081), progress=False)


def test_ragged_examples_and_bad_labels_are_named():
    class Ragged(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return torch.zeros(1, 4 + i, 4), 0

    with pytest.raises(DataError, match=r"dataset\[1\]: an image of shape \(5, 4, 1\)"):
        read_dataset(Ragged(), progress=False)
    images = np.zeros((2, 1, 3, 3), dtype=np.uint8)
    with pytest.raises(DataError, match=r"dataset\[1\]: label -1 is not a class index"):
        read_dataset(Pixels(images, np.array([0, -1])), progress=False)
