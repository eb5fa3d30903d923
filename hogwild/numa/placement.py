"""Where each worker runs, and where the shared parameters live: the placement plan.

Workers get CPUs in a fixed order of preference: **one physical core per worker first**, and only
when every physical core has a worker, the cores' second hardware threads (then third, ...).
Within that, the ``policy`` decides the order of nodes:

- ``"fill"``: node 0's cores, then node 1's, ... (workers share one memory controller and L3
  while they fit in a node: the default, as in Adam, where a machine's workers share its weights);
- ``"spread"``: round-robin over the nodes (node 0's first core, node 1's first core, ...), for
  memory bandwidth when each worker's working set is mostly its own.

More workers than usable CPUs: with ``oversubscribe="wrap"`` (the default) worker ``k`` gets the
CPU of worker ``k mod n_cpus`` and both are marked ``shared``; with ``"error"`` it is a
:class:`PlacementError`. The shared parameters are either **interleaved** page by page over the
nodes the workers use (one copy, even bandwidth) or **replicated**, one copy per node, each worker
reading its own node's copy, or one copy per worker (:func:`plan_parameters`).

The plan is pure data computed from a :class:`~hogwild.numa.topology.MachineTopology`: no
pinning, no I/O (:mod:`hogwild.numa.pinning` applies it). Adam (§3.2.1, §3.3.1) binds threads to
the processors of the NUMA node holding their data; processes replace threads here.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from hogwild.errors import ConfigError
from hogwild.numa.topology import MachineTopology, PhysicalCore

__all__ = [
    "OVERSUBSCRIBE",
    "PARAMETER_MODES",
    "REPLICA_GRANULARITY",
    "POLICIES",
    "ParameterPlacement",
    "PlacementError",
    "WorkerPlacement",
    "cpu_order",
    "default_worker_count",
    "plan_parameters",
    "plan_workers",
]

POLICIES = ("fill", "spread")
OVERSUBSCRIBE = ("wrap", "error")
PARAMETER_MODES = ("interleave", "replicate")
REPLICA_GRANULARITY = ("node", "worker")


class PlacementError(ConfigError):
    """A placement request cannot be met (bad policy, too many workers with ``"error"``)."""


@dataclass(frozen=True)
class WorkerPlacement:
    """Where one worker runs.

    Attributes:
        worker: The worker's index.
        cpu: The logical CPU to pin it to.
        node: That CPU's NUMA node (allocate its training context there).
        package: That CPU's socket.
        core: ``core_id`` of that CPU's physical core within its package.
        thread: Which hardware thread of the core (0 = the first; >0 = a hyperthread sibling).
        shared: Whether another worker has the same CPU (more workers than CPUs).
    """

    worker: int
    cpu: int
    node: int
    package: int
    core: int
    thread: int
    shared: bool = False


@dataclass(frozen=True)
class ParameterPlacement:
    """Where the shared parameters live.

    Attributes:
        mode: ``"interleave"`` (one copy, pages spread over ``nodes``) or ``"replicate"`` (one
            copy on each entry of ``nodes``).
        nodes: Interleaved: the nodes the workers run on, ascending. Replicated: the node of
            each copy (per node: each node once, ascending; per worker: each worker's node).
        replica_of_worker: For each worker, the index (into ``nodes``) of the copy it reads and
            updates; all 0 when interleaved.
        per: The copies' granularity when replicated: ``"node"`` or ``"worker"``.
    """

    mode: str
    nodes: tuple[int, ...]
    replica_of_worker: tuple[int, ...]
    per: str = "node"

    @property
    def n_copies(self) -> int:
        """How many copies of the parameters exist."""
        return len(self.nodes) if self.mode == "replicate" else 1


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise PlacementError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def cpu_order(
    topology: MachineTopology, policy: str = "fill"
) -> list[tuple[int, PhysicalCore, int]]:
    """Every usable CPU once, in the order workers receive them.

    Returns:
        ``(cpu, core, thread)`` triples: physical cores' first threads first, then second
        threads, ...; nodes ordered by ``policy``.

    Raises:
        PlacementError: Unknown policy.
    """
    _check_choice("placement policy", policy, POLICIES)
    nodes = [n.node for n in topology.nodes if topology.cores_of(n.node)]
    max_threads = max(len(c.cpus) for c in topology.cores)
    order: list[tuple[int, PhysicalCore, int]] = []
    for thread in range(max_threads):
        per_node = [[c for c in topology.cores_of(n) if len(c.cpus) > thread] for n in nodes]
        if policy == "fill":
            for cores in per_node:
                order.extend((c.cpus[thread], c, thread) for c in cores)
        else:
            for i in range(max((len(cores) for cores in per_node), default=0)):
                for cores in per_node:
                    if i < len(cores):
                        order.append((cores[i].cpus[thread], cores[i], thread))
    return order


def default_worker_count(topology: MachineTopology) -> int:
    """One worker per physical core (Hogwild workers gain little from a core's second thread)."""
    return max(1, topology.n_physical_cores)


def plan_workers(
    topology: MachineTopology,
    n_workers: int | None = None,
    policy: str = "fill",
    oversubscribe: str = "wrap",
    avoid: Collection[int] = (),
) -> list[WorkerPlacement]:
    """The CPU and node of each worker.

    Args:
        topology: The machine.
        n_workers: How many workers; :func:`default_worker_count` when None or 0.
        policy: ``"fill"`` or ``"spread"`` (see the module docstring).
        avoid: CPUs to give out only after every other one (another job's workers run there).
        oversubscribe: ``"wrap"`` to reuse CPUs, ``"error"`` to refuse, when ``n_workers``
            exceeds the usable CPUs.

    Returns:
        One placement per worker, worker 0 first.

    Raises:
        PlacementError: Unknown policy, a negative count, or too many workers with ``"error"``.
    """
    _check_choice("oversubscribe", oversubscribe, OVERSUBSCRIBE)
    if not n_workers:
        n_workers = default_worker_count(topology)
    if n_workers < 0:
        raise PlacementError(f"number of workers must be positive, got {n_workers}")
    order = cpu_order(topology, policy)
    order = [e for e in order if e[0] not in avoid] + [e for e in order if e[0] in avoid]
    if n_workers > len(order) and oversubscribe == "error":
        raise PlacementError(
            f"{n_workers} workers requested but only {len(order)} CPUs are usable "
            f"({topology.n_physical_cores} physical cores); ask for fewer workers or "
            "allow oversubscribe='wrap'"
        )
    placements = []
    for w in range(n_workers):
        cpu, core, thread = order[w % len(order)]
        placements.append(
            WorkerPlacement(
                worker=w,
                cpu=cpu,
                node=core.node,
                package=core.package,
                core=core.core,
                thread=thread,
                shared=n_workers > len(order) and (w % len(order)) < n_workers - len(order),
            )
        )
    return placements


def plan_parameters(
    placements: Sequence[WorkerPlacement], mode: str = "interleave", per: str = "node"
) -> ParameterPlacement:
    """Where the shared parameters go for these workers.

    Args:
        placements: From :func:`plan_workers`.
        mode: ``"interleave"`` or ``"replicate"``.
        per: With ``"replicate"``: one copy per ``"node"`` the workers use, or one per
            ``"worker"`` (each on its worker's node: no two workers write the same copy, and the
            weights move between cores only at exchanges).

    Raises:
        PlacementError: Unknown mode or granularity.
    """
    _check_choice("parameter placement", mode, PARAMETER_MODES)
    _check_choice("replica granularity", per, REPLICA_GRANULARITY)
    nodes = tuple(sorted({p.node for p in placements}))
    if mode == "replicate" and per == "worker":
        return ParameterPlacement(
            mode, tuple(p.node for p in placements), tuple(range(len(placements))), per
        )
    if mode == "replicate":
        replica = tuple(nodes.index(p.node) for p in placements)
    else:
        replica = tuple(0 for _ in placements)
    return ParameterPlacement(mode, nodes, replica, per)
