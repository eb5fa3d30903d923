"""The peer: PyTorch's Hogwild, as pytorch/examples ``mnist_hogwild`` trains MNIST.

The only module of ``bench/`` that imports torch. It follows the example's recipe: one model
whose parameters are moved to shared memory (``model.share_memory()``), N processes started with
``torch.multiprocessing`` (spawn), each with ``torch.set_num_threads(1)``, its own contiguous shard
of a permutation of the examples (as ``DistributedSampler`` cuts it), and
``torch.optim.SGD(lr=0.01, momentum=0.5)`` stepping the shared parameters without locks.

What differs from the example, so that both engines do the same work: the network is hogwild's
Adam MNIST model (no dropout: conv 1->10 k5, max-pool 2, relu; conv 10->20 k5, max-pool 2, relu;
fc 320->400 relu; fc 400->400 relu; fc 400->10; log-softmax and NLL loss), the examples are
normalised once up front, ``(x / 255 - 0.1307) / 0.3081``, instead of per item by a DataLoader
(which favours the peer), the processes live on between measurements (a fresh shared model is
sent for each one, so no start-up or import is timed), and each process warms up on its shard
before all of them are released together; the figure is examples over the time from that
release until the last one is done.

With ``shared=False`` each process trains a private copy of the model instead: the control that
shows what N independent processes of the same kind get from the machine.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch
import torch.multiprocessing as torch_mp
import torch.nn.functional as F
from torch import nn

from bench.support.machine import Gang

MEAN, STD = 0.1307, 0.3081
LR, MOMENTUM = 0.01, 0.5  # the example's defaults


class AdamMnistNet(nn.Module):
    """hogwild's Adam MNIST model in torch, with the example's layer order."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 400)
        self.fc2 = nn.Linear(400, 400)
        self.fc3 = nn.Linear(400, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return F.log_softmax(self.fc3(x), dim=1)


def _train(model, optimizer, images, labels, batch: int, count: int) -> None:
    """``count`` examples from the start of the shard (wrapping), in minibatches of ``batch``."""
    n = len(labels)
    done = 0
    while done < count:
        lo = done % n
        hi = min(lo + batch, n, lo + count - done)
        optimizer.zero_grad()
        loss = F.nll_loss(model(images[lo:hi]), labels[lo:hi])
        loss.backward()
        optimizer.step()
        done += hi - lo


def _peer_process(model, images, labels, batch, warmup, shared, *, ready) -> dict:
    """One Hogwild process: train ``warmup`` examples, wait for all, then its whole shard."""
    torch.set_num_threads(1)
    if not shared:
        model = copy.deepcopy(model)  # private storage: the control
    x = torch.from_numpy(images.astype(np.float32)).div_(255.0).sub_(MEAN).div_(STD)
    x = x.view(-1, 1, 28, 28)
    y = torch.from_numpy(labels.astype(np.int64))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    model.train()
    _train(model, optimizer, x, y, batch, warmup)
    ready()
    started = time.perf_counter()
    _train(model, optimizer, x, y, batch, len(y))
    return {"examples": len(y), "seconds": time.perf_counter() - started}


def peer_gang(n: int) -> Gang:
    """N processes started with ``torch.multiprocessing`` (spawn), unpinned as in the example."""
    return Gang(n, cpu_sets=None, context=torch_mp.get_context("spawn"), name="bench-peer")


def measure_peer(
    gang: Gang,
    images: np.ndarray,
    labels: np.ndarray,
    order: np.ndarray,
    shards: list[tuple[int, int]],
    *,
    batch: int,
    warmup: int,
    shared: bool = True,
    seed: int = 1,
) -> dict:
    """Examples per second of PyTorch Hogwild on ``len(shards)`` processes, from a fresh model.

    Args:
        gang: the processes to train in (:func:`peer_gang`), one per shard.
        images: uint8 ``[n, 28, 28]`` (or ``[n, 784]``) training examples.
        labels: their digits.
        order: the permutation of ``range(n)`` the shards are cut from.
        shards: ``(start, stop)`` of ``order`` for each process.
        batch: examples per SGD step.
        warmup: examples trained by all processes together before the timed run.
        shared: one shared model (Hogwild); False: a private copy per process (the control).
        seed: seeds the model's initialisation.

    Returns:
        ``{"examples_per_s", "examples", "seconds", "per_process_s"}``.
    """
    torch.manual_seed(seed)
    model = AdamMnistNet()
    model.share_memory()
    warm_each = -(-warmup // len(shards))
    args = []
    for start, stop in shards:
        chosen = order[start:stop]
        shard_images = np.ascontiguousarray(images[chosen].reshape(len(chosen), -1))
        args.append((model, shard_images, labels[chosen], batch, warm_each, shared))
    seconds, answers = gang.run(_peer_process, args)
    examples = sum(answer["examples"] for answer in answers)
    return {
        "examples_per_s": examples / seconds,
        "examples": examples,
        "seconds": seconds,
        "per_process_s": [answer["seconds"] for answer in answers],
    }
