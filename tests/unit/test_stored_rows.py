"""Float32 examples train through the kernels the uint8 ones compiled, and train the same.

The loops take the stored examples as uint8 rows whatever their type: float32 values travel as
their bytes (:func:`hogwild.model.passes.stored_rows`) and are read back as float32 when loaded
(:func:`hogwild.model.passes.load_stored_example`), so a job on numpy float arrays
(:mod:`hogwild.data.arrays`) loads what a job on MNIST compiled instead of compiling the training
loop again. Float32 values equal to what the uint8 path computes from the pixels must give the
same activations, hence the same losses and the same updated weights, bit for bit.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from hogwild.config import default_config_path, load_config
from hogwild.data.arrays import input_normalisation
from hogwild.model import loops
from hogwild.model.context import TrainingContext
from hogwild.model.init import initialise
from hogwild.model.loops import LABEL_DTYPE, predict_batch
from hogwild.model.network import build_network
from hogwild.model.passes import stored_rows
from hogwild.model.random import seed_kernels
from hogwild.optim.rules import RULE_CODES

pytestmark = pytest.mark.warmed_kernels  # the jobs' training and evaluation kernels

MEAN, STD = 0.1307, 0.3081
N = 6


@pytest.fixture(scope="module")
def network():
    return build_network(load_config(default_config_path()).model)


def _examples(network):
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, size=(N, network.input_size), dtype=np.uint8)
    # what the uint8 load computes, (x / 255 - mean) / std, rounded to float32 as it stores it
    values = (pixels * (1.0 / (255.0 * STD)) - MEAN / STD).astype(np.float32)
    labels = rng.integers(0, network.n_classes, size=N).astype(LABEL_DTYPE)
    return pixels, values, labels


def _train(network, images, labels):
    params = np.zeros(network.n_params, np.float32)
    initialise(network, params, "he", 1.0, 5)
    velocity = np.zeros_like(params)
    context = TrainingContext.allocate(network, 1, 1)
    mean, std = input_normalisation(images.dtype, MEAN, STD)
    order = np.arange(N, dtype=np.int64)
    seed_kernels(0)  # the same dropout masks for both
    loss, correct = context.train_chunk(
        network.ops, params, velocity, images, labels, order, 0, N,
        batch=1, lr=0.01, mu=0.0, wd=0.0, rule=RULE_CODES["sgd"], mean=mean, std=std,
        update_every=1,
    )  # fmt: skip
    evaluation = context.evaluate_range(network.ops, params, images, labels, 0, N, mean, std)
    return params, (loss, correct), evaluation


def test_float32_rows_train_and_evaluate_like_the_pixels_they_equal(network):
    pixels, values, labels = _examples(network)
    from_pixels = _train(network, pixels, labels)
    from_values = _train(network, values, labels)
    np.testing.assert_array_equal(from_values[0], from_pixels[0])
    assert from_values[1:] == from_pixels[1:]
    assert from_pixels[2][0] > 0.0  # a real loss: the examples were read, not zeros
    # one kernel whatever the stored type: the float run compiled no float32 variant
    for dispatcher in (loops.train_chunk, loops.evaluate_range):
        images_at = list(inspect.signature(dispatcher.py_func).parameters).index("images")
        stored = {str(signature[images_at].dtype) for signature in dispatcher.signatures}
        assert stored == {"uint8"}, f"{dispatcher.py_func.__name__} images: {stored}"


def test_float32_rows_are_passed_as_their_bytes():
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    rows, floats = stored_rows(values)
    assert floats and rows.dtype == np.uint8 and rows.shape == (2, 12)
    assert np.shares_memory(rows, values)  # a view: the arena's examples are not copied
    pixels = np.zeros((2, 3), np.uint8)
    assert stored_rows(pixels) == (pixels, False)


@pytest.mark.parametrize(
    "images, what",
    [
        (np.zeros((2, 3), np.float64), "uint8 or float32 values, got float64"),
        (np.zeros((2, 6), np.uint8)[:, ::2], "a C-contiguous array, got a strided"),
        (np.zeros(6, np.uint8), "a 2-dimensional .* got 1 dimensions"),
        (np.zeros((1, 2, 3), np.uint8), "a 2-dimensional .* got 3 dimensions"),
    ],
)
def test_other_images_are_refused_naming_them(images, what):
    with pytest.raises(ValueError, match=f"images: expected {what}"):
        stored_rows(images)


@pytest.mark.parametrize(
    "probabilities",
    [
        np.zeros((N - 1, 10), np.float32),  # too few rows: the kernel would write past them
        np.zeros((N, 9), np.float32),
        np.zeros((N, 10), np.float64),  # another type: a second evaluation loop compiled
        np.zeros((N, 20), np.float32)[:, ::2],
    ],
)
def test_predict_batch_refuses_probabilities_it_cannot_fill(network, probabilities):
    assert network.n_classes == 10
    context = TrainingContext.allocate(network, 1)
    inputs = np.zeros((N, network.input_size), np.float32)
    params = np.zeros(network.n_params, np.float32)
    with pytest.raises(ValueError, match=rf"probabilities: expected .*float32 \[{N}, 10\]"):
        predict_batch(
            network.ops, params, context.act, context.aux, context.scratch,
            inputs, probabilities,
        )  # fmt: skip
