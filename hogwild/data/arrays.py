"""Examples given as numpy arrays: checked once, then copied into the job's arena like MNIST.

``hogwild.train(model, data=(X, y), test_data=(X2, y2))`` takes any number of examples of any
shape: ``X`` is ``[n, features]``, ``[n, height, width]`` or ``[n, channels, height, width]``
(PyTorch's layout), ``y`` holds class indices ``0 .. classes - 1`` (the job's plan takes the
classes from the model's last layer and refuses labels beyond them). Pixels are either

* **uint8**: scaled as every image source is, ``(x / 255 - data.mean) / data.std``, or
* **floating point**: used exactly as given (stored as float32; no scaling, no normalisation), so
  a PyTorch module fed the same arrays sees what the engine saw.

:func:`input_normalisation` is the one place that says which (the kernels' ``mean`` and
``std``), for the workers and for prediction alike. Ragged arrays, labels that are not
non-negative integers, arrays of other types and NaN or infinite features are refused, naming
the array and what was expected.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hogwild.errors import DataError

LABEL_TYPE = np.int32  # the arena's and the kernels' label type (hogwild.model.loops)
INPUTS_AS_GIVEN = "float32 as given"  # a checkpoint's "inputs" when it trained on float arrays


@dataclass(frozen=True)
class ArrayData:
    """Training and test examples from arrays, one flat C-contiguous row per example (channels,
    then rows, then columns: the model's input order)."""

    train_images: np.ndarray  # uint8 or float32 [n, channels * height * width]
    train_labels: np.ndarray  # int32 [n]
    test_images: np.ndarray  # same type [m, ...]; m may be 0
    test_labels: np.ndarray
    shape: tuple[int, int, int]  # (channels, height, width) of one example
    n_classes: int  # a regression's: its number of target values
    source: str = "arrays"
    n_targets: int = 0  # a regression's target values, stored in each row after the input

    @property
    def floats(self) -> bool:
        return self.train_images.dtype == np.float32


def input_normalisation(images_dtype, mean: float, std: float) -> tuple[float, float]:
    """The ``mean`` and ``std`` the load kernel (``(x / 255 - mean) / std``, i.e.
    ``x * 1 / (255 std) - mean / std``) takes for images of ``images_dtype``: the job's for
    uint8 pixels; for float32 values 0 and 1/255, which make it ``x * 1 - 0``: the values as
    given."""
    if np.dtype(images_dtype) == np.uint8:
        return float(mean), float(std)
    return 0.0, 1.0 / 255.0


def _example_shape(shape: tuple[int, ...], what: str) -> tuple[int, int, int]:
    if len(shape) == 1:
        return (1, 1, shape[0])
    if len(shape) == 2:
        return (1, shape[0], shape[1])
    if len(shape) == 3:
        return (shape[0], shape[1], shape[2])
    raise DataError(
        f"{what}: examples must be [features], [height, width] or [channels, height, width]; "
        f"got examples of shape {shape}"
    )


def _images(x, what: str) -> np.ndarray:
    try:
        array = np.asarray(x)
    except ValueError as exc:  # numpy refuses ragged nested lists
        raise DataError(
            f"{what} is ragged: every example must have the same shape ({exc})"
        ) from None
    if array.dtype == object:
        raise DataError(f"{what} is ragged or not numeric: every example must have one shape")
    if array.ndim < 2 or array.shape[0] == 0:
        raise DataError(
            f"{what} must be [examples, ...] with at least one example, got {array.shape}"
        )
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array.reshape(len(array), -1))
    if not np.issubdtype(array.dtype, np.floating):
        raise DataError(
            f"{what} has type {array.dtype}: give uint8 pixels (scaled by 1/255 and normalised "
            "with data.mean and data.std) or floats (used as given)"
        )
    flat = np.ascontiguousarray(array.reshape(len(array), -1), dtype=np.float32)
    bad = ~np.isfinite(flat)
    if bad.any():
        row = int(np.argwhere(bad.any(axis=1))[0, 0])
        raise DataError(f"{what} has NaN or infinite features (the first in example {row})")
    return flat


def _labels(y, n: int, what: str) -> np.ndarray:
    labels = np.asarray(y)
    if labels.ndim != 1 or len(labels) != n:
        raise DataError(
            f"{what} must be one class index per example ({n}), got shape {labels.shape}"
        )
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        whole = np.issubdtype(labels.dtype, np.floating) and np.all(np.mod(labels, 1) == 0)
        if not whole:
            raise DataError(f"{what} must hold integer class indices, got {labels.dtype} values")
    if labels.size and (labels.min() < 0 or labels.max() > np.iinfo(LABEL_TYPE).max):
        raise DataError(
            f"{what}: class indices must be 0 .. classes - 1, found {labels.min()} .. "
            f"{labels.max()}"
        )
    return labels.astype(LABEL_TYPE)


def _regression(x: np.ndarray, y, what: str) -> tuple[np.ndarray, int]:
    """Rows of ``x`` (floats) with the targets ``y`` (``[n]`` or ``[n, k]``) after them."""
    if x.dtype != np.float32:
        raise DataError(f"{what} X: a regression's examples must be floats (used as given)")
    targets = np.asarray(y, dtype=np.float64)
    targets = targets[:, None] if targets.ndim == 1 else targets
    if targets.ndim != 2 or len(targets) != len(x):
        raise DataError(
            f"{what} y must be [n] or [n, values] target values for the {len(x)} examples, got "
            f"shape {np.shape(y)}"
        )
    if not np.isfinite(targets).all():
        raise DataError(f"{what} y has NaN or infinite target values")
    rows = np.concatenate([x, targets.astype(np.float32)], axis=1)
    return np.ascontiguousarray(rows), targets.shape[1]


def array_data(data, test_data=None, regression: bool = False) -> ArrayData:
    """``data`` and ``test_data`` (each ``(X, y)``; no test split without ``test_data``)
    checked and laid out for the arena. ``regression``: ``y`` holds target values (``[n]`` or
    ``[n, values]``, for a model that ends in mse), carried in each row after the input.

    Raises:
        DataError: a pair is not ``(X, y)``, an array is ragged, of another type, holds NaN or
            infinities, its labels are not class indices, or the test examples' shape or type
            differ from the training examples'.
    """
    pairs = {"data": data, "test_data": test_data}
    for name, pair in pairs.items():
        if pair is not None and (not isinstance(pair, tuple | list) or len(pair) != 2):
            raise DataError(f"{name} must be a pair (X, y) of arrays, got {type(pair).__name__}")
    if regression:
        return _regression_data(data, test_data)
    train_x = _images(data[0], "data X")
    shape = _example_shape(np.shape(data[0])[1:], "data X")
    train_y = _labels(data[1], len(train_x), "data y")
    if test_data is None:
        test_x = train_x[:0]
        test_y = train_y[:0]
    else:
        test_x = _images(test_data[0], "test_data X")
        test_shape = _example_shape(np.shape(test_data[0])[1:], "test_data X")
        if test_shape != shape:
            raise DataError(
                f"test_data X has examples of shape {test_shape}, data X of shape {shape}"
            )
        if test_x.dtype != train_x.dtype:
            raise DataError(
                f"test_data X is {np.asarray(test_data[0]).dtype} but data X is "
                f"{np.asarray(data[0]).dtype}: give both as uint8 pixels or both as floats"
            )
        test_y = _labels(test_data[1], len(test_x), "test_data y")
    n_classes = int(max(train_y.max(), test_y.max() if len(test_y) else 0)) + 1
    return ArrayData(train_x, train_y, test_x, test_y, shape, n_classes)


def _regression_data(data, test_data) -> ArrayData:
    train_x = _images(data[0], "data X")
    shape = _example_shape(np.shape(data[0])[1:], "data X")
    train_rows, k = _regression(train_x, data[1], "data")
    test_rows = train_rows[:0]
    if test_data is not None:
        test_x = _images(test_data[0], "test_data X")
        if _example_shape(np.shape(test_data[0])[1:], "test_data X") != shape:
            raise DataError("test_data X's examples differ in shape from data X's")
        test_rows, test_k = _regression(test_x, test_data[1], "test_data")
        if test_k != k:
            raise DataError(f"test_data y has {test_k} target values per example, data y {k}")
    zeros = np.zeros(len(train_rows), dtype=LABEL_TYPE)
    return ArrayData(
        train_rows, zeros, test_rows, zeros[: len(test_rows)].copy(), shape, k, n_targets=k
    )
