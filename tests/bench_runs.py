"""Running a benchmark script from a test: what every benchmark promises of its output, and the
small slice of MNIST its smoke runs read.

A benchmark prints one JSON line on stdout (its progress goes to stderr) and writes the same
line to its ``--out`` file (../shared/CONVENTIONS.md, Benchmarks). The tests of each benchmark's
``--quick`` run then check that line's fields.

Every process a smoke run starts reads the whole data directory and every job tests its model on
the whole test set, while a smoke run trains on a few thousand examples at most:
:func:`small_mnist` gives such runs the first 10,000 training and 2,000 test images of the real
files, as plain idx files (a re-cut :func:`hogwild.data.mnist.load_mnist` reads as it reads the
published files), so that no process decompresses 60,000 images or evaluates 10,000 for a run
that checks a record's shape.
"""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path

SMALL_TRAIN, SMALL_TEST = 10_000, 2_000


def run_bench(command: list[str], out: Path, *, timeout: float, cwd: Path | None = None) -> dict:
    """Run ``command`` to its end (``timeout``: a bound for a hang, not a speed check); it must
    exit 0, print exactly one JSON line and write the same line to ``out``. Its record."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout  # one JSON line, progress on stderr
    assert out.read_text().strip() == lines[0]
    return json.loads(lines[0])


def small_mnist(source: Path, tmp_path_factory) -> Path:
    """A directory of the first :data:`SMALL_TRAIN` training and :data:`SMALL_TEST` test
    examples of the MNIST files in ``source``, written once per session (per worker) into its
    temporary directory."""
    return _small_mnist(Path(source), tmp_path_factory.getbasetemp())


def small_slice(data):
    """The first :data:`SMALL_TRAIN` training and :data:`SMALL_TEST` test examples of a loaded
    :class:`hogwild.data.mnist.MnistData`, for runs given the arrays rather than a directory."""
    from hogwild.data.mnist import MnistData

    return MnistData(
        data.train_images[:SMALL_TRAIN],
        data.train_labels[:SMALL_TRAIN],
        data.test_images[:SMALL_TEST],
        data.test_labels[:SMALL_TEST],
        data.source,
    )


@cache
def _small_mnist(source: Path, base: Path) -> Path:
    from hogwild.data.idx import write_idx
    from hogwild.data.mnist import load_mnist

    data = small_slice(load_mnist(source, download=False, progress=False))
    folder = base / "small-mnist"
    folder.mkdir(exist_ok=True)
    for prefix, images, labels in (
        ("train", data.train_images, data.train_labels),
        ("t10k", data.test_images, data.test_labels),
    ):
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels)
    return folder
