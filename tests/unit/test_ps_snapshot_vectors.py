"""A snapshot's named vectors (plugins/ps/replication/frames.py): what a copy accepts, checked,
before its restore replaces its own (issue 13)."""

from __future__ import annotations

import numpy as np
import pytest
from hogwild_plugins.ps.replication.frames import parse_vectors

from hogwild.net.wire import ErrorCode, WireError

SIZE = 6


def frames(names: bytes, rows: int) -> tuple[np.ndarray, np.ndarray]:
    values = np.arange(rows * SIZE, dtype=np.float32)
    return np.frombuffer(names, np.uint8), values


def test_names_and_rows_become_the_named_vectors():
    assert parse_vectors(*frames(b"", 0), SIZE) == {}
    vectors = parse_vectors(*frames(b"grad,s_0.x-1", 2), SIZE)
    assert list(vectors) == ["grad", "s_0.x-1"]
    np.testing.assert_array_equal(vectors["s_0.x-1"], np.arange(SIZE, 2 * SIZE))


@pytest.mark.parametrize(
    ("names", "rows", "code"),
    [
        (b"params", 1, ErrorCode.BAD_NAME),  # the parameters travel as the values
        (b"grad,grad", 2, ErrorCode.BAD_NAME),
        (b"grad,", 2, ErrorCode.BAD_NAME),  # an empty name
        (b"a b", 1, ErrorCode.BAD_NAME),
        (b"\xff", 1, ErrorCode.BAD_NAME),
        (b"x" * 65, 1, ErrorCode.BAD_NAME),
        (b"grad,d", 1, ErrorCode.BAD_FRAMES),  # a row short
        (b"grad", 2, ErrorCode.BAD_FRAMES),  # a row too many
        (b"", 1, ErrorCode.BAD_FRAMES),
    ],
)
def test_a_bad_snapshot_of_named_vectors_is_refused(names, rows, code):
    with pytest.raises(WireError) as caught:
        parse_vectors(*frames(names, rows), SIZE)
    assert caught.value.code == code
