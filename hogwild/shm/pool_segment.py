"""The POSIX shared-memory segment a buffer pool or a queue lives in.

A :class:`SharedSegment` is one ``/dev/shm`` object mapped with ``mmap`` into this process. The
process that creates it is its *owner*: it removes the name on :meth:`SharedSegment.unlink`, on
``close``, and at the latest when it exits (registered with
:func:`hogwild.shm.sweeper.own_segment`, which also covers forked children that skip ``atexit``),
so no exit path but a hard kill leaves it behind, and a hard kill is what
:func:`hogwild.shm.sweeper.sweep` cleans up after: names come from
:func:`hogwild.shm.naming.segment_name` and record the owner's pid.
Attached processes only unmap. The mapping itself stays valid until the last numpy view over it
is gone, even after ``close``.

The parameter arena (:mod:`hogwild.shm.arena`) holds the model; pools and queues get segments of
their own so that a parameter server can size them independently of any model.
"""

from __future__ import annotations

import mmap
import os
import shutil

import numpy as np
import posix_ipc

from hogwild.errors import SharedMemoryError
from hogwild.shm import sweeper
from hogwild.shm.naming import segment_name

__all__ = ["SharedSegment", "new_segment_name"]


_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Python < 3.12 lacks the name (Linux)


def new_segment_name(kind: str) -> str:
    """A fresh segment name for a pool or a queue owned by this process.

    Args:
        kind: What lives in it (``"pool"``, ``"queue"``); it becomes the job part of the name.

    Returns:
        ``/hogwild-<kind>-<pid>-...``, unique and parseable by :mod:`hogwild.shm.naming`.
    """
    return segment_name(kind)


def _dev_shm_free() -> str:
    try:
        return f"{shutil.disk_usage('/dev/shm').free / 2**20:.0f} MiB free in /dev/shm"
    except OSError:
        return "free space in /dev/shm unknown"


class SharedSegment:
    """A mapped POSIX shared-memory segment.

    Attributes:
        name: The segment's name (``/hogwild-...``), what other processes attach by.
        size: Its size in bytes.
        owner: Whether this process created it (and so removes it).
    """

    def __init__(self, name: str, size: int, mapping: mmap.mmap, owner: bool) -> None:
        self.name = name
        self.size = size
        self.owner = owner
        self._mmap: mmap.mmap | None = mapping
        self._owner_pid = os.getpid() if owner else None

    @classmethod
    def create(cls, kind: str, size: int) -> SharedSegment:
        """Create and map a new zero-filled segment owned by this process.

        Args:
            kind: Job part of the name (``"pool"``, ``"queue"``).
            size: Bytes; pages are only backed by memory once touched.

        Raises:
            SharedMemoryError: The segment cannot be created (the message says how much
                ``/dev/shm`` is free).
        """
        if size <= 0:
            raise SharedMemoryError(f"a shared segment needs a positive size, got {size}")
        name = new_segment_name(kind)
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        except (posix_ipc.Error, OSError, ValueError) as exc:
            raise SharedMemoryError(
                f"cannot create shared segment {name} of {size} bytes: {exc} ({_dev_shm_free()})"
            ) from exc
        sweeper.own_segment(name)
        try:
            mapping = mmap.mmap(shm.fd, size)
        except OSError as exc:
            sweeper.unlink_segment(name)
            raise SharedMemoryError(
                f"cannot map shared segment {name} of {size} bytes: {exc} ({_dev_shm_free()})"
            ) from exc
        finally:
            shm.close_fd()
        return cls(name, size, mapping, owner=True)

    @classmethod
    def private(cls, size: int) -> SharedSegment:
        """Map ``size`` zero-filled bytes for this process (and children it forks) alone: no
        name in ``/dev/shm``, so nothing to remove, even after a SIGKILL, and none of its space
        used. Nobody can attach it.

        Raises:
            SharedMemoryError: The memory cannot be mapped.
        """
        if size <= 0:
            raise SharedMemoryError(f"a shared segment needs a positive size, got {size}")
        try:  # reserve nothing up front: pages are memory once written, as a /dev/shm file's
            mapping = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | _MAP_NORESERVE)
        except OSError as exc:
            raise SharedMemoryError(f"cannot map {size} bytes of private memory: {exc}") from exc
        return cls("", size, mapping, owner=False)

    @classmethod
    def attach(cls, name: str) -> SharedSegment:
        """Map an existing segment created by another process (or this one).

        Raises:
            SharedMemoryError: No segment of that name exists, or it cannot be mapped.
        """
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.Error as exc:
            raise SharedMemoryError(f"cannot attach shared segment {name}: {exc}") from exc
        try:
            size = shm.size
            mapping = mmap.mmap(shm.fd, size)
        except (OSError, ValueError) as exc:
            raise SharedMemoryError(f"cannot map shared segment {name}: {exc}") from exc
        finally:
            shm.close_fd()
        return cls(name, size, mapping, owner=False)

    def array(self, offset: int, dtype: np.dtype | type, count: int) -> np.ndarray:
        """A numpy view of ``count`` items of ``dtype`` starting ``offset`` bytes in."""
        if self._mmap is None:
            raise SharedMemoryError(f"shared segment {self.name} is closed")
        return np.frombuffer(self._mmap, dtype=dtype, count=count, offset=offset)

    def unlink(self) -> None:
        """Remove the segment's name (owner only; existing mappings stay valid)."""
        if self._owner_pid is not None and self._owner_pid == os.getpid():
            sweeper.unlink_segment(self.name)
            self._owner_pid = None

    def close(self) -> None:
        """Unlink (if owner) and drop this object's mapping.

        Numpy views already handed out keep the memory mapped until they are collected.
        """
        self.unlink()
        mapping, self._mmap = self._mmap, None
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # views still exported; the mapping goes when the last one does

    def __enter__(self) -> SharedSegment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
