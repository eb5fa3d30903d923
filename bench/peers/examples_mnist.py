"""pytorch/examples' MNIST example (mnist/main.py): its network and its own training loop.

The network (:class:`Net`), the loop (:func:`train_epoch`: Adadelta at lr 1.0, ``nll_loss`` on
``log_softmax``, batches of 64 shuffled each epoch; StepLR with gamma 0.7 after each epoch) and
the test (:func:`test_accuracy`, batches of 1000) are the example's, unchanged but for the data:
MNIST comes from the idx files on disk (:func:`bench.peers.torch_mnist.load_split`, normalised
with the example's mean 0.1307 and std 0.3081) instead of ``torchvision.datasets.MNIST``, which
downloads. torch uses every core (its default intra-op threads), as the example does, unless
the caller sets its threads (``bench/figures/drop_in.py --quick`` gives it one).

:func:`run_example` trains epoch by epoch until a test accuracy is reached and records, per
epoch, the seconds spent training (the test passes are not counted) and the accuracy.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from bench.peers.torch_mnist import load_split


def net():
    """The example's ``Net``: two 3x3 convolutions of 32 and 64 maps, max-pool, dropout 0.25,
    128 units, dropout 0.5, 10 classes, ``log_softmax``."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, 1)
            self.conv2 = nn.Conv2d(32, 64, 3, 1)
            self.dropout1 = nn.Dropout(0.25)
            self.dropout2 = nn.Dropout(0.5)
            self.fc1 = nn.Linear(9216, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x):
            x = self.conv1(x)
            x = F.relu(x)
            x = self.conv2(x)
            x = F.relu(x)
            x = F.max_pool2d(x, 2)
            x = self.dropout1(x)
            x = torch.flatten(x, 1)
            x = self.fc1(x)
            x = F.relu(x)
            x = self.dropout2(x)
            x = self.fc2(x)
            output = F.log_softmax(x, dim=1)
            return output

    return Net()


def train_epoch(model, loader, optimizer) -> None:
    """The example's ``train``: one pass over ``loader``."""
    from torch.nn import functional as F

    model.train()
    for data, target in loader:
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()


def test_accuracy(model, loader) -> float:
    """The example's ``test``: the share of test examples classified correctly."""
    import torch

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for data, target in loader:
            pred = model(data).argmax(dim=1)
            correct += int(pred.eq(target).sum())
            total += len(target)
    return correct / total


def run_example(
    data: str | Path,
    *,
    target: float,
    max_epochs: int,
    seed: int = 1,
    train_subset: int = 0,
    test_subset: int = 0,
) -> dict:
    """Train the example until ``target`` test accuracy (or ``max_epochs``).

    Returns:
        ``epochs``: per epoch ``train_s`` (cumulative seconds of training) and
        ``test_accuracy``; ``seconds_to_target`` (None if not reached); ``examples_per_s``.
    """
    import torch
    from torch.optim.lr_scheduler import StepLR
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(seed)
    train_images, train_labels = load_split(data, "train")
    test_images, test_labels = load_split(data, "test")
    if train_subset:
        train_images, train_labels = train_images[:train_subset], train_labels[:train_subset]
    if test_subset:
        test_images, test_labels = test_images[:test_subset], test_labels[:test_subset]
    train_set = TensorDataset(torch.from_numpy(train_images), torch.from_numpy(train_labels))
    test_set = TensorDataset(torch.from_numpy(test_images), torch.from_numpy(test_labels))
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=1000)
    model = net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    epochs, trained, reached = [], 0.0, None
    for epoch in range(max_epochs):
        started = time.perf_counter()
        train_epoch(model, train_loader, optimizer)
        trained += time.perf_counter() - started
        accuracy = test_accuracy(model, test_loader)
        scheduler.step()
        epochs.append({"epoch": epoch + 1, "train_s": trained, "test_accuracy": accuracy})
        if accuracy >= target:
            reached = trained
            break
    examples = len(train_labels) * len(epochs)
    return {
        "epochs": epochs,
        "seconds_to_target": reached,
        "examples_per_s": examples / trained if trained else None,
        "threads": torch.get_num_threads(),
        "train_examples": int(len(train_labels)),
        "test_examples": int(len(test_labels)),
        "test_accuracy": float(np.float64(epochs[-1]["test_accuracy"])) if epochs else None,
    }
