"""A PyTorch user's script, end to end, with real worker processes on real MNIST examples.

The model is defined in PyTorch, read by ``hogwild.from_torch``, trained by hogwild (two
workers, Adam, one epoch of 3,000 examples held as numpy arrays), loaded back into the module
with ``hogwild.to_torch`` and evaluated in PyTorch on ``result.preprocess(test images)``: the
module's accuracy is the one hogwild reported. Training starts from the module's own weights.
"""

from __future__ import annotations

import numpy as np
import pytest

import hogwild
from hogwild.data.mnist import MnistData, load_mnist

torch = pytest.importorskip("torch")
nn = torch.nn


@pytest.fixture(scope="module")
def small_mnist(mnist_dir) -> MnistData:
    full = load_mnist(mnist_dir)
    return MnistData(
        full.train_images[:3000],
        full.train_labels[:3000],
        full.test_images[:1000],
        full.test_labels[:1000],
        source="",
    )


def user_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.25),
        nn.Linear(8 * 12 * 12, 10),
    )


def test_define_in_torch_train_with_hogwild_evaluate_in_torch(small_mnist):
    net = user_model()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    result = hogwild.train(
        hogwild.from_torch(net, (1, 28, 28)),
        data=small_mnist,
        epochs=1,
        workers=2,
        batch=8,
        lr=0.002,
        progress=False,
        overrides={"optim.rule": "adam", "optim.warmup_epochs": 0, "optim.weight_decay": 0.0},
    )
    assert set(result.state_dict()) == set(net.state_dict())
    hogwild.to_torch(result, net)
    assert not torch.equal(net.state_dict()["0.weight"], before["0.weight"])  # it trained
    net.eval()
    with torch.no_grad():
        inputs = torch.from_numpy(result.preprocess(small_mnist.test_images))
        predicted = net(inputs).argmax(1).numpy()
    accuracy = float((predicted == small_mnist.test_labels).mean())
    reported = result.metrics["test_accuracy"]
    assert reported > 0.8  # Adam learns MNIST's digits in one short epoch
    # the same predictions, up to an example whose two best scores are within float rounding
    assert abs(accuracy - reported) <= 1 / len(predicted), (accuracy, reported)


def test_training_starts_from_the_module_weights(small_mnist):
    net = user_model()
    start = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    result = hogwild.train(
        hogwild.from_torch(net, (1, 28, 28)),
        data=small_mnist,
        epochs=1,
        workers=1,
        subset=16,
        lr=1e-12,  # steps far below float32 rounding of the weights
        progress=False,
        overrides={"optim.weight_decay": 0.0},
    )
    trained = result.state_dict()
    for name, value in start.items():
        np.testing.assert_allclose(trained[name], value, rtol=1e-6, atol=1e-9, err_msg=name)


MODEL_FILE = """
import torch.nn as nn


def build():
    return nn.Sequential(nn.Conv2d(1, 4, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(4 * 12 * 12, 10))


def not_a_module():
    return 3
"""


def test_cli_trains_a_torch_model_from_a_file(tmp_path, mnist_dir):
    import json
    import subprocess
    import sys

    (tmp_path / "net.py").write_text(MODEL_FILE)
    command = [sys.executable, "-m", "hogwild.cli", "train", "--data", str(mnist_dir)]
    common = ["--epochs", "1", "--subset", "300", "--workers", "1", "--no-progress"]
    done = subprocess.run(
        [*command, "--model", f"{tmp_path / 'net.py'}:build", *common],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["epochs"] == 1 and 0.0 <= summary["test_accuracy"] <= 1.0
    refused = subprocess.run(
        [*command, "--model", f"{tmp_path / 'net.py'}:not_a_module", *common],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode != 0
    assert "not_a_module() returned int, not a torch.nn.Module" in refused.stderr
