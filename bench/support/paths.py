"""Where the benchmarks find the repository and the shared MNIST files.

:data:`REPO` is the repository root (the benchmarks run their jobs from it); :data:`SHARED_MNIST`
is the MNIST idx directory beside the checkout (``../shared/datasets/mnist``), each figure's
default for ``--data``.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_MNIST = REPO.parent / "shared" / "datasets" / "mnist"
