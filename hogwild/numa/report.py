"""The text ``hogwild info`` prints: the machine's topology and the placement it would use.

:func:`format_machine_report` is pure formatting of a
:class:`~hogwild.numa.topology.MachineTopology` and a worker plan (no I/O besides asking psutil
for its physical-core count as a cross-check and whether libnuma loads), so it can be tested
against fake topologies. Long core and worker lists
are cut after ``max_rows`` lines with a count of what was left out.
"""

from __future__ import annotations

from collections.abc import Sequence

import psutil

from hogwild.numa.pinning import libnuma_available
from hogwild.numa.placement import (
    ParameterPlacement,
    WorkerPlacement,
    default_worker_count,
    plan_parameters,
    plan_workers,
)
from hogwild.numa.topology import MachineTopology, format_cpulist, read_topology

__all__ = ["format_machine_report", "main"]


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**30:.1f} GiB"


def format_machine_report(
    topology: MachineTopology,
    plan: Sequence[WorkerPlacement],
    parameters: ParameterPlacement | None = None,
    policy: str | None = None,
    max_rows: int = 64,
) -> str:
    """A human-readable report of the machine and where workers and parameters would go.

    Args:
        topology: From :func:`hogwild.numa.topology.read_topology`.
        plan: From :func:`hogwild.numa.placement.plan_workers`.
        parameters: From :func:`hogwild.numa.placement.plan_parameters` (interleave if None).
        policy: The placement policy the plan was made with, to print beside it.
        max_rows: Most lines per list (cores, workers).

    Returns:
        Several lines of text, no trailing newline.
    """
    parameters = parameters or plan_parameters(plan, "interleave")
    psutil_cores = psutil.cpu_count(logical=False)
    lines = [
        f"CPU: {topology.model}",
        f"Logical CPUs: {topology.n_cpus} usable ({format_cpulist(topology.cpu_ids)}); "
        f"physical cores: {topology.n_physical_cores}"
        + (f" (psutil counts {psutil_cores} on this host)" if psutil_cores else "")
        + f"; sockets: {topology.n_packages}; NUMA nodes: {topology.n_nodes}",
        f"Memory: {_gib(topology.mem_total)}",
        f"Topology source: {topology.source}",
        "libnuma: "
        + (
            "available (mbind, interleave)"
            if libnuma_available()
            else "not available (memory placed by first touch after pinning)"
        ),
        "",
        "NUMA nodes:",
    ]
    for node in topology.nodes:
        cores = topology.cores_of(node.node)
        lines.append(
            f"  node {node.node}: CPUs {format_cpulist(node.cpus) or '(none)'}, "
            f"{len(cores)} cores, memory {_gib(node.mem_total)} ({_gib(node.mem_free)} free)"
        )
    lines += ["", "Physical cores (node socket/core: CPUs, first thread first):"]
    for core in topology.cores[:max_rows]:
        cpus = ",".join(str(c) for c in core.cpus)
        lines.append(f"  node {core.node} {core.package}/{core.core}: {cpus}")
    if len(topology.cores) > max_rows:
        lines.append(f"  ... {len(topology.cores) - max_rows} more")

    n = len(plan)
    default = default_worker_count(topology)
    shared = sum(p.shared for p in plan)
    lines += [
        "",
        f"Worker plan: {n} workers (default {default}, one per physical core)"
        + (f", policy {policy}" if policy else "")
        + (f"; {shared} share a CPU with another worker" if shared else ""),
    ]
    for p in plan[:max_rows]:
        kind = f", hyperthread {p.thread}" if p.thread else ""
        note = ", shared" if p.shared else ""
        lines.append(
            f"  worker {p.worker}: CPU {p.cpu} (node {p.node}, socket {p.package} core "
            f"{p.core}{kind}{note})"
        )
    if n > max_rows:
        lines.append(f"  ... {n - max_rows} more")
    nodes = ",".join(str(x) for x in sorted(set(parameters.nodes)))
    if parameters.n_copies > 1 and parameters.per == "worker":
        lines.append(
            f"Shared parameters: replicated, one copy per worker (on nodes {nodes}) and a home "
            "copy interleaved over their nodes; each worker exchanges progress with it"
        )
    elif parameters.n_copies > 1:
        lines.append(
            f"Shared parameters: replicated, one copy per node ({nodes}) and a home copy "
            "interleaved over them; each node's first worker exchanges progress with it"
        )
    elif parameters.mode == "replicate":
        lines.append(f"Shared parameters: one copy on node {nodes} (replicate: one copy needed)")
    elif len(parameters.nodes) > 1:
        lines.append(f"Shared parameters: one copy, pages interleaved over nodes {nodes}")
    else:
        lines.append(f"Shared parameters: one copy on node {nodes or 0}")
    return "\n".join(lines)


def main() -> None:
    """Print the report for this machine with the default plan."""
    topology = read_topology()
    print(format_machine_report(topology, plan_workers(topology), policy="fill"))


if __name__ == "__main__":
    main()
