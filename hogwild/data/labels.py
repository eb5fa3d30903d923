"""Labels checked where they enter: every label must be a class index, ``0..n_classes - 1``.

The training kernels use a label as an index into the output layer's errors without a bounds
check (numba checks none), so a label from a file or the network is checked before anything
reads it as an index: an ingest's labels, an LMDB cache's label array and each record read from
it, and a data server's reply. :func:`check_labels` names the first label out of range and where
it came from.
"""

from __future__ import annotations

import numpy as np

from hogwild.errors import DataError

__all__ = ["LABEL_DTYPE", "check_labels"]

# The labels' type wherever the kernels take them (:mod:`hogwild.model.loops`: one compilation
# for every source); int32: a feed's labels, and the data server's wire format, are int32,
# whatever the data set. Here, not beside the kernels: a job's layout needs it without them.
LABEL_DTYPE = np.int32


def check_labels(labels: np.ndarray, n_classes: int, where: str, records=None) -> None:
    """Raise :class:`DataError` unless every label is in ``0..n_classes - 1``.

    Args:
        labels: The labels (any integer array).
        n_classes: How many classes there are.
        where: What holds them (a file, a split, a server), named in the error.
        records: The record index of each label (default: its position), named in the error.
    """
    if not labels.size:
        return
    low, high = int(labels.min()), int(labels.max())
    if low >= 0 and high < n_classes:
        return
    bad = np.flatnonzero((labels < 0) | (labels >= n_classes))
    first = int(bad[0])
    record = first if records is None else int(records[first])
    raise DataError(
        f"{where}: record {record} has label {int(labels[first])}, expected a class index "
        f"0..{n_classes - 1} ({bad.size} of {labels.size} labels out of range)"
    )
