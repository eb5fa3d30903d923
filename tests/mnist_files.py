"""Where the tests find the MNIST idx files, as a user's fresh clone would.

In order: ``$HOGWILD_TEST_DATA``; the shared data set beside the checkout
(``<repo>/../shared/datasets/mnist``, what CI uses); else hogwild's own data directory
(``$HOGWILD_DATA``, or the user cache), downloaded there as ``hogwild train`` does on first use.
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
