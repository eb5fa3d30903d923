"""The job's run directory on the nodes that cannot see it: what a far role reads, mirrored.

The driver's run directory holds what a role reads at start (the resolved config, the job's
roster of public keys, keys kept there). A role that Ray places on the driver's node reads it in
place; one placed on another node gets a mirror of it on that node (made by its actor:
:meth:`~hogwild_plugins.ray.role_actor.RoleHost.start`, private to the user), holding the files
:func:`files_for` finds. The roster changes while the job runs (roles join with their keys,
:class:`hogwild.cluster.identities.JobKeys`): :func:`send_roster` carries every new one to each
far node's mirror, and :func:`remove_mirrors` takes the mirrors away when the job stops
(:func:`remove_left_mirrors` where no actor of the job is left on a live node to do it: a
spread replica placed anew left its healthy nodes).
"""

from __future__ import annotations

from pathlib import Path

from hogwild.net.auth import ROSTER

__all__ = ["files_for", "remove_left_mirrors", "remove_mirrors", "send_roster"]

MIRROR_CALL_TIMEOUT_S = 30.0  # what the far nodes' actors get to write or remove their mirrors


def files_for(run_dir: str, argv: list[str], keys: str = "") -> dict[str, bytes]:
    """The run directory's files a role elsewhere reads: those named in ``argv``, and the
    job's keys under ``keys`` (``ps.keys``), by their path relative to ``run_dir``."""
    root = Path(run_dir)
    paths = [Path(a.partition("=")[2] if a.startswith("--") else a) for a in argv]
    if keys:
        found_keys = Path(keys).resolve()
        paths += [p for p in found_keys.rglob("*") if p.is_file()] if found_keys.is_dir() else []
    found = {}
    for path in paths:
        path = path.resolve() if path.is_absolute() else (Path.cwd() / path).resolve()
        if path.is_file() and path.is_relative_to(root):
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


def send_roster(actors: list, run_dir: str, keys_dir: str, roster: bytes) -> None:
    """The job's new ``roster`` (kept in ``keys_dir``) to the mirrors of the far roles'
    ``actors``: servers there admit the roles that joined, clients there find their servers'
    keys. A lost role's actor is passed over: its replacement gets the roster with its mirror."""
    import ray  # here, not above: finding a role's files needs no Ray
    from ray.exceptions import RayActorError

    relative = str((Path(keys_dir).resolve() / ROSTER).relative_to(run_dir))
    refs = []
    for actor in actors:
        try:
            refs.append(actor.refresh.remote(relative, roster))
        except (RayActorError, ValueError):
            pass
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=MIRROR_CALL_TIMEOUT_S)


def remove_mirrors(actors: list) -> None:
    """Every node's mirror of the run directory (the job's keys among it) goes with the job."""
    import ray
    from ray.exceptions import RayActorError

    refs = []
    for actor in actors:
        try:
            refs.append(actor.cleanup.remote())
        except (RayActorError, ValueError):
            pass
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=MIRROR_CALL_TIMEOUT_S)


def remove_left_mirrors(run_dir: str, node_ids) -> None:
    """The run directory's mirror and the roles' key folder removed on each live node of
    ``node_ids`` by a small task pinned there (no actor of the job is left there to do it)."""
    import ray
    from hogwild_plugins.ray.role_actor import remove_mirror
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not node_ids:
        return
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    task = ray.remote(num_cpus=0)(remove_mirror)
    refs = [
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
            run_dir
        )
        for node in set(node_ids) & alive
    ]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=MIRROR_CALL_TIMEOUT_S)
