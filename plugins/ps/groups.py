"""Several server groups kept close: SINGA's distributed Hogwild synchronisation (section 5.2).

With ``cluster.server_groups = G > 1`` every server group holds a whole copy of the parameters
and serves its own worker groups, which update it asynchronously (Hogwild between replicas,
Downpour within the group). Left alone the copies would drift apart into G models; SINGA's
server groups "synchronise with their neighbours periodically", with all-to-all neighbours by
default. :class:`ServerGroups` does such synchronisations: it pulls every group's parameters
and moves groups toward their mean. It is registered as the ``ps`` entry point of
``hogwild.server_groups`` (the cluster's :class:`hogwild.cluster.services.ServerGroupSync`); the
server list is cut into groups by :func:`hogwild.config.topology.split_groups`.

Who moves what, so that synchronisations may overlap:

* **A worker group moves only its own server group** (:meth:`ServerGroups.sync` with ``own``),
  and only one worker group per server group synchronises (the first one bound to it,
  :mod:`hogwild.cluster.group_sync`), every ``cluster.sync_every`` examples it trained. Two groups
  synchronising at the same moment each move themselves to the mean they both pulled, so they
  meet; were each to move every group, two overlapping synchronisations would move each group
  twice (to ``2 * mean - p_g``: the groups would swap, and with more of them drift apart). A
  group that synchronises alone moves to the mean of what it pulled, half-way towards the other
  for two groups: gossip averaging, which brings the groups together over a few rounds.
* **The driver moves every group** (``own=None``) at every epoch end, when every replica has
  finished its share, including its last synchronisation: nothing overlaps it, so the model it
  evaluates and checkpoints is the groups' common one.

A move is a delta, never an overwrite: group ``g`` receives ``mean - p_g`` as a push into a
named vector of its shards (``sync-<who>``, the synchroniser's own, cleared before every push in
case a synchroniser died half-way through its last one), which the shards add to the parameters
(``axpy``, on each shard's update thread, in order with everything else) and clear. An update that
reaches a group between the pulls and the ``axpy`` is therefore kept, not overwritten. The
servers' rule (Adagrad, momentum) does not see it: averaging copies is not a gradient step.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from hogwild_plugins.ps.checks import PARAMS

from hogwild.errors import ConfigError

__all__ = ["ServerGroups", "SyncResult"]


@dataclass(frozen=True)
class SyncResult:
    """One synchronisation: how far apart the groups were, and how long it took."""

    spread: float  # the largest |p_g - mean| over every parameter and group, before the move
    seconds: float


class ServerGroups:
    """Clients of every server group of a job, and the synchronisation between them.

    Args:
        groups: Each server group's servers (``HOST:PORT``; every group shards the same model
            over the same number of servers).
        job: The job's name.
        who: The synchroniser's name in the shards' named vector (``sync-<who>``): distinct per
            caller (a replica's index, ``driver``).
        timeout_s, retries, keys: As :class:`~hogwild_plugins.ps.client.PSClient`'s.
        etcd, etcd_tls: Replicated servers (``cluster.copies`` > 1): the job's etcd, where group
            ``g``'s bucket map lives in the group's own namespace (``etcd_group = g``), and its
            certificates; None: the groups' servers are not replicated.
    """

    def __init__(
        self,
        groups: Sequence[Sequence[str]],
        job: str,
        who: str,
        *,
        timeout_s: float = 5.0,
        retries: int = 3,
        keys: str | None = None,
        etcd: str | None = None,
        etcd_tls: str | None = None,
    ) -> None:
        from hogwild_plugins.ps.client import PSClient

        if len(groups) < 2:
            raise ConfigError(f"server groups: expected two or more to synchronise, got {groups}")
        self.vector = f"sync-{who}"
        self.group_sizes = [len(servers) for servers in groups]
        self.clients: list = []
        try:
            for g, servers in enumerate(groups):
                self.clients.append(
                    PSClient(
                        list(servers),
                        job,
                        client_id=secrets.randbits(31),
                        timeout_s=timeout_s,
                        retries=retries,
                        keys=keys,
                        etcd=etcd,
                        etcd_tls=etcd_tls,
                        etcd_group=g if etcd else None,
                    )  # fmt: skip
                )
        except BaseException:
            self.close()
            raise
        sizes = {c.layout.n_params for c in self.clients}
        if len(sizes) != 1:
            self.close()
            raise ConfigError(
                f"server groups {[list(g) for g in groups]} serve models of different sizes "
                f"({sorted(sizes)} parameters): every group must serve the job's model"
            )
        n_params = sizes.pop()
        self.pulled = np.zeros((len(self.clients), n_params), np.float32)
        self.mean = np.zeros(n_params, np.float32)
        self.delta = np.zeros(n_params, np.float32)
        self.syncs = 0

    @property
    def n_params(self) -> int:
        return len(self.mean)

    def assign(self, values: np.ndarray) -> None:
        """Give every group ``values`` (the job's starting point: the groups begin as one)."""
        for client in self.clients:
            client.assign(values)

    def sync(self, own: int | None = None) -> SyncResult:
        """Move group ``own`` (None: every group) to the mean of the groups' parameters (see the
        module docstring)."""
        started = time.perf_counter()
        spread = self.pull()
        self.move(own)
        return SyncResult(spread, time.perf_counter() - started)

    def pull(self) -> float:
        """Pull every group and take their mean; the largest distance of a group from it."""
        for g, client in enumerate(self.clients):
            client.pull(self.pulled[g])
        np.mean(self.pulled, axis=0, out=self.mean)
        return float(np.abs(self.pulled - self.mean).max())

    def move(self, own: int | None = None) -> None:
        """Move group ``own`` (None: every group) by ``mean - p_g`` from the last :meth:`pull`."""
        if own is not None and not 0 <= own < len(self.clients):
            raise ConfigError(f"server group {own}: the job has {len(self.clients)} groups")
        for g, client in enumerate(self.clients):
            if own is not None and g != own:
                continue
            np.subtract(self.mean, self.pulled[g], out=self.delta)
            # a synchroniser that died mid-move left a delta here
            client.vector_op("fill", self.vector, alpha=0.0)
            client.push_deltas(self.delta, into=self.vector)
            client.vector_op("axpy", self.vector, PARAMS, alpha=1.0)  # params += vector
            client.vector_op("fill", self.vector, alpha=0.0)
        self.syncs += 1

    def status(self) -> list[dict]:
        """Every server's counters, group after group, each numbered across the groups
        (``server``; a server knows only its place in its own group) with its ``group``."""
        out, first = [], 0
        for g, client in enumerate(self.clients):
            out += [{**s, "server": first + s["server"], "group": g} for s in client.status()]
            first += self.group_sizes[g]
        return out

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.clients = []
