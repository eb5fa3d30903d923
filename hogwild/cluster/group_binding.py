"""Which parameter servers each role of a cluster job trains against: its server group.

A job's servers are listed group after group (one group, or ``cluster.server_groups`` of them:
distributed Hogwild, the hybrid's groups; each group shards its own whole copy of the parameters
and keeps its replication keys in its own etcd namespace). The driver cuts the list into groups
(:func:`~hogwild.config.topology.split_groups`) and binds each replica (a Downpour replica, or a
worker group's coordinator) to one, in order (:func:`group_of`), and each member of a synchronous
group to its worker group's. Every one is told its group's servers (``--ps.servers``) and, with
several groups, the group's number (``--ps.server_group``); with the flags every replica and
member shares (:func:`shared_flags`: the data servers, and with several groups every group's
servers, which :mod:`hogwild.cluster.group_sync` makes one model). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import replace

from hogwild.cluster.roles import RoleSpec

__all__ = ["bound_members", "bound_replicas", "group_of", "shared_flags"]


def group_of(index: int, units: int, n_groups: int) -> int:
    """The server group of replica (or worker group) ``index`` of ``units``: the groups share
    the replicas in order, as evenly as they divide."""
    return index * n_groups // units


def shared_flags(data_servers: list[str], servers: list[str], groups: list[list[str]]) -> list:
    """The command-line flags every replica and member is given: the data servers' addresses,
    and with several server groups every group's servers (listed group after group)."""
    extra = [f"--data.servers={','.join(data_servers)}"] if data_servers else []
    if len(groups) > 1:
        extra.append(f"--cluster.group_servers={','.join(servers)}")
    return extra


def _told(argv: tuple, group: int, groups: list[list[str]], extra: list) -> tuple:
    argv = (*argv, f"--ps.servers={','.join(groups[group])}", *extra)
    if len(groups) > 1:
        argv += (f"--ps.server_group={group}",)
    return argv


def bound_replicas(
    replicas: list[RoleSpec], groups: list[list[str]], extra: list
) -> list[RoleSpec]:
    """``replicas`` (every replica role of the plan), each told its server group's servers and
    ``extra`` (:func:`shared_flags`)."""
    bound = []
    for spec in replicas:
        g = group_of(spec.index, len(replicas), len(groups))
        bound.append(replace(spec, argv=_told(spec.argv, g, groups, extra)))
    return bound


def bound_members(
    members: list[RoleSpec], coordinators: list[str], groups: list[list[str]], extra: list
) -> list[RoleSpec]:
    """A synchronous group's members (``members``: every worker group's, group after group),
    each told its worker group's coordinator (``coordinators``: their addresses, one per worker
    group), that group's server group's servers and ``extra``."""
    if not members:
        return []
    per_group = len(members) // len(coordinators)
    bound = []
    for spec in members:
        group = spec.index // per_group
        g = group_of(group, len(coordinators), len(groups))  # its group's server group
        argv = _told((*spec.argv, "--coordinator", coordinators[group]), g, groups, extra)
        bound.append(replace(spec, argv=argv))
    return bound
