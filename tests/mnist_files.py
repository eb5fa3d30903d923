"""Where the tests find the MNIST idx files, as a user's fresh clone would, and the plain copy
the suite's jobs read.

In order: ``$HOGWILD_TEST_DATA``; the shared data set beside the checkout
(``<repo>/../shared/datasets/mnist``, what CI uses); else hogwild's own data directory
(``$HOGWILD_DATA``, or the user cache), downloaded there as ``hogwild train`` does on first use.

The published files are gzipped, and every process of a job that reads them (a trainer, a
cluster's driver, replicas and data servers) decompresses all 70,000 images again: a quarter of
a CPU-second each, several hundred times a suite. :func:`plain_copy` writes the same arrays once
as plain idx files, which :func:`hogwild.data.mnist.load_mnist` reads as it reads the published
ones (it takes either form of each file), in a fifth of that.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

TEST_DATA_ENV = "HOGWILD_TEST_DATA"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "mnist"


@cache
def mnist_dir() -> Path:
    """A directory holding the four MNIST idx files (downloading them if none is found)."""
    given = os.environ.get(TEST_DATA_ENV)
    if given:
        return Path(given)
    if SHARED.is_dir():
        return SHARED
    from hogwild.data.mnist import load_mnist

    return Path(load_mnist("mnist", progress=True).source)


def plain_copy(source: Path, folder: Path) -> Path:
    """``folder``, holding the four MNIST files of ``source`` as plain (not gzipped) idx files,
    written there unless a complete copy already is (each file is written under a temporary
    name and renamed, so a copy cut short is never taken for one)."""
    from hogwild.data.idx import write_idx
    from hogwild.data.mnist import FILES, load_mnist

    names = [name.removesuffix(".gz") for name, _ in FILES.values()]
    if all((folder / name).is_file() for name in names):
        return folder
    data = load_mnist(source, download=False, progress=False)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, images, labels in (
        ("train", data.train_images, data.train_labels),
        ("t10k", data.test_images, data.test_labels),
    ):
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            final = folder / f"{prefix}-{kind}-ubyte"
            partial = folder / f".{final.name}.partial"
            write_idx(partial, array)
            partial.replace(final)
    return folder
