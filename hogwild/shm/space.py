"""Room in ``/dev/shm``: how much is free, and reserving a new segment's pages up front.

A segment's pages are allocated when it is made (``posix_fallocate``), so a full ``/dev/shm`` is
a :class:`~hogwild.errors.SharedMemoryError` at creation saying how much was needed and how much
is free, never a SIGBUS in a worker that touches a page later.
"""

from __future__ import annotations

import errno
import os

from hogwild.errors import SharedMemoryError

SHM_DIR = "/dev/shm"
"""Where the kernel shows POSIX shared-memory segments (a tmpfs on Linux)."""

_MB = 1024 * 1024


def shm_free_bytes() -> int | None:
    """Bytes free for unprivileged use in ``/dev/shm``, or None if it cannot be measured."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def too_little_space(name: str, needed: int, free: int | None) -> SharedMemoryError:
    free_text = "an unknown amount" if free is None else f"{free} bytes ({free / _MB:.1f} MB)"
    return SharedMemoryError(
        f"cannot create shared-memory segment {name}: it needs {needed} bytes "
        f"({needed / _MB:.1f} MB) but {SHM_DIR} has {free_text} free. Remove dead segments with "
        f"`hogwild shm gc`, make the model smaller, or enlarge {SHM_DIR} "
        f"(docker: --shm-size)."
    )


def reserve_pages(fd: int, name: str, size: int) -> None:
    """Allocate every page of a new segment now, so running out of space fails here."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM):
            raise too_little_space(name, size, shm_free_bytes()) from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise SharedMemoryError(
                f"cannot reserve {size} bytes for segment {name}: {exc}"
            ) from exc
        # This filesystem cannot reserve space: the pages come on first touch instead.
