"""A spread replica's followers as the Ray launcher keeps them (``partition_placement = spread``).

:mod:`~hogwild_plugins.ray.spread` decides their names, bundles and command lines;
:class:`SpreadFollowers` (a part of :class:`~hogwild_plugins.ray.launcher.RayLauncher`; it owns
``followers``, by replica, and ``follower_failed``) carries them through the replica's life:
each one's link address and command line (:meth:`~SpreadFollowers._link_spread`), its key pair
in the job's roster, its exit while the replica starts failing the start with its last words,
its failure while the replica trains killing the replica (whose exit then names the follower),
its replica's restart (cleared in their actors, or, one actor lost, the replica placed anew and
the healthy followers' key pairs removed), and the job's stop (every follower at once, after the
leaders, each one's stop line then said on the driver's stderr).
"""

from __future__ import annotations

import signal
import time
from dataclasses import replace

import ray
from hogwild_plugins.ray.placing import STATUS_EVERY_S
from hogwild_plugins.ray.role_actor import CALL_TIMEOUT_S
from hogwild_plugins.ray.spread import follower_argv, partition_hosts
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

from hogwild.cluster.launcher import RoleExit, RoleFailedError
from hogwild.logs import role_logger
from hogwild.net.address import host_port

__all__ = ["SpreadFollowers"]

KEYS_DROP_S = 5.0  # what a healthy follower's actor gets to remove its key pair


class SpreadFollowers:
    """The spread replicas' followers' lifecycle (see the module docstring).

    It owns ``followers`` (replica name: its follower roles) and ``follower_failed`` (replica
    name: its follower's failure, not yet reported), declared by :meth:`_init_followers`;
    placing adds and drops followers only through :meth:`_add_followers` and
    :meth:`_drop_followers`, and the launcher reads them. It expects of the launcher: ``roles``,
    ``_reported``, ``run_dir``, ``cluster``, ``config`` and ``job_keys``, and ``_get``,
    ``_send``, ``_wait_exited``, ``_reap``, ``_last_words`` and ``_forget``.
    """

    def _init_followers(self) -> None:
        self.followers: dict[str, list] = {}  # a spread replica's follower hosts (RayRoles)
        self.follower_failed: dict[str, str] = {}  # replica: its follower's failure, unreported

    def _add_followers(self, replica: str, followers: list) -> None:
        """``replica``'s followers, placed (their actors made)."""
        self.followers[replica] = followers

    def _drop_followers(self, replica: str) -> list:
        """``replica``'s followers no longer kept (their actors about to be killed)."""
        return self.followers.pop(replica, [])

    def _identify_followers(self, followers) -> None:
        """Each follower's key pair made on its node; its public key and link address into the
        job's roster (its leader's link finds it by address)."""
        for follower in followers:
            (public,) = self._get([follower.actor.identity.remote(self.run_dir)], [follower.spec])
            self.job_keys.add(follower.spec.name, public, follower.link)

    def _link_spread(self, roles: list) -> None:
        """Each spread replica's link: a port free on each of its nodes, its followers' command
        lines and its own ``model.partition_hosts`` (:mod:`~hogwild_plugins.ray.spread`)."""
        for role in roles:
            followers = self.followers.get(role.spec.name)
            if not followers:
                continue
            every = [role, *followers]
            ports = self._get(
                [r.actor.free_port.remote(r.host) for r in every], [r.spec for r in every]
            )
            addresses = [host_port(r.host, p) for r, p in zip(every, ports, strict=True)]
            role.link = partition_hosts(addresses[0], addresses[1:])
            wait_s = self.cluster.start_timeout_s
            for follower, address in zip(followers, addresses[1:], strict=True):
                argv = follower_argv(address, self.config.ps.keys, wait_s, role.spec.name)
                follower.spec = replace(follower.spec, argv=argv)
                follower.link = address

    def _check_followers_started(self, waiting: list) -> None:
        """A spread replica whose follower exited while it starts fails as a role, with the
        follower's last words (its leader would wait for it until its own start timeout)."""
        followers = [f for r in waiting for f in self.followers.get(r.spec.name, [])]
        statuses = self._get([f.actor.status.remote() for f in followers],
                             [f.spec for f in followers])  # fmt: skip
        for follower, status in zip(followers, statuses, strict=True):
            follower.last = status["last"]
            if status["returncode"] is not None:
                exit = RoleExit(follower.spec.name, follower.host, status["returncode"])
                raise RoleFailedError(f"{exit.describe()} while starting: "
                                      f"{self._last_words(follower)}")  # fmt: skip

    def _watch_followers(self) -> None:
        """A spread replica whose follower failed (exited but by its leader's STOP, or lost
        with its node) is killed whole: the driver then sees the replica exit and restarts it,
        rather than the leader waiting ``model.partition_silence_s`` for a host that is gone."""
        watched = [
            (name, f)
            for name, fs in self.followers.items()
            if name in self.roles and name not in self._reported and self.roles[name].pid
            for f in fs
            if f.pid is not None
        ]
        now = time.monotonic()
        for _, follower in watched:
            if follower.pending is None and now - follower.asked >= STATUS_EVERY_S:
                follower.pending, follower.asked = follower.actor.status.remote(), now
        refs = [f.pending for _, f in watched if f.pending is not None]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        failed = set()
        for name, follower in watched:
            if follower.pending not in ready:
                continue
            ref, follower.pending = follower.pending, None
            try:
                status = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except ActorUnavailableError:
                continue
            except RayActorError:
                status = {"returncode": None, "last": follower.last, "lost": True}
            follower.last = status["last"]
            if status["returncode"] not in (None, 0) or status.get("lost"):
                failed.add(name)
                exit_ = RoleExit(follower.spec.name, follower.host, status["returncode"])
                self.follower_failed.setdefault(
                    name, f"{exit_.describe()}: {self._last_words(follower)}"
                )
        for name in failed:
            self._send([self.roles[name]], signal.SIGKILL, process_group=True)

    def _replica_exit(self, exit_: RoleExit) -> RoleExit:
        """A spread replica's exit as the driver hears it: naming its follower's failure, where
        one made the launcher kill it (its own exit would say only "killed by SIGKILL")."""
        failure = self.follower_failed.pop(exit_.name, "")
        if not failure:
            return exit_
        return replace(exit_, why=f"{exit_.describe()} by its launcher, as {failure}")

    def _clear_spread(self, replica) -> None:
        """A spread replica's leader and followers cleared in their actors, to be started there
        again; if any actor is lost (a follower's node, say), the whole replica is forgotten and
        placed anew."""
        every = [replica, *self.followers[replica.spec.name]]
        wait_s = 2 * self.cluster.stop_timeout_s + CALL_TIMEOUT_S
        deadline = time.monotonic() + wait_s
        refs = [r.actor.clear.remote(self.cluster.stop_timeout_s) for r in every]
        try:
            for ref in refs:
                ray.get(ref, timeout=wait_s)
        # ActorUnavailableError (not known dead) is among them: unlike a lone role's restart,
        # the replica is placed anew rather than waited for, since its servers fence the old
        # incarnation (its followers push with its token) should the actor come back
        except (GetTimeoutError, RayActorError):
            # the healthy actors may still be inside their clear (one call at a time each):
            # their drop_keys would queue behind it, past its wait, and their keys be left
            ray.wait(refs, num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic()))
            self._drop_keys(every)  # those on healthy nodes: placed anew, their keys are stale
            self._forget(replica)
            return
        for follower in every[1:]:
            follower.pid, follower.pending = None, None

    def _drop_keys(self, roles) -> None:
        """Each reachable actor's own key pair removed (not the node's mirror, which the node's
        other roles read), waited for briefly: its replica is about to be forgotten."""
        refs = []
        for role in roles:
            try:
                refs.append(role.actor.drop_keys.remote())
            except (RayActorError, ValueError):
                pass
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=KEYS_DROP_S)

    def _stop_followers(self) -> None:
        """Every spread replica's followers stopped and reaped in one pass, after the leaders
        (each would leave after ``model.partition_silence_s`` by itself), whether or not their
        leader ever started."""
        followers = [f for fs in self.followers.values() for f in fs if f.pid]
        self._send(followers, signal.SIGTERM)
        self._wait_exited(followers, self.cluster.stop_timeout_s)
        self._send(followers, signal.SIGKILL, process_group=True)
        self._reap(followers)
        self._relay_stop_lines(followers)

    def _relay_stop_lines(self, followers: list) -> None:
        """Each follower's stop line (what its takes pulled; its actor keeps it apart from its
        last lines) said on the driver's stderr: its log is on its node, in the run directory's
        mirror that the job's stop removes. A follower that left none (killed before it could
        say it, or with no home) is named in a warning. Never raises: this runs inside the
        job's orderly stop, which must go on to the data and ps roles whatever Ray answers."""
        try:
            refs = [f.actor.status.remote() for f in followers]
            if refs:
                ray.wait(refs, num_returns=len(refs), timeout=CALL_TIMEOUT_S)
        except Exception as exc:
            role_logger("cluster").warning("could not ask the followers for their stop lines: "
                                           "%r", exc)  # fmt: skip
            return
        log = role_logger("cluster")
        for follower, ref in zip(followers, refs, strict=True):
            name = f"{follower.spec.name} on {follower.host}"
            try:
                kept = ray.get(ref, timeout=0)["kept"]
            # lost with its node (GetTimeoutError, RayActorError), RayTaskError, ObjectLostError
            except Exception as exc:
                log.warning("%s: no stop line, its actor did not answer: %r", name, exc)
                continue
            if kept is None:
                log.warning("%s left no stop line (killed before it could say what its takes "
                            "pulled, or it had no home)", name)  # fmt: skip
            else:
                log.info("%s: %s", name, kept)
