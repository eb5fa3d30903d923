"""Starting a Ray job's roles side by side: place, launch, await ready, each failure its own.

:class:`Starting` (a part of :class:`~hogwild_plugins.ray.launcher.RayLauncher`) carries a role
from its spec to its ready address in steps taken for every role at once, as the local launcher's
are (the roles load their kernels together): every actor placed
(:class:`~hogwild_plugins.ray.placing.Placing`; those :meth:`RayLauncher.reserve
<hogwild_plugins.ray.launcher.RayLauncher.reserve>` placed are kept), every key pair made on its
node and entered in the job's roster before any role starts (servers started together are each
other's clients), every etcd client's certificate signed, every process started, then every
ready line awaited, with a ``cluster.start_timeout_s`` of its own.

It keeps one invariant on every path: a role whose process started has its pid recorded before
any failure is raised, so :meth:`~hogwild_plugins.ray.stopping.Stopping.stop_all` stops it like
any other. :meth:`Starting.start_all` fails as a whole (the first failure); a tier of restarts
(:meth:`Starting.restart_all`) takes the same steps with each role's failure its own (a role that
cannot be placed, identified, certified, launched or heard from fails alone, the others start),
but for an error no role owns (one raised while launching that names none), which fails the
tier as a whole.

Restarting (:meth:`Starting.restart`, :meth:`Starting.restart_all`) clears what is left of the
role's process group in its actor and starts it there again; a role whose actor was lost is
placed anew (:meth:`RayLauncher._forget <hogwild_plugins.ray.launcher.RayLauncher._forget>`
keeps a server's node IP for it). A spread replica, whose followers start with it, is restarted
alone.

It expects of the launcher: ``roles``, ``cluster``, ``config``, ``run_dir``, ``node_id``,
``loopback``, ``spread``, ``mirrored``, ``job_keys``, ``etcd_ca``, ``_reported``, ``_get``,
``_last_words``, ``_publish`` and ``_forget``; of its other parts, placing's ``_place_all`` and
``_unplace``, the followers' ``followers``, ``follower_failed``, ``_link_spread``,
``_identify_followers``, ``_check_followers_started`` and ``_clear_spread``, and the job etcd's
``_certify``.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

import ray
from hogwild_plugins.ray.mirrors import files_for
from hogwild_plugins.ray.placing import RayRole
from hogwild_plugins.ray.role_actor import CALL_TIMEOUT_S, POLL_S
from hogwild_plugins.ray.spread import FOLLOWER, FOLLOWER_STOP_LINE
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

from hogwild.cluster.launcher import RoleExit, RoleFailedError
from hogwild.cluster.roles import RoleSpec

__all__ = ["Starting"]

FORWARDED_ENV = ("HOGWILD_", "NUMBA_")  # the driver's settings its own host's roles get
ETCD_CLIENTS = ("ps", "replica", "member")  # the role kinds that speak to the job's etcd


class Starting:
    """Roles started side by side, and restarted (see the module docstring)."""

    def start_all(self, specs: list[RoleSpec]) -> list[str]:
        """Every role's actor placed (those :meth:`reserve` placed are kept), then every
        process started, then the ready lines: the roles start side by side, as the local
        launcher's do (they load their kernels together)."""
        deadline = time.monotonic() + self.cluster.start_timeout_s
        self._place_all([s for s in specs if s.name not in self.roles], deadline)
        roles = [self.roles[spec.name] for spec in specs]
        for role, spec in zip(roles, specs, strict=True):
            role.spec = spec  # reserve() placed it before its command line was known
        followers = [f for role in roles for f in self.followers.get(role.spec.name, [])]
        self._link_spread(roles)
        if self.job_keys is not None:  # every key in the roster before any of them starts:
            for role in roles:  # servers started together are each other's clients (copies);
                self._identify(role, self._argv(role))  # a role placed anew has a new one
            self._identify_followers(followers)  # each where its replica's leader is told
        if self.etcd_ca is not None:
            self._certify([r for r in roles if r.spec.kind in ETCD_CLIENTS])
        self._launch_all([*followers, *roles])  # the followers wait for their leader's job
        # the ready lines get a start_timeout_s of their own, as the local launcher's do: a
        # placement that waited for a lost node's machine must not leave them none
        return self._wait_ready(roles, time.monotonic() + self.cluster.start_timeout_s)

    def _launch_all(self, roles: list[RayRole]) -> None:
        """Every role's process started, each one's pid recorded before the first failure is
        raised: a role that did start is then stopped by :meth:`stop_all` like any other."""
        requests, failure = [], None
        try:
            for role in roles:
                requests.append(self._launch(role))
        except Exception as exc:  # a request not sent (say, a far node's files): the sent ones run
            failure = exc
        for role, request in zip(roles, requests, strict=False):  # only those sent
            try:
                (process,) = self._get([request], [role.spec])
            except RoleFailedError as exc:
                failure = failure or exc
                continue
            role.pid, role.log = process["pid"], process["log"]
        if failure is not None:
            raise failure

    def _argv(self, role: RayRole) -> list[str]:
        """The role's command line on its node (bound to the node's address)."""
        argv = list(role.spec.argv)
        if role.spec.kind == FOLLOWER:  # bound at its link address (port and all) already
            return argv
        if not self.loopback and "--bind" in argv[:-1]:
            argv[argv.index("--bind") + 1] = role.host
        return [*argv, role.link] if role.link else argv

    def _identify(self, role: RayRole, argv: list[str]) -> None:
        """The role's key pair made by its actor on its node; its public key (and its address,
        if fixed) into the job's roster, sent to the nodes that keep a mirror."""
        self.job_keys.publish = self._publish
        (public,) = self._get([role.actor.identity.remote(self.run_dir)], [role.spec])
        self.job_keys.enter(replace(role.spec, argv=tuple(argv)), public)

    def _launch(self, role: RayRole):
        """Ask the role's actor to start its process (a request in flight): with the driver's
        settings on the driver's node, else with a mirror of the files it reads."""
        spec, argv = role.spec, self._argv(role)
        log = os.path.join(self.run_dir, "logs", f"{spec.kind}-{spec.index}.log")
        keep = FOLLOWER_STOP_LINE if spec.kind == FOLLOWER else ""  # relayed at the stop
        if role.node_id == self.node_id:
            env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}
            return role.actor.start.remote(argv, log, os.getcwd(), env, keep=keep)
        self.mirrored.add(role.node_id)
        mirror = {
            "run_dir": self.run_dir,
            "files": files_for(self.run_dir, argv, self.config.ps.keys),
        }
        return role.actor.start.remote(argv, log, None, {}, mirror, keep=keep)

    def _wait_ready(self, roles: list[RayRole], deadline: float) -> list[str]:
        """Each role's ready address, once all have printed it (each entered in the roster as
        it comes)."""
        addresses: dict[str, str] = {}
        while len(addresses) < len(roles):
            waiting = [r for r in roles if r.spec.name not in addresses]
            statuses = self._get(
                [r.actor.status.remote() for r in waiting], [r.spec for r in waiting]
            )
            self._check_followers_started(waiting)
            for role, status in zip(waiting, statuses, strict=True):
                address = self._ready_in(role, status, deadline)
                if address is not None:
                    addresses[role.spec.name] = address
            if len(addresses) < len(roles):
                time.sleep(POLL_S)
        return [addresses[r.spec.name] for r in roles]

    def _wait_each(self, roles: list[RayRole], deadline: float) -> dict[str, str | RoleFailedError]:
        """:meth:`_wait_ready` of roles without followers, each one's failure its own: role
        name -> its ready address, or why it exited or stayed silent past ``deadline``."""
        results: dict[str, str | RoleFailedError] = {}
        while len(results) < len(roles):
            waiting = [r for r in roles if r.spec.name not in results]
            refs = [r.actor.status.remote() for r in waiting]  # asked together, read in turn
            for role, ref in zip(waiting, refs, strict=True):
                try:
                    (status,) = self._get([ref], [role.spec])
                    address = self._ready_in(role, status, deadline)
                    if address is not None:
                        results[role.spec.name] = address
                except RoleFailedError as exc:
                    results[role.spec.name] = exc
            if len(results) < len(roles):
                time.sleep(POLL_S)
        return results

    def _ready_in(self, role: RayRole, status: dict, deadline: float) -> str | None:
        """The role's ready address from its actor's ``status`` (entered in the roster), None
        while it may still print it; raises :class:`RoleFailedError` once it cannot."""
        spec = role.spec
        role.last = status["last"]
        if status["address"]:
            if self.job_keys is not None:
                self.job_keys.located(spec.name, status["address"])
            return status["address"]
        code = status["returncode"]
        if code is not None or time.monotonic() > deadline:
            why = (
                RoleExit(spec.name, role.host, code).describe()
                if code is not None
                else f"{spec.name} on {role.host} did not print its ready line within "
                f"{self.cluster.start_timeout_s:g} s"
            )
            raise RoleFailedError(f"{why} while starting: {self._last_words(role)}")
        return None

    def start(self, spec: RoleSpec) -> str:
        return self.start_all([spec])[0]

    def restart(self, spec: RoleSpec) -> str:
        return self._restart_one(spec)

    def _restart_one(self, spec: RoleSpec) -> str:
        """What is left of ``spec``'s role cleared in its actor (a spread replica's followers
        too), then the role started again there, or placed anew if its actor is lost."""
        self.follower_failed.pop(spec.name, None)  # a failure poll never reported is stale
        role = self.roles.get(spec.name)
        if role is not None and spec.name in self.followers:
            self._clear_spread(role)
            role = None
        if role is not None:
            wait_s = 2 * self.cluster.stop_timeout_s + CALL_TIMEOUT_S
            try:
                ray.get(role.actor.clear.remote(self.cluster.stop_timeout_s), timeout=wait_s)
            except GetTimeoutError:
                raise RoleFailedError(
                    f"{spec.name}: its Ray actor did not clear the role within {wait_s:g} s"
                ) from None
            except ActorUnavailableError as exc:  # unreachable, not known dead: its process may
                # still hold the address, so it is not placed anew (a failed attempt; the next
                # finds it back, or lost)
                raise RoleFailedError(f"{spec.name}: its Ray actor is unreachable: {exc}") from None
            except RayActorError:  # its actor (or node) is lost: place the role anew
                self._forget(role)
        self._reported.discard(spec.name)
        return self.start(spec)

    def restart_all(self, specs: list[RoleSpec]) -> list[str | RoleFailedError]:
        """Every one of ``specs`` cleared in its actor (asked together), then those cleared or
        lost started side by side (:meth:`_start_each`); each one's address or failure. A
        spread replica (its followers on other nodes) is restarted alone (:meth:`restart`)."""
        results: dict[str, str | RoleFailedError] = {}
        for spec in specs:
            if spec.name in self.followers or (self.spread and spec.kind == "replica"):
                try:
                    results[spec.name] = self._restart_one(spec)
                except RoleFailedError as exc:
                    results[spec.name] = exc
        specs_together = [spec for spec in specs if spec.name not in results]
        wait_s = 2 * self.cluster.stop_timeout_s + CALL_TIMEOUT_S
        clears = [
            (
                self.roles[spec.name],
                self.roles[spec.name].actor.clear.remote(self.cluster.stop_timeout_s),
            )
            for spec in specs_together
            if spec.name in self.roles
        ]
        deadline = time.monotonic() + wait_s
        for role, ref in clears:
            name = role.spec.name
            try:
                ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except GetTimeoutError:
                results[name] = RoleFailedError(
                    f"{name}: its Ray actor did not clear the role within {wait_s:g} s"
                )
            except ActorUnavailableError as exc:  # unreachable, not known dead: its process may
                # still hold the address, so it is not placed anew (a failed attempt; the next
                # finds it back, or lost)
                results[name] = RoleFailedError(f"{name}: its Ray actor is unreachable: {exc}")
            except RayActorError:  # its actor (or node) is lost: place the role anew
                self._forget(role)
        pending = [spec for spec in specs_together if spec.name not in results]
        self._reported.difference_update(spec.name for spec in pending)
        results.update(self._start_each(pending))
        return [results[spec.name] for spec in specs]

    def _start_each(self, specs: list[RoleSpec]) -> dict[str, str | RoleFailedError]:
        """:meth:`start_all`'s steps, each role's failure its own: the roles lost with their
        actors placed together (one by one only if that fails, to tell which cannot be), every
        key and certificate made, every process started, then the ready lines. Roles to come
        back at a node that is not up go after all the others have started (a lost host's
        parameter server never holds up a data server whose node is back)."""
        up = self._homes_up([s for s in specs if s.name not in self.roles])
        waiting = [s for s in specs if s.name not in self.roles and s.name not in up]
        if waiting and len(waiting) < len(specs):
            ready = [s for s in specs if s not in waiting]
            return self._start_each(ready) | self._start_each(waiting)
        results: dict[str, str | RoleFailedError] = {}
        deadline = time.monotonic() + self.cluster.start_timeout_s
        unplaced = [spec for spec in specs if spec.name not in self.roles]
        try:
            self._place_all(unplaced, deadline)
        except RoleFailedError as joint:  # which cannot be placed: each again alone, any the
            # failed call left placed unplaced first; a single role's failure is its own already
            self._unplace([self.roles[s.name] for s in unplaced if s.name in self.roles])
            if len(unplaced) == 1:
                results[unplaced[0].name] = joint
            else:
                # those whose home node is up first, each within a start_timeout_s of its own: one
                # that cannot be placed never spends another's time
                up = self._homes_up(unplaced)
                for spec in sorted(unplaced, key=lambda s: s.name not in up):
                    try:
                        self._place_all([spec], time.monotonic() + self.cluster.start_timeout_s)
                    except RoleFailedError as exc:
                        results[spec.name] = exc
        roles = [self.roles[spec.name] for spec in specs if spec.name not in results]
        for role, spec in zip(roles, [s for s in specs if s.name not in results], strict=True):
            role.spec = spec

        def each(step, roles: list[RayRole]) -> list[RayRole]:
            """``step`` of every role; those it did not fail."""
            for role in roles:
                try:
                    step(role)
                except RoleFailedError as exc:
                    results[role.spec.name] = exc
            return [r for r in roles if r.spec.name not in results]

        if self.job_keys is not None:  # every key in the roster before any of them starts
            roles = each(lambda role: self._identify(role, self._argv(role)), roles)
        if self.etcd_ca is not None:
            certified = each(
                lambda role: self._certify([role]),
                [r for r in roles if r.spec.kind in ETCD_CLIENTS],
            )
            roles = [r for r in roles if r in certified or r.spec.kind not in ETCD_CLIENTS]
        roles = self._launch_each(roles, results)
        # the ready lines get a start_timeout_s of their own (see start_all): a deadline the
        # placement spent, or the one-by-one placement outlived, would fail them unheard
        results.update(self._wait_each(roles, time.monotonic() + self.cluster.start_timeout_s))
        return results

    def _launch_each(
        self, roles: list[RayRole], results: dict[str, str | RoleFailedError]
    ) -> list[RayRole]:
        """:meth:`_launch_all`, a role whose process did not start entered in ``results``; the
        roles started. An error that is no role's (a request not sent) is raised once every
        sent request's pid is recorded."""
        requests, failure = [], None
        for role in roles:
            try:
                requests.append((role, self._launch(role)))
            except RoleFailedError as exc:
                results[role.spec.name] = exc
            except Exception as exc:  # as _launch_all: the sent ones run, and are recorded
                failure = failure or exc
        started = []
        for role, request in requests:
            try:
                (process,) = self._get([request], [role.spec])
            except RoleFailedError as exc:
                results[role.spec.name] = exc
                continue
            role.pid, role.log = process["pid"], process["log"]
            started.append(role)
        if failure is not None:
            raise failure
        return started
