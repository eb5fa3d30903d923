"""The arena: one POSIX shared-memory segment holding named, 64-byte aligned numpy regions.

The trainer lays out every parameter and optimizer-state array in an :class:`ArenaLayout`,
creates one :class:`Arena` from it and hands workers the arena's name and the layout's JSON; each
worker attaches and gets numpy views of the very same pages, updated in place without locks or
copies (Project Adam's single-machine workers, Hogwild-style).

Invariants:

- Every region's offset is a multiple of ``ALIGN`` (64 bytes) and the mapping's base is
  page-aligned, so every array is 64-byte aligned (checked each time a view is made).
- A new segment is zero-filled and its pages are reserved up front (``posix_fallocate``), so a
  full ``/dev/shm`` fails at creation with a :class:`SharedMemoryError` saying how much was needed
  and how much is free, not with a SIGBUS in a worker later. A half-made segment is removed first.
- One owner: the creating process removes the segment in :meth:`Arena.unlink`, ``__exit__``, or
  at the latest when it exits (registered with :func:`hogwild.shm.sweeper.own_segment`). A
  SIGKILLed owner cannot; :func:`hogwild.shm.sweeper.sweep` removes its segments later.

Views keep the mapping alive: drop every array from :meth:`Arena.array` before
:meth:`Arena.close`. If some remain, ``close`` does not fail; the garbage collector unmaps once the
last view is gone.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import posix_ipc
from numpy.typing import DTypeLike

from hogwild.errors import SharedMemoryError
from hogwild.shm import sweeper
from hogwild.shm.naming import segment_name
from hogwild.shm.space import reserve_pages, shm_free_bytes, too_little_space
from hogwild.signals import deferred_signals

log = logging.getLogger(__name__)

ALIGN = 64
"""Alignment of every region's offset, in bytes (one cache line)."""


def _align_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


@dataclass(frozen=True)
class Region:
    """One named array inside an arena.

    Attributes:
        name: The region's name, unique in its layout.
        dtype: The element type.
        shape: The array's shape (C order).
        offset: Byte offset from the start of the segment; a multiple of ``ALIGN``.
        nbytes: Size of the array in bytes.
        align: The alignment it was placed with (a multiple of ``ALIGN``).
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    align: int = ALIGN


class ArenaLayout:
    """An ordered list of regions, each starting 64-byte aligned after the previous one."""

    def __init__(self) -> None:
        """Start an empty layout."""
        self._regions: dict[str, Region] = {}
        self._end = 0

    def add(
        self, name: str, dtype: DTypeLike, shape: int | tuple[int, ...], align: int = ALIGN
    ) -> Region:
        """Append a region.

        Args:
            name: Unique name of the region.
            dtype: A plain numeric numpy dtype (bool, integer, float or complex).
            shape: The array's shape; an int is a 1-D shape.
            align: Where it may start: a power-of-two multiple of ``ALIGN`` (``mmap.PAGESIZE``
                for a region whose pages are placed on NUMA nodes on their own).

        Returns:
            The new region, starting at the next multiple of ``align``.

        Raises:
            ValueError: The name is taken, the dtype is not plain numeric, a dimension is
                negative, or ``align`` is not a power-of-two multiple of ``ALIGN``.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"region name must be a non-empty string, got {name!r}")
        if name in self._regions:
            raise ValueError(f"region {name!r} is already in the layout")
        dt = np.dtype(dtype)
        if dt.kind not in "biufc" or dt.fields is not None or dt.subdtype is not None:
            raise ValueError(f"region {name!r}: dtype must be plain numeric, got {dt}")
        dims = (
            (int(shape),) if isinstance(shape, int | np.integer) else tuple(int(d) for d in shape)
        )
        if any(d < 0 for d in dims):
            raise ValueError(f"region {name!r}: shape must not be negative, got {dims}")
        if align < ALIGN or align & (align - 1):
            raise ValueError(
                f"region {name!r}: align must be a power of two >= {ALIGN}, got {align}"
            )
        offset = _align_up(self._end, align)
        nbytes = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
        region = Region(name, dt, dims, offset, nbytes, align)
        self._regions[name] = region
        self._end = offset + nbytes
        return region

    @property
    def regions(self) -> Mapping[str, Region]:
        """The regions by name, in the order they were added (a read-only view)."""
        return MappingProxyType(self._regions)

    @property
    def total_bytes(self) -> int:
        """Bytes the layout needs: the end of the last region, rounded up to ``ALIGN``."""
        return _align_up(self._end)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ArenaLayout):
            return NotImplemented
        return self._regions == other._regions

    def __repr__(self) -> str:
        return f"ArenaLayout({len(self._regions)} regions, {self.total_bytes} bytes)"

    def to_json(self) -> str:
        """The layout as JSON, for :meth:`from_json` in another process."""
        regions = [
            {
                "name": r.name,
                "dtype": r.dtype.str,
                "shape": list(r.shape),
                "offset": r.offset,
                "align": r.align,
            }
            for r in self._regions.values()
        ]
        return json.dumps({"version": 1, "regions": regions})

    @classmethod
    def from_json(cls, s: str) -> ArenaLayout:
        """Rebuild a layout written by :meth:`to_json`.

        Args:
            s: The JSON text.

        Returns:
            An equal layout.

        Raises:
            ValueError: The text is not a layout, or its offsets do not match this version's
                placement rule.
        """
        try:
            doc = json.loads(s)
            entries = doc["regions"]
            if doc.get("version") != 1:
                raise ValueError(f"unsupported layout version {doc.get('version')!r}")
            layout = cls()
            for entry in entries:
                region = layout.add(
                    entry["name"],
                    np.dtype(entry["dtype"]),
                    tuple(entry["shape"]),
                    entry.get("align", ALIGN),
                )
                if region.offset != entry["offset"]:
                    raise ValueError(
                        f"region {region.name!r} is at offset {entry['offset']} in the JSON "
                        f"but would be at {region.offset}"
                    )
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not an arena layout: {exc}") from exc
        return layout


class Arena:
    """A mapped shared-memory segment laid out by an :class:`ArenaLayout`.

    Make one with :meth:`create` (the owner) or :meth:`attach` (any other process). Use it as a
    context manager: leaving it closes the mapping, and removes the segment if this process owns
    it.

    Attributes:
        name: The segment's name (``/hogwild-...``), what other processes attach by.
        layout: The layout of the segment.
    """

    def __init__(self, name: str, layout: ArenaLayout, mm: mmap.mmap, owner_pid: int | None):
        """Wrap an existing mapping; use :meth:`create` or :meth:`attach` instead."""
        self.name = name
        self.layout = layout
        self._mm: mmap.mmap | None = mm
        self._size = len(mm)
        self._owner_pid = owner_pid
        base = np.frombuffer(mm, dtype=np.uint8, count=1)
        assert base.ctypes.data % mmap.PAGESIZE == 0, "mmap base is not page-aligned"
        del base

    @classmethod
    def create(cls, job: str, layout: ArenaLayout) -> Arena:
        """Create a new, zero-filled segment owned by this process.

        Args:
            job: The job's name, which goes into the segment's name.
            layout: What the segment holds.

        Returns:
            The mapped arena.

        Raises:
            SharedMemoryError: ``/dev/shm`` has too little free space (the message says how much
                was needed and how much is free), or the segment cannot be created or mapped.
        """
        size = _align_up(max(layout.total_bytes, 1), mmap.PAGESIZE)
        free = shm_free_bytes()
        if free is not None and size > free:
            raise too_little_space(segment_name(job), size, free)
        with deferred_signals():  # created and recorded as ours in one instant: never leaked
            for _ in range(3):
                name = segment_name(job)
                try:
                    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
                    break
                except posix_ipc.ExistentialError:
                    continue  # the 32 random bits collided: draw another name
                except (OSError, posix_ipc.Error) as exc:
                    raise SharedMemoryError(
                        f"cannot create segment {name} of {size} bytes: {exc}"
                    ) from exc
            else:
                raise SharedMemoryError(f"cannot find a free segment name for job {job!r}")
            sweeper.own_segment(name)
        try:
            reserve_pages(shm.fd, name, size)
            try:
                mm = mmap.mmap(shm.fd, size)
            except OSError as exc:
                raise SharedMemoryError(f"cannot map shared-memory segment {name}: {exc}") from exc
        except BaseException:
            sweeper.unlink_segment(name)
            raise
        finally:
            shm.close_fd()  # the mmap holds its own descriptor
        return cls(name, layout, mm, os.getpid())

    @classmethod
    def attach(cls, name: str, layout: ArenaLayout) -> Arena:
        """Map an existing segment, typically one another process created.

        Args:
            name: The segment's name, as in :attr:`name` of the creating arena.
            layout: The layout the creator used (e.g. rebuilt with :meth:`ArenaLayout.from_json`).

        Returns:
            The mapped arena; this process does not own it.

        Raises:
            SharedMemoryError: No such segment, or it is smaller than the layout.
        """
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError as exc:
            raise SharedMemoryError(
                f"no shared-memory segment named {name}: its owner may have exited "
                f"(see `hogwild shm ls`)"
            ) from exc
        except (OSError, posix_ipc.Error) as exc:
            raise SharedMemoryError(f"cannot open shared-memory segment {name}: {exc}") from exc
        try:
            size = shm.size
            if size < layout.total_bytes or size == 0:
                raise SharedMemoryError(
                    f"shared-memory segment {name} has {size} bytes but its layout needs "
                    f"{layout.total_bytes}: the layout does not belong to this segment"
                )
            try:
                mm = mmap.mmap(shm.fd, size)
            except OSError as exc:
                raise SharedMemoryError(f"cannot map shared-memory segment {name}: {exc}") from exc
        finally:
            shm.close_fd()
        return cls(name, layout, mm, None)

    @property
    def size(self) -> int:
        """Size of the segment in bytes (the layout's total, rounded up to whole pages)."""
        return self._size

    @property
    def is_owner(self) -> bool:
        """Whether this process created the segment (and so must remove it)."""
        return self._owner_pid == os.getpid()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._mm is None

    def array(self, region: str) -> np.ndarray:
        """A writable numpy view of one region: no copy, shared with every attached process.

        Args:
            region: The region's name in the layout.

        Returns:
            An array of the region's dtype and shape whose memory is the segment's. It keeps the
            mapping alive: drop it before :meth:`close`.

        Raises:
            KeyError: No such region.
            SharedMemoryError: The arena is closed.
        """
        if self._mm is None:
            raise SharedMemoryError(f"shared-memory segment {self.name} is closed in this process")
        try:
            r = self.layout.regions[region]
        except KeyError:
            raise KeyError(
                f"no region {region!r} in arena {self.name}; it has {sorted(self.layout.regions)}"
            ) from None
        # frombuffer keeps a buffer export on the mmap (np.ndarray(buffer=...) would not), so
        # close() cannot unmap the pages under a live view.
        count = r.nbytes // r.dtype.itemsize
        arr = np.frombuffer(self._mm, r.dtype, count=count, offset=r.offset).reshape(r.shape)
        assert arr.ctypes.data % ALIGN == 0, f"region {region!r} is not {ALIGN}-byte aligned"
        return arr

    def close(self) -> None:
        """Unmap the segment in this process; safe to call twice.

        Drop every view from :meth:`array` first. If views are still referenced the mapping
        cannot be closed now; it is then left to the garbage collector, which unmaps it (and
        closes its descriptor) once the last view is gone. Closing does not remove the segment.
        """
        mm, self._mm = self._mm, None
        if mm is None:
            return
        try:
            mm.close()
        except BufferError:
            log.debug("views of %s are still alive; the mapping is released with them", self.name)

    def unlink(self) -> None:
        """Remove the segment's name; safe to call twice, or when it is already gone.

        Processes that still have it mapped keep their mapping; the memory is freed when the
        last one unmaps.
        """
        sweeper.unlink_segment(self.name)

    def __enter__(self) -> Arena:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
        if self.is_owner:
            self.unlink()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        role = "owner" if self.is_owner else "attached"
        return f"<Arena {self.name} {self._size} bytes, {role}, {state}>"
