"""Pin processes to CPUs and place memory on NUMA nodes.

Pinning uses ``os.sched_setaffinity`` and needs nothing else. Memory placement has two ways:

- **first touch** (always available): Linux puts a page on the node of the CPU that first writes
  it. A worker that is pinned *before* it allocates and :func:`first_touch`\\ es its training
  context and scratch gets them on its own node. This is the default and all a one-node machine
  needs.
- **libnuma** (when ``libnuma.so.1`` is installed; looked up at run time with ctypes, never a hard
  dependency): :func:`bind_memory` pins a range's pages to a node, :func:`interleave_memory`
  spreads them round-robin over nodes (the shared parameters' ``"interleave"`` mode); both call
  ``mbind`` with ``MPOL_MF_MOVE``, because libnuma's own ``numa_tonode_memory`` only sets the
  policy for pages not yet allocated, and a shared segment's pages are reserved when it is made.
  :func:`set_preferred_node` steers this process's later first touches, and
  :func:`memory_nodes` asks where pages are (``move_pages``).

Every libnuma call returns False instead of failing when libnuma is missing or reports NUMA as
unavailable, so callers fall back to first touch. Ranges are widened to whole pages, as ``mbind``
requires: a buffer that shares its first or last page with another gets that page bound too.

Adam (§3.2.1) allocates each thread's training context and scratch NUMA-aware, and (§3.3.1)
binds shard-processing threads to the node holding the shard; this is how hogwild does both.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Iterable, Iterator

import numpy as np

from hogwild.errors import HogwildError
from hogwild.numa.placement import WorkerPlacement
from hogwild.numa.topology import MachineTopology, format_cpulist

__all__ = [
    "PinningError",
    "bind_memory",
    "first_touch",
    "helper_cpus",
    "helpers_on",
    "interleave_memory",
    "libnuma_available",
    "memory_nodes",
    "pin_to_cpus",
    "pin_worker",
    "set_preferred_node",
]

PAGE = mmap.PAGESIZE
MPOL_BIND = 2
MPOL_INTERLEAVE = 3
MPOL_MF_STRICT = 1 << 0  # with MOVE: fail (EIO) if a page could not be moved
MPOL_MF_MOVE = 1 << 1  # move pages already allocated (those mapped by this process alone)


class PinningError(HogwildError):
    """A process cannot be pinned to the CPUs asked for."""


def pin_to_cpus(cpus: Iterable[int], pid: int = 0) -> set[int]:
    """Restrict process ``pid`` (0: this one) to ``cpus``.

    Returns:
        The CPUs it was allowed before, to restore later.

    Raises:
        PinningError: ``cpus`` is empty or holds no CPU this process may use.
    """
    wanted = set(cpus)
    before = os.sched_getaffinity(pid)
    if not wanted:
        raise PinningError("cannot pin to an empty set of CPUs")
    try:
        os.sched_setaffinity(pid, wanted)
    except OSError as exc:
        raise PinningError(
            f"cannot pin process {pid or os.getpid()} to CPUs {format_cpulist(wanted)}: {exc} "
            f"(allowed: {format_cpulist(before)})"
        ) from exc
    return before


def pin_worker(
    placement: WorkerPlacement, topology: MachineTopology | None = None, scope: str = "cpu"
) -> set[int]:
    """Pin this process where its placement says, before it allocates anything large.

    Args:
        placement: From :func:`hogwild.numa.placement.plan_workers`.
        topology: Needed for ``scope="node"``.
        scope: ``"cpu"`` pins to the one CPU; ``"node"`` to all of the node's CPUs (the
            scheduler may move it within the node, memory stays local).

    Returns:
        The CPUs allowed before.
    """
    if scope == "cpu":
        cpus: Iterable[int] = [placement.cpu]
    elif scope == "node":
        if topology is None:
            raise PinningError("pin_worker(scope='node') needs the topology")
        cpus = next(n.cpus for n in topology.nodes if n.node == placement.node)
    else:
        raise PinningError(f"pin scope must be 'cpu' or 'node', got {scope!r}")
    before = pin_to_cpus(cpus)
    set_preferred_node(placement.node)
    return before


def helper_cpus(
    placement: WorkerPlacement, allowed: Iterable[int], topology: MachineTopology
) -> set[int]:
    """The CPUs a pinned worker's helper threads may use: those of its NUMA node that it was
    allowed before it was pinned (``allowed``), its own CPU when there are none."""
    node = next((n.cpus for n in topology.nodes if n.node == placement.node), ())
    return (set(allowed) & set(node)) or {placement.cpu}


@contextlib.contextmanager
def helpers_on(cpus: Iterable[int]) -> Iterator[None]:
    """Threads started inside the block may run on ``cpus`` once it ends; this thread keeps
    its own CPUs throughout.

    A worker's helpers (a copy's exchange thread, ZeroMQ's I/O thread) serve its training but do
    not compute: pinned to the worker's CPU they take their time from its training even while
    another CPU of the node stands idle. A thread inherits its creator's CPUs when it starts
    (Linux affinity is per thread), and some are started inside libraries (ZeroMQ's), so each
    thread new since the block began is given ``cpus`` as it ends. The calling thread is never
    widened meanwhile: another job reads a worker's CPU from it (:mod:`hogwild.numa.claims`),
    and a worker seen unpinned for that moment would be planned over.
    """
    wanted = set(cpus)
    before = _threads()
    try:
        yield
    finally:
        for thread in _threads() - before:
            with contextlib.suppress(OSError):  # ended meanwhile
                os.sched_setaffinity(thread, wanted)


def _threads() -> set[int]:
    """The ids of this process's threads (empty where ``/proc`` cannot tell)."""
    try:
        return {int(name) for name in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def first_touch(array: np.ndarray) -> None:
    """Write zeros over ``array`` so its pages are allocated now, on this CPU's node."""
    array.view(np.uint8).reshape(-1)[:] = 0


# --------------------------------------------------------------------------------- libnuma

_LIB: ctypes.CDLL | None = None
_LOADED = False


def _libnuma() -> ctypes.CDLL | None:
    """libnuma, loaded once, or None when it is absent or NUMA is unavailable."""
    global _LIB, _LOADED
    if _LOADED:
        return _LIB
    _LOADED = True
    name = ctypes.util.find_library("numa") or "libnuma.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.numa_available.restype = ctypes.c_int
    if lib.numa_available() < 0:
        return None
    lib.numa_max_node.restype = ctypes.c_int
    lib.numa_set_preferred.argtypes = [ctypes.c_int]
    lib.numa_set_preferred.restype = None
    lib.numa_move_pages.argtypes = [
        ctypes.c_int,
        ctypes.c_ulong,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_int,
    ]
    lib.numa_move_pages.restype = ctypes.c_int
    lib.mbind.argtypes = [
        ctypes.c_void_p,
        ctypes.c_ulong,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_ulong),
        ctypes.c_ulong,
        ctypes.c_uint,
    ]
    lib.mbind.restype = ctypes.c_long
    _LIB = lib
    return lib


def libnuma_available() -> bool:
    """Whether libnuma is installed and the kernel supports NUMA policy calls."""
    return _libnuma() is not None


def _page_range(array: np.ndarray) -> tuple[int, int]:
    start = array.ctypes.data
    end = start + max(array.nbytes, 1)
    first = start - start % PAGE
    return first, (end - first + PAGE - 1) // PAGE * PAGE


def _valid_node(lib: ctypes.CDLL, node: int) -> bool:
    return 0 <= node <= lib.numa_max_node()


def _mbind(lib: ctypes.CDLL, array: np.ndarray, mode: int, nodes: Iterable[int]) -> bool:
    """``mbind`` the pages under ``array`` with ``mode`` over ``nodes``, moving resident pages."""
    nodes = sorted(set(nodes))
    words = nodes[-1] // 64 + 1
    mask = (ctypes.c_ulong * words)()
    for n in nodes:
        mask[n // 64] |= 1 << (n % 64)
    start, size = _page_range(array)
    # maxnode counts one more than the mask's bits: the kernel drops the last one.
    flags = MPOL_MF_MOVE | MPOL_MF_STRICT  # a page left where it was is a failure, not success
    return lib.mbind(start, size, mode, mask, words * 64 + 1, flags) == 0


def bind_memory(array: np.ndarray, node: int) -> bool:
    """Bind the pages under ``array`` to ``node`` (``mbind``), moving pages already allocated.

    Returns:
        True if libnuma did it; False without libnuma, for a node that does not exist, or when
        the kernel refused.
    """
    lib = _libnuma()
    if lib is None or not _valid_node(lib, node):
        return False
    return _mbind(lib, array, MPOL_BIND, [node])


def interleave_memory(array: np.ndarray, nodes: Iterable[int]) -> bool:
    """Spread the pages under ``array`` round-robin over ``nodes`` (for shared parameters).

    Pages already allocated are moved (only those no other process maps yet: call it before
    the workers attach).

    Returns:
        True if libnuma did it; False without libnuma, when a node is not one the kernel knows
        (the pages are then spread over the others), or when the kernel refused.
    """
    lib = _libnuma()
    if lib is None:
        return False
    wanted = set(nodes)
    valid = [n for n in wanted if _valid_node(lib, n)]
    if not valid:
        return False
    return _mbind(lib, array, MPOL_INTERLEAVE, valid) and len(valid) == len(wanted)


def set_preferred_node(node: int) -> bool:
    """Prefer ``node`` for this process's future first touches (no-op without libnuma)."""
    lib = _libnuma()
    if lib is None or not _valid_node(lib, node):
        return False
    lib.numa_set_preferred(node)
    return True


def memory_nodes(array: np.ndarray) -> list[int] | None:
    """The node of each page under ``array`` (negative: not yet touched), or None w/o libnuma."""
    lib = _libnuma()
    if lib is None:
        return None
    start, size = _page_range(array)
    count = size // PAGE
    pages = (ctypes.c_void_p * count)(*(start + i * PAGE for i in range(count)))
    status = (ctypes.c_int * count)()
    if lib.numa_move_pages(0, count, pages, None, status, 0) != 0:
        return None
    return list(status)
