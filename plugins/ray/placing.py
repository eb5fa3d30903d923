"""Where the Ray launcher's roles go: placement groups, actors, their nodes, and letting go.

A role is one Ray actor (:class:`~hogwild_plugins.ray.role_actor.RoleHost`, as
:data:`RoleActor`) and what the driver knows of it (:class:`RayRole`). :class:`Placing` (a part
of :class:`~hogwild_plugins.ray.launcher.RayLauncher`) asks for the roles' placement groups
(a replica's: :func:`~hogwild_plugins.ray.spread.bundles`, one node, or K nodes when spread, its
followers on the other bundles), then their actors, then each actor's node, side by side; a
lost server comes back only on a live node with its old IP (``NodeAffinity``). What it placed
and cannot use it releases (actors killed, placement groups removed), on every failure path.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import ray
from hogwild_plugins.ray.role_actor import RoleHost
from hogwild_plugins.ray.spread import bundles, follower_specs
from ray.exceptions import ActorUnschedulableError, GetTimeoutError, RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from hogwild.cluster.launcher import RoleFailedError
from hogwild.cluster.roles import RoleSpec

__all__ = ["STATUS_EVERY_S", "Placing", "RayRole", "RoleActor"]

# A role's (or follower's) actor asked its status at most this often by the launcher's poll:
# the driver polls as often as every few milliseconds while a replica's portion falls due, and
# each ask is a call into the actor (a Python process of its own) whose answer poll() waits for.
# An exit is seen up to this much later.
STATUS_EVERY_S = 0.2
# A lost server's home looked for again: its restart (and its tier's) waits on the node's
# return, seen up to this much late; a look is one small read of the GCS's node table.
NODE_POLL_S = 0.2
RoleActor = ray.remote(max_restarts=0, max_concurrency=1)(RoleHost)


@dataclass
class RayRole:
    """One role's actor and what the driver knows of it."""

    spec: RoleSpec
    actor: object
    host: str = ""
    node_id: str = ""
    pid: int | None = None
    log: str = ""
    last: list[str] = field(default_factory=list)
    pending: object = None  # a status request in flight (poll)
    asked: float = 0.0  # when poll last asked (time.monotonic()): not again within STATUS_EVERY_S
    # a spread replica's leader: its model.partition_hosts override; a follower: its link address
    link: str = ""


class Placing:
    """The launcher's placing of roles (its ``roles``, ``groups`` and ``homes``; a spread
    replica's followers are :class:`~hogwild_plugins.ray.followers.SpreadFollowers`', added
    and dropped through its ``_add_followers`` and ``_drop_followers``; see the module
    docstring)."""

    def _place_all(self, specs: list[RoleSpec], deadline: float) -> list[RayRole]:
        """The roles' actors, placed side by side and answering (their nodes known): every
        placement group asked for, then every actor, then each one's node (Ray starts their
        worker processes together rather than one after another)."""
        made: list[str] = []  # the placement groups this call asked for
        try:
            return self._place_each(specs, deadline, made)
        except RoleFailedError:
            # a group whose role was never made (or was forgotten) would stay pending, holding
            # its CPUs once placed, and refuse the next start as "holds a role already"
            held = {role.spec.group for role in self.roles.values()}
            for name in made:
                if name not in held and name in self.groups:
                    with contextlib.suppress(Exception):  # already removed with its node
                        remove_placement_group(self.groups[name])
                    del self.groups[name]
            raise

    def _place_each(self, specs: list[RoleSpec], deadline: float, made: list[str]) -> list:
        for spec in specs:
            if spec.group:
                if spec.group in self.groups:
                    raise RoleFailedError(f"{spec.name}: group {spec.group!r} holds a role already")
                wanted, strategy = bundles(spec, self.config.model.partitions, self.spread)
                self.groups[spec.group] = placement_group(
                    wanted, strategy=strategy, name=f"hogwild-{spec.group}"
                )
                made.append(spec.group)
        for spec in specs:
            if spec.group and not self.groups[spec.group].wait(
                max(0.0, deadline - time.monotonic())
            ):
                raise RoleFailedError(self._unplaced(spec, "a node with them free"))
        roles, placed = [], []  # placed: with the spread replicas' followers
        for spec in specs:
            spread = self.spread and spec.kind == "replica"
            options: dict = {"num_cpus": 1 if spread else spec.cpus}
            if spec.group:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    self.groups[spec.group], 0
                )
            elif spec.name in self.homes:  # a lost server back at its address
                try:
                    node_id = self._node_at(spec, self.homes[spec.name], deadline)
                except RoleFailedError:
                    self._unplace(roles)  # those asked for before it in this call
                    raise
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
            elif not self.loopback:  # servers on as many nodes as there are: copies apart
                options["scheduling_strategy"] = "SPREAD"
            role = RayRole(spec, RoleActor.options(**options).remote(spec.name))
            self.roles[spec.name] = role
            roles.append(role)
            placed.append(role)
            if spread:  # a follower host on each other bundle, each on a node of its own
                followers = []
                for g, follower in enumerate(follower_specs(spec, self.config.model.partitions)):
                    strategy = PlacementGroupSchedulingStrategy(self.groups[spec.group], g + 1)
                    actor = RoleActor.options(num_cpus=1, scheduling_strategy=strategy)
                    followers.append(RayRole(follower, actor.remote(follower.name)))
                self._add_followers(spec.name, followers)
                placed += followers
        nodes = [role.actor.where.remote() for role in placed]
        for role, ref in zip(placed, nodes, strict=True):
            spec = role.spec
            try:
                node = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except GetTimeoutError:
                self._unplace(roles)
                raise RoleFailedError(self._unplaced(spec, "them free")) from None
            except ActorUnschedulableError as exc:  # its node (a server's home) died meanwhile
                self._unplace(roles)
                raise RoleFailedError(f"{spec.name}: Ray cannot place its actor: {exc}") from None
            except RayActorError as exc:
                self._unplace(roles)
                raise RoleFailedError(
                    f"{spec.name}: its Ray actor died as it started: {exc}"
                ) from None
            role.host, role.node_id = node["host"], node["node_id"]
            if self.loopback and role.host != self.node_ip:
                raise RoleFailedError(
                    f"{spec.name} was placed on {role.host}, but cluster.host = "
                    f"{self.cluster.host} (loopback) is reachable only on the driver's host "
                    f"{self.node_ip}; set cluster.host to a non-loopback address (roles then bind "
                    "their node's IP)"
                )
        return roles

    def _unplace(self, roles: list[RayRole]) -> None:
        """Roles whose placement failed forgotten, their actors killed and placement groups
        removed (a pending actor placed later would otherwise be taken for a placed one); where
        a server must come back stays in :attr:`homes`."""
        for role in roles:
            if self.roles.get(role.spec.name) is role:
                del self.roles[role.spec.name]
            self._release(role)

    def _release(self, role: RayRole) -> None:
        """``role``'s actor killed and its placement group removed (either may be gone already);
        a spread replica's followers' actors too."""
        for actor in [role.actor, *(f.actor for f in self._drop_followers(role.spec.name))]:
            try:
                ray.kill(actor, no_restart=True)
            except (RayActorError, ValueError):
                pass
        group = self.groups.pop(role.spec.group, None) if role.spec.group else None
        if group is not None:
            try:
                remove_placement_group(group)
            except Exception:  # noqa: BLE001 -- already removed with its node
                pass

    def _homes_up(self, specs: list[RoleSpec]) -> set[str]:
        """The names of ``specs`` with no home to come back to, or a live node there now (one
        read of the node table; none read, none of the homed ones)."""
        live = _live_nodes()
        return {s.name for s in specs if s.name not in self.homes or self.homes[s.name] in live}

    def _node_at(self, spec: RoleSpec, ip: str, deadline: float) -> str:
        """The id of a live node with IP ``ip``, waited for until ``deadline``."""
        while True:
            node_id = _live_nodes().get(ip)
            if node_id is not None:
                return node_id
            if time.monotonic() > deadline:
                raise RoleFailedError(
                    f"{spec.name} must come back at its address on {ip} (the other roles were "
                    f"told it), but no live Ray node has that IP after "
                    f"{self.cluster.start_timeout_s:g} s; start a Ray node there again"
                )
            time.sleep(min(NODE_POLL_S, max(0.0, deadline - time.monotonic()) + 0.01))

    def _unplaced(self, spec: RoleSpec, where: str) -> str:
        return (
            f"Ray did not place {spec.name} within {self.cluster.start_timeout_s:g} s: it needs "
            f"{spec.cpus} CPU(s) and {where}; free in the Ray cluster now: "
            f"{ray.available_resources()}"
        )


def _live_nodes() -> dict[str, str]:
    """The live Ray nodes now, ``{IP: node id}``; none when the GCS does not answer (busy or
    away: the caller looks again)."""
    try:
        nodes = ray.nodes()
    except Exception:  # noqa: BLE001 -- the GCS busy or away: looked for again
        return {}
    live: dict[str, str] = {}
    for node in nodes:  # the first live node at an IP, as the node table lists them
        if node.get("Alive") and node.get("NodeManagerAddress"):
            live.setdefault(node["NodeManagerAddress"], node["NodeID"])
    return live
