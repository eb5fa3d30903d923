"""A cluster job's parameter servers as its driver holds them: the model given, pulled, watched.

:class:`JobServers` owns the driver's side of the servers, each part released by :meth:`close`:

* the ``ps`` parameter store's parent side (:mod:`hogwild.store`) and the small arena it lives
  in, through which the driver gives the servers the job's starting model (initial weights, or
  a checkpoint's with ``--resume``) and pulls the servers' model at every epoch end;
* with several server groups (distributed Hogwild, the hybrid), clients of every group
  (:class:`~hogwild.cluster.services.ServerGroupSync`): the groups start as one model and are made
  one again at every epoch end, before the pull;
* with replicated servers (``cluster.copies > 1``), their controller
  (:class:`~hogwild.cluster.services.Controller`: an etcd given or started for the job), closed
  apart by :meth:`close_controller` once the servers have stopped (they give their leases back).

What each part is comes from the parameter-server plugin through the entry points of
:mod:`hogwild.cluster.services` and :mod:`hogwild.store.registry`; nothing here names it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hogwild.cluster.services import open_controller, open_server_groups
from hogwild.errors import HogwildError
from hogwild.logs import role_logger
from hogwild.shm.arena import Arena, ArenaLayout
from hogwild.store.registry import store_class

__all__ = ["JobServers"]


class JobServers:
    """The parameter servers of job ``job``, from the driver's side (see the module docstring)."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.per_group = 0  # several server groups: each group's servers (0: one group)
        self.controller = None  # replicated servers' (cluster.copies > 1)
        self.store = self.arena = None  # the ps store's parent side, once the model is given
        self.groups = None  # several server groups: every group's clients

    def with_controller(self, config, say: Callable[[str], None], start_members=None):
        """``config`` with ``cluster.etcd`` the controller's address (the one given, or one
        started for the job: by ``start_members``, the launcher's, where it has one), its
        certificates in ``cluster.etcd_tls`` (``"job"``: those the job made, each role its own),
        the members it starts with ``cluster.etcd_election_ms``, and an auto ``ps.lease_s`` as
        short as it honours."""
        self.controller = open_controller(
            config.cluster.etcd, self.job, say, tls=config.cluster.etcd_tls or None,
            start_members=start_members, election_ms=config.cluster.etcd_election_ms,
        )  # fmt: skip
        changes = {"cluster.etcd": self.controller.address}
        tls = getattr(self.controller, "tls", None)  # a third party's controller may have none
        if tls:  # the roles speak to it as the controller does ("job": their own)
            changes["cluster.etcd_tls"] = tls
        if not config.ps.lease_s:  # auto: as short as the controller honours
            changes["ps.lease_s"] = self.controller.min_lease_s
        return config.override(changes)

    def forget_server(self, index: int, lost: bool = True) -> None:
        """Server ``index`` (of every group's, group after group) died: end its lease now, so
        that its buckets fail over at once instead of when the lease runs out (if that fails, it
        lapses by itself). With several server groups the lease is in its group's namespace,
        under its index within the group. ``lost``: no exit was seen (its process may still
        run): the controller marks the lease's end (see ``Controller.forget_server``)."""
        if self.controller is None:
            return
        try:
            if self.per_group:
                group = index // self.per_group
                self.controller.forget_server(index % self.per_group, group, lost=lost)
            else:
                self.controller.forget_server(index, lost=lost)
        except HogwildError as exc:
            role_logger("cluster").warning("could not end ps %d's lease: %s", index, exc)

    def open_store(self, config, network, groups: list[list[str]]) -> None:
        """The ``ps`` store's parent side on the first server group, in an arena of its own."""
        first = {"ps.servers": groups[0], "ps.server_group": 0}
        self.store = store_class("ps")(config.override(first), network, ())
        layout = ArenaLayout()
        self.store.add_regions(layout)
        self.arena = Arena.create(self.job, layout)
        self.store.attach(self.arena)
        if len(groups) > 1:
            ps = config.ps
            replicated = config.cluster.copies > 1  # each group routed by its own bucket map
            self.groups = open_server_groups(
                groups, self.job, "driver", timeout_s=ps.timeout_s, retries=ps.retries,
                keys=ps.keys or None, etcd=config.cluster.etcd if replicated else None,
                etcd_tls=(config.cluster.etcd_tls or None) if replicated else None,
            )  # fmt: skip

    def watch(self, alive: Callable[[], bool]) -> None:
        """The driver's waits on the servers ask ``alive()`` (the store's
        :meth:`~hogwild.store.protocol.ParameterStore.watch_home`)."""
        self.store.watch_home(alive)

    def give(self, params: np.ndarray, velocity: np.ndarray) -> None:
        """The job's starting model, given once (to every server group: they begin as one)."""
        self.store.load(params, velocity)
        if self.groups is not None:
            self.groups.assign(self.store.snapshot()[0])

    def pull_model(self) -> tuple[np.ndarray, np.ndarray, float | None]:
        """The servers' model at an epoch end (every replica idle): parameters and velocity
        (the arena's, overwritten by the next pull), and with several server groups the largest
        distance of a group from their mean before they were made one (else None)."""
        spread = None
        if self.groups is not None:
            spread = self.groups.sync().spread
        self.store.end_epoch()
        params, velocity = self.store.snapshot()
        return params, velocity, spread

    def status(self) -> list[dict]:
        """Every parameter server's counters (every group's)."""
        if self.groups is not None:
            return self.groups.status()
        return self.store.home_status() if self.store is not None else []

    def close_controller(self) -> None:
        """After the servers stopped: stop the controller started for the job, or clear the
        job's keys from the one given."""
        if self.controller is not None:
            controller, self.controller = self.controller, None
            controller.close()

    def close(self, step: Callable[[Callable[[], None]], None]) -> None:
        """Release the groups' clients, the store and the arena, each through ``step`` (which
        runs a release whatever the others did)."""
        if self.groups is not None:
            step(self.groups.close)
            self.groups = None
        if self.store is not None:
            step(self.store.close)
            self.store = None
        if self.arena is not None:
            step(self.arena.close)
            step(self.arena.unlink)
            self.arena = None
