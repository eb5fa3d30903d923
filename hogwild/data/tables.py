"""Examples from ``.npz`` and CSV files, read into the ``(X, y)`` arrays of
:mod:`hogwild.data.arrays`.

* ``.npz``: either the four arrays ``x_train``, ``y_train``, ``x_test``, ``y_test`` (Keras'
  layout), or ``x`` and ``y`` (or ``X`` and ``y``), of which a held-back fraction is the test
  split.
* CSV: a header row naming the columns, one example per row; ``target`` names the column of class
  indices, every other column is a feature (a number; read as float64, kept as float32 and used
  as given). A held-back fraction of the rows is the test split.

The held-back rows are chosen by a permutation seeded with the job's seed, so a job sees the same
split every run.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from hogwild.errors import DataError

TABLE_SUFFIXES = (".npz", ".csv")


def is_table(source) -> bool:
    """Whether ``source`` names a file this module reads (by its suffix)."""
    return isinstance(source, str | os.PathLike) and Path(source).suffix.lower() in TABLE_SUFFIXES


def hold_back(x: np.ndarray, y: np.ndarray, fraction: float, seed: int):
    """``((x, y) to train on, (x, y) to test on)``: ``fraction`` of the rows, chosen by a
    permutation seeded with ``seed``, held back for testing (at least one row when any)."""
    if not 0.0 <= fraction < 1.0:
        raise DataError(f"test_fraction must be in [0, 1), got {fraction}")
    n = len(y)
    n_test = int(round(n * fraction)) if fraction else 0
    n_test = max(n_test, 1) if fraction and n > 1 else n_test
    order = np.random.default_rng(seed).permutation(n)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), ((x[test], y[test]) if n_test else None)


def read_table(source, target: str | None, fraction: float, seed: int):
    """``(data, test_data)`` pairs of arrays from a ``.npz`` or CSV file (see the module).

    Raises:
        DataError: the file is missing or malformed, the arrays or the target column are not
            there, or a feature is not a number.
    """
    path = Path(source)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix.lower() == ".npz":
        return _read_npz(path, fraction, seed)
    if not target:
        raise DataError(f"{path}: a CSV file needs the name of its label column (target=...)")
    return _read_csv(path, target, fraction, seed)


def _read_npz(path: Path, fraction: float, seed: int):
    try:
        with np.load(path, allow_pickle=False) as arrays:
            found = dict(arrays.items())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable .npz file ({exc})") from None
    if {"x_train", "y_train", "x_test", "y_test"} <= set(found):
        return (found["x_train"], found["y_train"]), (found["x_test"], found["y_test"])
    x = found.get("x", found.get("X"))
    if x is None or "y" not in found:
        raise DataError(
            f"{path} holds {', '.join(sorted(found)) or 'no arrays'}; expected x_train, "
            "y_train, x_test, y_test, or x and y (a fraction held back for testing)"
        )
    return hold_back(x, found["y"], fraction, seed)


def _read_csv(path: Path, target: str, fraction: float, seed: int):
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    if len(rows) < 2:
        raise DataError(f"{path}: expected a header row and at least one example")
    header = [name.strip() for name in rows[0]]
    if target not in header:
        raise DataError(f"{path}: no column {target!r}; the columns are {', '.join(header)}")
    column = header.index(target)
    features, labels = [], []
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise DataError(f"{path}, line {line}: {len(row)} values, the header has {len(header)}")
        try:
            values = [float(v) for v in row]
        except ValueError:
            bad = next(v for v in row if not _is_number(v))
            raise DataError(f"{path}, line {line}: {bad!r} is not a number") from None
        labels.append(values.pop(column))
        features.append(values)
    return hold_back(np.array(features), np.array(labels), fraction, seed)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
