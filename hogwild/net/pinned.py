"""Long-lived zero-copy frames over buffers a sender keeps for its life (a replica's push buffer).

An array sent with ``copy=False`` becomes a new ``zmq.Frame`` every time, and pyzmq cannot know
when ZeroMQ's I/O thread is done with it: ZeroMQ calls back from that thread, and pyzmq hands the
release to its garbage-collector thread over an inproc socket, which wakes, takes the GIL and
drops the reference. For a 1 MiB push that is a thread wake-up and a GIL handover per frame, on
a machine where the client has one core to itself at best.

A frame sent again shares its content with ZeroMQ (pyzmq sends a reference-counted copy of the
message, never the data), so a buffer the sender will not free can be wrapped once and sent any
number of times without that round trip. :class:`PinnedFrames` holds such frames for ranges of
the arrays its owner pinned (the array itself is named when sending a range: a view of it is
another object, sent as it is). The contract is the one of any
zero-copy send: the caller leaves the bytes unchanged until the request is answered; pinning
adds only that the array stays referenced until :meth:`PinnedFrames.unpin` or
:meth:`PinnedFrames.clear`.
"""

from __future__ import annotations

import numpy as np
import zmq

__all__ = ["PinnedFrames"]

MIN_BYTES = 64 << 10  # smaller frames pyzmq copies anyway (its copy threshold): nothing to save
MAX_FRAMES = 4096  # frames kept per pinned array (the ranges a replica pushes are a few)


class PinnedFrames:
    """Frames over ranges of pinned arrays, one per (array, start, stop) sent, made on first use."""

    def __init__(self) -> None:
        # id(array) -> the array (held, so its id stays unique) and its frames by (start, stop)
        self._pinned: dict[int, tuple[np.ndarray, dict[tuple[int, int], zmq.Frame]]] = {}

    def pin(self, array: np.ndarray) -> None:
        """Send ranges of ``array`` (a C-contiguous array) as long-lived frames from now on."""
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise TypeError(
                f"only a C-contiguous numpy array can be pinned, got {type(array).__name__}"
            )
        self._pinned.setdefault(id(array), (array, {}))

    def unpin(self, array: np.ndarray) -> None:
        """Forget ``array`` and its frames (ZeroMQ keeps what it still sends alive itself)."""
        self._pinned.pop(id(array), None)

    def clear(self) -> None:
        self._pinned.clear()

    def range(self, array: np.ndarray, start: int, stop: int):
        """``array[start:stop]`` to send: a long-lived frame when ``array`` is pinned and the range
        is large, the view itself otherwise."""
        pinned = self._pinned.get(id(array))
        if pinned is None:
            return array[start:stop]
        frames = pinned[1]
        frame = frames.get((start, stop))
        if frame is None:
            view = array[start:stop]
            if view.nbytes < MIN_BYTES:
                return view
            if len(frames) >= MAX_FRAMES:
                frames.clear()
            frame = frames[(start, stop)] = zmq.Frame(view, copy=False)
        return frame

    def frames_of(self, array: np.ndarray) -> int:
        """How many long-lived frames ``array`` has now (0 when it is not pinned)."""
        pinned = self._pinned.get(id(array))
        return len(pinned[1]) if pinned else 0
