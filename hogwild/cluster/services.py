"""What a cluster job needs from the parameter-server plugin: small protocols, found by entry point.

The driver and the replicas never import the plugin. Each thing they need is declared here as a
:class:`~typing.Protocol` and provided by whatever distribution registers it in ``pyproject.toml``
(looked up through :mod:`hogwild.entry_points`; the parameter-server plugin registers all three):

* ``hogwild.controllers`` (name ``etcd``): :class:`OpenController`, which gives the driver the
  :class:`Controller` of a job whose parameter servers keep copies (``cluster.copies > 1``): the
  service holding their bucket map and leases, started for the job or given by
  ``cluster.etcd``;
* ``hogwild.server_groups`` (name ``ps``): :class:`OpenServerGroups`, clients of every server
  group of a job with several (distributed Hogwild, or the hybrid's worker groups) and the
  synchronisation that keeps them one model (:class:`ServerGroupSync`);
* ``hogwild.worker_groups`` (one name per framework: ``sandblaster``, ``allreduce``,
  ``hybrid``): :class:`WorkerGroupFramework`, a synchronous worker group's role.

A protocol here names only what the cluster calls; the plugin is free in everything else. A
plugin that is not installed is a :class:`~hogwild.entry_points.PluginMissing` naming the entry
point and what to install, raised before any role starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from hogwild.cluster.serving import ServedRole
from hogwild.entry_points import load

CONTROLLERS = "hogwild.controllers"
SERVER_GROUPS = "hogwild.server_groups"
WORKER_GROUPS = "hogwild.worker_groups"
CONTROLLER = "etcd"  # the controller a replicated job uses
SERVER_GROUP_SYNC = "ps"  # the synchronisation of server groups

__all__ = [
    "Controller",
    "OpenController",
    "OpenServerGroups",
    "ServerGroupSync",
    "SyncResult",
    "WorkerGroupFramework",
    "open_controller",
    "open_server_groups",
    "worker_group",
]


class Controller(Protocol):
    """The controller of one job's replicated parameter servers, held by the driver.

    Attributes:
        address: ``HOST:PORT`` every role is told (``cluster.etcd``).
        min_lease_s: The shortest lease it honours: what ``ps.lease_s = 0`` (auto) becomes.
        tls: The certificates every role speaks to it with (``cluster.etcd_tls``; ``"job"``:
            made by the job, each role its own), None for plain HTTP (as is a controller
            without the attribute).
    """

    address: str
    min_lease_s: float
    tls: str | None

    def forget_server(self, index: int, group: int | None = None, lost: bool = True) -> None:
        """Parameter server ``index`` (of server group ``group``, in a job of several) died: end
        its lease now, so that its buckets fail over at once instead of when the lease runs out.
        ``lost``: no exit was seen, so its process may still run and answer reads by its own
        lease clock: the end is marked (``revoked/<index>``) for the takeovers to wait it out.

        Raises:
            HogwildError: The controller cannot be reached (the lease then lapses by itself).
        """

    def close(self) -> None:
        """Leave nothing of the job behind: stop a controller started for it, or delete the
        job's keys from one it was given. Called once every parameter server has stopped."""


class OpenController(Protocol):
    """Entry point ``hogwild.controllers``: the controller of job ``job``.

    ``address`` is ``cluster.etcd`` (empty: start one for the job and say where with ``say``);
    whatever an earlier run of the job left in it is deleted first. ``tls`` is
    ``cluster.etcd_tls`` (a directory of certificates: HTTPS with client certificates);
    ``start_members(count, tls)``, where given, starts the job's own etcd members (``"job"``)
    on the launcher's nodes. ``election_ms`` (``cluster.etcd_election_ms``), passed only when
    set: the election timeout of every etcd member it starts (and ``start_members`` takes it
    as a keyword).
    """

    def __call__(
        self, address: str, job: str, say: Callable[[str], None], tls: str | None = None,
        start_members: Callable | None = None, election_ms: int = 0,
    ) -> Controller: ...  # fmt: skip


class SyncResult(Protocol):
    """One synchronisation of server groups."""

    spread: float  # the largest |p_g - mean| over every parameter and group, before the move
    seconds: float


class ServerGroupSync(Protocol):
    """Clients of every server group of a job and the synchronisation between them.

    Attributes:
        syncs: Synchronisations made through this object.
    """

    syncs: int

    def assign(self, values: np.ndarray) -> None:
        """Give every group ``values`` (the job's starting point: the groups begin as one)."""

    def sync(self, own: int | None = None) -> SyncResult:
        """Move group ``own`` (None: every group) to the mean of the groups' parameters."""

    def status(self) -> list[dict]:
        """Every server's counters, group after group (``server`` numbered across groups)."""

    def close(self) -> None:
        """Close every client."""


class OpenServerGroups(Protocol):
    """Entry point ``hogwild.server_groups``: clients of ``groups`` (each a list of
    ``HOST:PORT``) for ``job``; ``who`` names the synchroniser (``driver``, ``replica-3``);
    ``etcd``, ``etcd_tls``: replicated servers, each group's bucket map in its own namespace."""

    def __call__(
        self,
        groups: Sequence[Sequence[str]],
        job: str,
        who: str,
        *,
        timeout_s: float,
        retries: int,
        keys: str | None,
        etcd: str | None = None,
        etcd_tls: str | None = None,
    ) -> ServerGroupSync: ...


class WorkerGroupFramework(Protocol):
    """Entry point ``hogwild.worker_groups``: the role of a synchronous worker group (a
    coordinator and its replicas), for the framework it is registered as; the core serves it to
    the driver as it serves every replica role
    (:class:`~hogwild.cluster.serving.ReplicaServer`)."""

    def check_job(self, config, data, framework: str) -> None:
        """Refuse, before anything starts, a job the group cannot train (``ConfigError``)."""

    def __call__(self, framework: str, config, data, index: int) -> ServedRole: ...

    def serve_member(
        self, config, data, index: int, coordinator: str, bind: str, keys: str | None
    ) -> int:
        """``hogwild cluster member``: member ``index`` of the job's groups (a replica of group
        ``index // workers_per_group``, a process of its own), whose group serves at
        ``coordinator`` (the served role's ``answer`` takes its requests); the exit status."""


def open_controller(
    address: str, job: str, say: Callable[[str], None], tls: str | None = None,
    start_members: Callable | None = None, election_ms: int = 0,
) -> Controller:  # fmt: skip
    """The controller of ``job`` (:class:`OpenController`), from its entry point; ``tls``: a
    directory of etcd certificates (``cluster.etcd_tls``); ``start_members``: the launcher's
    way to start the job's own etcd members on its nodes (None: on this host's loopback);
    ``election_ms``: their election timeout (``cluster.etcd_election_ms``; 0: the
    controller's own, and not passed, so a controller without the keyword still opens)."""
    opened = load(CONTROLLERS, CONTROLLER, needed_for="cluster.copies > 1")
    chosen = {"election_ms": election_ms} if election_ms else {}
    return opened(address, job, say, tls=tls, start_members=start_members, **chosen)


def open_server_groups(groups, job: str, who: str, *, timeout_s: float, retries: int,
                       keys: str | None, etcd: str | None = None,
                       etcd_tls: str | None = None) -> ServerGroupSync:  # fmt: skip
    """Clients of every server group (:class:`OpenServerGroups`), from its entry point; with
    ``etcd`` (replicated servers), each routing by its own group's bucket map."""
    open_groups = load(SERVER_GROUPS, SERVER_GROUP_SYNC, needed_for="cluster.server_groups > 1")
    return open_groups(
        groups, job, who, timeout_s=timeout_s, retries=retries, keys=keys, etcd=etcd,
        etcd_tls=etcd_tls,
    )  # fmt: skip


def worker_group(framework: str) -> WorkerGroupFramework:
    """The worker-group role of ``framework`` (:class:`WorkerGroupFramework`)."""
    return load(WORKER_GROUPS, framework, chosen_by="cluster.framework")
