"""The machine's NUMA topology: nodes, their CPUs and memory, and the physical cores.

:func:`read_topology` reads Linux sysfs (``devices/system/node/node*/{cpulist,meminfo}`` and
``devices/system/cpu/cpu*/topology/{core_id,physical_package_id,thread_siblings_list}``) under a
``sysfs_root`` that tests point at fake trees. It keeps only CPUs that are online and, on the real
machine, in this process's affinity mask (a container or ``taskset`` may allow fewer). A machine
without ``devices/system/node`` is one node holding every CPU; a CPU without topology files is a
core of its own, unless psutil (on the real machine) counts fewer physical cores than logical
CPUs, in which case CPUs ``i`` and ``i + cores`` are taken as siblings (Linux's usual numbering).

Invariant: every kept CPU belongs to exactly one node and one physical core; cores and nodes are
listed in ascending order, and a core's CPUs (its hyperthreads) ascending, first thread first.

Adam (§3.2.1, §3.3.1) places training contexts and parameter shards on chosen NUMA nodes and
binds threads to the node's processors; this module is the map those decisions are made from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from hogwild.errors import HogwildError

__all__ = [
    "CpuInfo",
    "NumaNode",
    "PhysicalCore",
    "MachineTopology",
    "TopologyError",
    "format_cpulist",
    "parse_cpulist",
    "read_topology",
]

REAL_SYSFS = Path("/sys")


class TopologyError(HogwildError):
    """The topology cannot be read (no usable CPU, a malformed sysfs file)."""


@dataclass(frozen=True)
class CpuInfo:
    """One logical CPU.

    Attributes:
        cpu: Its number, as the kernel and ``sched_setaffinity`` know it.
        node: The NUMA node it belongs to.
        package: The socket (``physical_package_id``; 0 when unknown).
        core: ``core_id`` within the package (unique per package, not globally).
    """

    cpu: int
    node: int
    package: int
    core: int


@dataclass(frozen=True)
class PhysicalCore:
    """A physical core and its hardware threads.

    Attributes:
        node: The NUMA node it belongs to (that of its first thread).
        package: The socket.
        core: ``core_id`` within the package.
        cpus: Its logical CPUs (hyperthreads), ascending.
    """

    node: int
    package: int
    core: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class NumaNode:
    """A NUMA node.

    Attributes:
        node: Its number.
        cpus: Its usable logical CPUs, ascending (empty for a memory-only node).
        mem_total: Memory in bytes, or None when unknown.
        mem_free: Free memory in bytes, or None when unknown.
    """

    node: int
    cpus: tuple[int, ...]
    mem_total: int | None
    mem_free: int | None


@dataclass(frozen=True)
class MachineTopology:
    """What :func:`read_topology` found.

    Attributes:
        nodes: NUMA nodes, ascending.
        cores: Physical cores, ordered by node, then by first CPU.
        cpus: Logical CPUs, ascending.
        model: The CPU model name, or ``"unknown"``.
        source: Where it came from: the sysfs root, plus ``" (no node directory)"`` or
            ``" (psutil siblings)"`` when a fallback was used.
    """

    nodes: tuple[NumaNode, ...]
    cores: tuple[PhysicalCore, ...]
    cpus: tuple[CpuInfo, ...]
    model: str = "unknown"
    source: str = "/sys"

    @property
    def n_nodes(self) -> int:
        """Number of NUMA nodes (memory-only ones included)."""
        return len(self.nodes)

    @property
    def n_cpus(self) -> int:
        """Number of usable logical CPUs."""
        return len(self.cpus)

    @property
    def n_physical_cores(self) -> int:
        """Number of physical cores with at least one usable CPU."""
        return len(self.cores)

    @property
    def n_packages(self) -> int:
        """Number of sockets."""
        return len({c.package for c in self.cores})

    @property
    def mem_total(self) -> int | None:
        """Memory over all nodes in bytes, or None when a node's is unknown."""
        totals = [n.mem_total for n in self.nodes]
        return None if any(t is None for t in totals) else sum(totals)

    def node_of(self, cpu: int) -> int:
        """The node of logical CPU ``cpu``.

        Raises:
            KeyError: ``cpu`` is not a usable CPU.
        """
        for info in self.cpus:
            if info.cpu == cpu:
                return info.node
        raise KeyError(f"CPU {cpu} is not among the usable CPUs {format_cpulist(self.cpu_ids)}")

    @property
    def cpu_ids(self) -> tuple[int, ...]:
        """The usable logical CPU numbers, ascending."""
        return tuple(c.cpu for c in self.cpus)

    def cores_of(self, node: int) -> tuple[PhysicalCore, ...]:
        """Physical cores of ``node``."""
        return tuple(c for c in self.cores if c.node == node)


def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel CPU list such as ``"0-3,8-11"`` (also ``"0-7:2"`` strides) to numbers.

    Raises:
        TopologyError: The text is not a CPU list.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if m is None:
            raise TopologyError(f"malformed CPU list {text.strip()!r}: expected e.g. '0-3,8'")
        lo = int(m[1])
        hi = int(m[2]) if m[2] else lo
        step = int(m[3]) if m[3] else 1
        cpus.update(range(lo, hi + 1, step))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The compact kernel form of a set of CPUs: ``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    out: list[str] = []
    run: list[int] = []
    for cpu in sorted(set(cpus)):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [cpu]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _meminfo(path: Path) -> tuple[int | None, int | None]:
    text = _read(path)
    if text is None:
        return None, None
    found: dict[str, int] = {}
    for m in re.finditer(r"(MemTotal|MemFree):\s+(\d+)\s*kB", text):
        found[m[1]] = int(m[2]) * 1024
    return found.get("MemTotal"), found.get("MemFree")


def _cpu_model(cpuinfo: Path) -> str:
    text = _read(cpuinfo) or ""
    m = re.search(r"^(?:model name|Model|cpu model)\s*:\s*(.+)$", text, re.MULTILINE)
    return m[1].strip() if m else "unknown"


def _online_cpus(cpu_dir: Path) -> list[int]:
    text = _read(cpu_dir / "online")
    if text is not None:
        return parse_cpulist(text)
    return sorted(int(p.name[3:]) for p in cpu_dir.glob("cpu[0-9]*") if p.name[3:].isdigit())


def read_topology(
    sysfs_root: str | os.PathLike = REAL_SYSFS, allowed_cpus: Iterable[int] | None = None
) -> MachineTopology:
    """Read the machine's topology.

    Args:
        sysfs_root: Where sysfs is mounted (a fake tree in tests).
        allowed_cpus: CPUs to keep; by default this process's affinity mask on the real
            machine, and every online CPU under any other root.

    Returns:
        The topology of the usable CPUs.

    Raises:
        TopologyError: No usable CPU, or a malformed CPU list.
    """
    root = Path(sysfs_root)
    real = root.resolve() == REAL_SYSFS
    cpu_dir = root / "devices/system/cpu"
    node_dir = root / "devices/system/node"
    online = _online_cpus(cpu_dir)
    if allowed_cpus is None and real:
        allowed_cpus = os.sched_getaffinity(0)
    keep = set(online) if allowed_cpus is None else set(online) & set(allowed_cpus)
    if not online and real:  # no sysfs at all: trust the affinity mask
        keep = set(os.sched_getaffinity(0))
    if not keep:
        raise TopologyError(
            f"no usable CPU under {root}: online {format_cpulist(online) or 'none'}, "
            f"allowed {format_cpulist(allowed_cpus or [])}"
        )
    source = str(root)

    # Nodes and their CPUs.
    node_paths = sorted(
        (int(p.name[4:]), p) for p in node_dir.glob("node[0-9]*") if p.name[4:].isdigit()
    )
    node_cpus: dict[int, list[int]] = {}
    node_mem: dict[int, tuple[int | None, int | None]] = {}
    for n, path in node_paths:
        node_cpus[n] = [c for c in parse_cpulist(_read(path / "cpulist") or "") if c in keep]
        node_mem[n] = _meminfo(path / "meminfo")
    if not node_paths:
        source += " (no node directory)"
        node_cpus[0] = sorted(keep)
        node_mem[0] = (
            (psutil.virtual_memory().total, psutil.virtual_memory().available)
            if real
            else (None, None)
        )
    cpu_node = {c: n for n, cs in node_cpus.items() for c in cs}
    first_node = min(node_cpus)
    for c in keep - cpu_node.keys():  # listed online but in no node: give it the first one
        cpu_node[c] = first_node
        node_cpus[first_node].append(c)

    # Physical cores.
    infos: list[CpuInfo] = []
    have_topology = True
    for c in sorted(keep):
        tdir = cpu_dir / f"cpu{c}" / "topology"
        core = _read_int(tdir / "core_id")
        package = _read_int(tdir / "physical_package_id")
        if core is None:
            have_topology = False
            core = c
        infos.append(CpuInfo(c, cpu_node[c], package if package and package > 0 else 0, core))
    if not have_topology and real:
        physical = psutil.cpu_count(logical=False) or len(infos)
        if physical < len(online):
            source += " (psutil siblings)"
            infos = [CpuInfo(i.cpu, i.node, 0, i.cpu % physical) for i in infos]
    groups: dict[tuple[int, int], list[CpuInfo]] = {}
    for info in infos:
        groups.setdefault((info.package, info.core), []).append(info)
    cores = sorted(
        (
            PhysicalCore(g[0].node, pkg, core, tuple(i.cpu for i in g))
            for (pkg, core), g in groups.items()
        ),
        key=lambda pc: (pc.node, pc.cpus[0]),
    )

    nodes = tuple(NumaNode(n, tuple(sorted(node_cpus[n])), *node_mem[n]) for n in sorted(node_cpus))
    model = _cpu_model(Path("/proc/cpuinfo")) if real else "unknown"
    return MachineTopology(nodes, tuple(cores), tuple(infos), model, source)
