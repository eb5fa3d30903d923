"""Long-lived frames over pinned buffers (hogwild.net.pinned): made once per range, never for
an array that is not pinned or a range pyzmq would copy anyway."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from hogwild.net.pinned import MIN_BYTES, PinnedFrames


def test_a_pinned_range_is_one_frame_over_the_buffer_and_others_stay_views():
    pinned = PinnedFrames()
    buffer = np.arange(4 * MIN_BYTES // 4, dtype=np.float32)
    other = buffer.copy()
    pinned.pin(buffer)
    big = pinned.range(buffer, 0, MIN_BYTES // 4)
    assert isinstance(big, zmq.Frame)
    assert pinned.range(buffer, 0, MIN_BYTES // 4) is big  # made once, sent many times
    assert bytes(big.buffer) == buffer[: MIN_BYTES // 4].tobytes()
    buffer[0] = -1.0  # no copy: the frame shows the buffer as it is now
    assert np.frombuffer(big.buffer, np.float32)[0] == -1.0
    small = pinned.range(buffer, 0, 10)
    assert isinstance(small, np.ndarray) and np.shares_memory(small, buffer)
    view = pinned.range(other, 0, MIN_BYTES // 4)  # not pinned
    assert isinstance(view, np.ndarray) and np.shares_memory(view, other)
    assert pinned.frames_of(buffer) == 1 and pinned.frames_of(other) == 0
    pinned.unpin(buffer)
    assert isinstance(pinned.range(buffer, 0, MIN_BYTES // 4), np.ndarray)
    assert pinned.frames_of(buffer) == 0


def test_only_a_contiguous_numpy_array_can_be_pinned():
    pinned = PinnedFrames()
    with pytest.raises(TypeError, match="C-contiguous numpy array"):
        pinned.pin(np.zeros((64, 64), np.float32)[:, ::2])
    with pytest.raises(TypeError, match="got bytearray"):
        pinned.pin(bytearray(100))
