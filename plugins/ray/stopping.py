"""Stopping a Ray job's roles: kind by kind, SIGTERM, a wait, SIGKILL, then the actors.

:class:`Stopping` (a part of :class:`~hogwild_plugins.ray.launcher.RayLauncher`) follows
:data:`~hogwild.cluster.launcher.STOP_ORDER`: replicas get ``grace_s`` to leave, then each kind
is sent SIGTERM, waited for up to ``cluster.stop_timeout_s``, and its process groups are
SIGKILLed and reaped (a spread replica's followers after their leaders); then the job's etcd
members stop (after the servers, whose leases they give back), the run directory's mirrors are
removed, every actor is killed and every placement group removed, and a Ray connection the
launcher made is shut down. The invariant: :meth:`Stopping.stop_all` runs once, and whatever
failed while the kinds stopped, the last steps (etcd, mirrors, actors, groups) run, one after
another (one of them that raises skips those after it). Roles whose actor died
anyway get SIGTERM from the kernel (``PR_SET_PDEATHSIG``), and Ray kills a driver's actors when
the driver is gone.

It expects of the launcher: ``roles``, ``groups``, ``cluster``, ``run_dir``, ``mirrored``,
``etcd_members``, ``_stopped``, ``_reported``, ``_own_connection`` and ``_every_role``, and of
the followers' part ``_stop_followers``.
"""

from __future__ import annotations

import signal
import time

import ray
from hogwild_plugins.ray.mirrors import remove_left_mirrors, remove_mirrors
from hogwild_plugins.ray.placing import RayRole
from hogwild_plugins.ray.role_actor import CALL_TIMEOUT_S, POLL_S
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError
from ray.util.placement_group import remove_placement_group

from hogwild.cluster.launcher import STOP_ORDER

__all__ = ["Stopping"]

REAP_S = 10.0  # after SIGKILL, until the process is gone


class Stopping:
    """The job's roles stopped, and everything placed for them released (see the module
    docstring)."""

    def stop_all(self, grace_s: float = 0.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            for kind in STOP_ORDER:
                group = [r for r in self.roles.values() if r.spec.kind == kind and r.pid]
                if kind == "replica" and grace_s > 0:
                    group_left = self._wait_exited(group, grace_s)
                else:
                    group_left = group
                self._send(group_left, signal.SIGTERM)
                self._wait_exited(group_left, self.cluster.stop_timeout_s)
                self._send(group, signal.SIGKILL, process_group=True)  # stragglers, workers too
                self._reap(group)
                if kind == "replica":  # their leaders gone, every spread replica's followers
                    self._stop_followers()
        finally:
            if self.etcd_members is not None:  # after the servers (their leases given back),
                self.etcd_members.stop()  # before Ray goes (the members' data removed)
            remove_mirrors([role.actor for role in self._every_role()])
            kept = {role.node_id for role in self._every_role()}  # each removed its node's
            remove_left_mirrors(self.run_dir, self.mirrored - kept)  # forgotten roles' nodes
            self._remove_actors()
            self._reported.update(self.roles)
            if self._own_connection and ray.is_initialized():
                ray.shutdown()

    def _send(self, roles: list[RayRole], signum: int, process_group: bool = False) -> None:
        refs = [r.actor.send.remote(signum, process_group) for r in roles]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=CALL_TIMEOUT_S)

    def _wait_exited(self, roles: list[RayRole], seconds: float) -> list[RayRole]:
        """Wait up to ``seconds`` for the roles to exit; those still running."""
        deadline = time.monotonic() + seconds
        running = list(roles)
        while running:
            refs = [r.actor.status.remote() for r in running]
            ray.wait(refs, num_returns=len(refs), timeout=CALL_TIMEOUT_S)
            still = []
            for role, ref in zip(running, refs, strict=True):
                try:
                    status = ray.get(ref, timeout=0)
                except (GetTimeoutError, ActorUnavailableError):
                    still.append(role)
                    continue
                except RayActorError:
                    continue  # its actor is gone (and took the role with it)
                if status["returncode"] is None:
                    still.append(role)
            running = still
            if not running or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        return running

    def _reap(self, roles: list[RayRole]) -> None:
        refs = [r.actor.reap.remote(REAP_S) for r in roles]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=REAP_S + CALL_TIMEOUT_S)

    def _remove_actors(self) -> None:
        for role in self._every_role():
            try:
                ray.kill(role.actor, no_restart=True)
            except (RayActorError, ValueError):
                pass
        for group in self.groups.values():
            try:
                remove_placement_group(group)
            except Exception:  # noqa: BLE001 -- already removed, or Ray is going away
                pass
