"""A worker group's part in keeping several server groups close (SINGA section 5.2).

With several server groups (distributed Hogwild, or a hybrid on several server groups) each
worker group trains against its own server group, ``worker_groups / server_groups`` of them on
each, bound in order (worker group ``i`` to server group ``i // per_group``, as the driver binds
them). The first worker group bound to each server group is its **synchroniser**: every
``cluster.sync_every`` examples it has trained it moves its own server group to the groups' mean
(the ``hogwild.server_groups`` entry point of :mod:`hogwild.cluster.services`, through the
shards' operations), and only it, so two synchronisations never move one group twice. The others
of the same server group train on without synchronising.

A worker group must synchronise (when due) before it reports its work done: the driver moves
every group to the mean at each epoch's end, once every worker group is done, and that move must
not overlap one of theirs. :class:`GroupSync` is one worker group's side: which server group it
trains against, whether it synchronises, the clients of every server group it does that through
(opened by :meth:`GroupSync.open`, closed by :meth:`GroupSync.close`), and its counters.
"""

from __future__ import annotations

import threading

from hogwild.cluster.services import open_server_groups
from hogwild.config.topology import resolve_topology, split_groups

__all__ = ["GroupSync"]


class GroupSync:
    """Worker group ``index``'s synchronisation of its server group (see the module docstring).

    Args:
        config: The role's resolved config (``cluster.group_servers``, the topology, ``[ps]``).
        index: The worker group's index (its replica role's).

    Attributes:
        server_group: The server group it trains against.
        sync_every: Examples between its synchronisations (0: it does not synchronise).
        syncs, sync_s, spread: Its synchronisations, their seconds in all, and the largest
            distance of a group from the mean at the last one.
    """

    def __init__(self, config, index: int) -> None:
        topology = resolve_topology(config.cluster, config.ps.rule)
        per_group = max(1, topology.worker_groups // topology.server_groups)
        self.config, self.index = config, index
        self.server_group = index // per_group  # as the driver binds worker groups
        synchroniser = topology.server_groups > 1 and index % per_group == 0
        self.sync_every = topology.sync_every if synchroniser else 0
        self.groups = None  # every server group's clients, once opened
        self.synced_at = 0.0  # examples trained (in all) at the last synchronisation
        self.syncs, self.sync_s, self.spread = 0, 0.0, 0.0
        self.lock = threading.Lock()  # the counters, read by the network thread

    def open(self, job: str, etcd: str | None = None, etcd_tls: str | None = None) -> None:
        """Clients of every server group of ``job``, if this worker group synchronises; with
        ``etcd`` (replicated servers, ``cluster.copies`` > 1) and its certificates, each server
        group routed by its own bucket map."""
        if not self.sync_every or self.groups is not None:
            return
        config = self.config
        self.groups = open_server_groups(
            split_groups(config.cluster.group_servers, config.cluster.ps),
            job,
            f"replica-{self.index}",
            timeout_s=config.ps.timeout_s,
            retries=config.ps.retries,
            keys=config.ps.keys or None,
            etcd=etcd,
            etcd_tls=etcd_tls,
        )

    def when_due(self, trained: float) -> None:
        """After ``trained`` examples in all: its server group to the groups' mean, if
        ``sync_every`` examples passed since the last time (nothing if it does not
        synchronise)."""
        if self.groups is None or trained - self.synced_at < self.sync_every:
            return
        self.synced_at = trained
        result = self.groups.sync(own=self.server_group)
        with self.lock:
            self.syncs += 1
            self.sync_s += result.seconds
            self.spread = result.spread

    def status(self) -> dict:
        """Its counters for the driver (``syncs``, ``sync_s``, ``sync_spread``); empty before
        its first synchronisation."""
        with self.lock:
            if not self.syncs:
                return {}
            return {"syncs": self.syncs, "sync_s": self.sync_s, "sync_spread": self.spread}

    def close(self) -> None:
        if self.groups is not None:
            groups, self.groups = self.groups, None
            groups.close()
