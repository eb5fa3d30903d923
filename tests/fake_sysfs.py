"""Fake sysfs trees: the topology of machines the tests do not run on.

A tree made here is read by :func:`hogwild.numa.topology.read_topology` (pass its root), or by a
whole training job through ``$HOGWILD_SYSFS``; a tree that splits this machine's own CPUs into
several nodes lets a job run a multi-node plan with real, pinnable CPUs.
"""

from __future__ import annotations

from pathlib import Path

from hogwild.numa.topology import format_cpulist


def make_sysfs(root: Path, nodes, cpus, mem_kb=None, with_topology=True) -> Path:
    """A fake sysfs tree.

    Args:
        nodes: {node: [cpu, ...]}, or None for a machine without a node directory.
        cpus: {cpu: (package, core_id)}; siblings are the CPUs sharing (package, core_id).
        mem_kb: {node: (total, free)} in kB.
    """
    cpu_dir = root / "devices/system/cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text(format_cpulist(cpus) + "\n")
    for cpu, (package, core) in cpus.items():
        tdir = cpu_dir / f"cpu{cpu}" / "topology"
        tdir.mkdir(parents=True)
        if not with_topology:
            continue
        siblings = [c for c, pc in cpus.items() if pc == (package, core)]
        (tdir / "core_id").write_text(f"{core}\n")
        (tdir / "physical_package_id").write_text(f"{package}\n")
        (tdir / "thread_siblings_list").write_text(format_cpulist(siblings) + "\n")
    if nodes is not None:
        for node, node_cpus in nodes.items():
            ndir = root / "devices/system/node" / f"node{node}"
            ndir.mkdir(parents=True)
            (ndir / "cpulist").write_text(format_cpulist(node_cpus) + "\n")
            total, free = (mem_kb or {}).get(node, (1024, 512))
            (ndir / "meminfo").write_text(
                f"Node {node} MemTotal:       {total} kB\nNode {node} MemFree:        {free} kB\n"
                f"Node {node} MemUsed:        {total - free} kB\n"
            )
    return root


def split_this_machine(root: Path, cpus: list[int]) -> Path:
    """A tree with one node per CPU of ``cpus`` (CPUs this process may run on), one core each."""
    return make_sysfs(root, {i: [cpu] for i, cpu in enumerate(cpus)}, {c: (0, c) for c in cpus})
