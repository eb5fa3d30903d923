"""The CPU caches one core sees: level, kind, size and how many CPUs share each.

Read from sysfs (``/sys/devices/system/cpu/cpuN/cache/index*``); a partition plan compares each
partition's working set per layer against these sizes (Adam section 3.2.4: partitions sized so a
layer's working set fits in the L3 cache). Instruction caches are left out: only data and unified
caches hold activations and weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hogwild.numa.topology import REAL_SYSFS, TopologyError, parse_cpulist


@dataclass(frozen=True)
class CacheLevel:
    """One data or unified cache as one CPU sees it.

    Attributes:
        level: 1, 2, 3...
        kind: ``"Data"`` or ``"Unified"``.
        size: Bytes.
        shared_by: How many logical CPUs share it.
    """

    level: int
    kind: str
    size: int
    shared_by: int


def parse_size(text: str) -> int:
    """``"32K"``, ``"1024K"``, ``"32M"`` or a plain byte count, in bytes.

    Raises:
        ValueError: The text is not such a size.
    """
    text = text.strip()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def read_caches(cpu: int | None = None, sysfs_root: str | os.PathLike = REAL_SYSFS) -> tuple:
    """The data and unified caches of ``cpu`` (by default the first CPU this process may use),
    by level; empty when sysfs does not describe them (a container without ``/sys``)."""
    if cpu is None:
        cpu = min(os.sched_getaffinity(0))
    folder = Path(sysfs_root) / f"devices/system/cpu/cpu{cpu}/cache"
    found = []
    for index in sorted(folder.glob("index[0-9]*")):
        try:
            kind = (index / "type").read_text().strip()
            if kind == "Instruction":
                continue
            level = int((index / "level").read_text())
            size = parse_size((index / "size").read_text())
            shared = (index / "shared_cpu_list").read_text()
        except (OSError, ValueError, TopologyError):
            continue  # an index the kernel describes partly: not one to size against
        found.append(CacheLevel(level, kind, size, max(1, len(parse_cpulist(shared)))))
    return tuple(sorted(found, key=lambda c: c.level))
