"""What the PyTorch and Ray parameter-server peers share: Project Adam's MNIST model in
``torch.nn``, MNIST as the model takes it, and its test accuracy.

The peers of ``bench/figures/adam_fig11_replicas.py`` (:mod:`bench.peers.replicas_torch_rpc`,
:mod:`bench.peers.replicas_ray`) train the same network on the same files as ours: the idx files
are read by the core's reader (:mod:`hogwild.data.idx`, which validates every header) and
normalised once up front as ``hogwild/configs/adam_mnist.toml`` does. torch is imported only
inside the functions that need it, so a process that only reads data does not load it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from bench.support.paths import SHARED_MNIST
from hogwild.data.idx import read_images, read_labels
from hogwild.data.mnist import FILES
from hogwild.errors import DataError

MEAN, STD = 0.1307, 0.3081  # hogwild/configs/adam_mnist.toml [data]


def load_split(root: str | Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images float32 N x 1 x 28 x 28, normalised; labels int64) of ``train`` or ``test`` from a
    directory of MNIST idx files (each gzipped or plain, as :func:`hogwild.data.mnist.load_mnist`
    accepts them).

    Raises:
        DataError: a file is missing, or is not the idx file of MNIST images or labels.
    """

    def find(role: str) -> Path:
        published = Path(root) / FILES[f"{split}_{role}"][0]  # the .gz name
        for path in (published, published.with_suffix("")):
            if path.exists():
                return path
        raise DataError(f"{root}: no {published.name} (nor {published.stem}), MNIST {split} {role}")

    images = read_images(find("images")).astype(np.float32)
    labels = read_labels(find("labels")).astype(np.int64)
    images = ((images / 255.0 - MEAN) / STD).reshape(-1, 1, 28, 28)
    return images, labels


def adam_mnist_net():
    """Project Adam's MNIST model in ``torch.nn`` (756,000 connections)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 10, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(10, 20, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(320, 400), nn.ReLU(),
        nn.Linear(400, 400), nn.ReLU(),
        nn.Linear(400, 10),
    )  # fmt: skip


def accuracy(model, images: np.ndarray, labels: np.ndarray, chunk: int = 1000) -> float:
    """Test accuracy of ``model`` (the softmax's argmax) in chunks of ``chunk`` examples."""
    import torch

    correct = 0
    with torch.no_grad():
        for start in range(0, len(labels), chunk):
            logits = model(torch.from_numpy(images[start : start + chunk]))
            correct += int((logits.argmax(1).numpy() == labels[start : start + chunk]).sum())
    return correct / len(labels)


def race_arguments(doc: str, launched: float, argv: list[str] | None) -> argparse.Namespace:
    """The command line both replica peers take (the race to a test accuracy), parsed; their
    math libraries limited to one thread each, which the processes they start inherit."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    add = parser.add_argument
    add("--data", default=str(SHARED_MNIST), help="MNIST idx files")
    add("--trainers", type=int, default=2)
    add("--target", type=float, default=0.985)
    add("--bound-s", type=float, default=240.0, help="give up after this many seconds")
    add("--eval-every", type=int, default=20000, metavar="N", help="examples between evaluations")
    add("--seed", type=int, default=1)
    add("--launched-at", type=float, default=launched, help="time.time() of the launch")
    args = parser.parse_args(argv)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"
    return args
