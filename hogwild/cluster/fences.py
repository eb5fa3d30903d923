"""The driver's fences: each replica's incarnation, and every parameter server told which are
replaced.

A replica the driver takes for dead (its process exited, or it stopped answering the driver:
paused, or on a host cut off) is restarted as the replica's next **incarnation**, and its
portions go to others. The old process may live on (a launcher cannot always reach a host that
is cut off), and it would go on pushing until its own silence timeout. So before the driver hands
out the lost portions it **fences** the replica: every parameter server of the job is told that
incarnations of it older than the new one are refused (:mod:`hogwild.net.fencing` has the token
every request of a replica carries and the servers' table). A server that does not answer then
(dead, or cut off itself) is told again: when the driver restarted it (:meth:`ReplicaFences.tell`:
a restarted server starts with no fences), and every ``retry_s`` seconds while it does not answer
(:meth:`ReplicaFences.retry`, one quick attempt each: a server cut off and back again, never
restarted, holds only the fences given before the cut).

:class:`ReplicaFences` is the driver's side: the incarnations it started, the fences it gave,
and the control requests that carry them; it owns one control client per server, closed by
:meth:`ReplicaFences.close`.
"""

from __future__ import annotations

from hogwild.errors import HogwildError
from hogwild.logs import role_logger
from hogwild.net.control import ControlClient

__all__ = ["QUICK_TIMEOUT_S", "RETRY_S", "ReplicaFences"]

RETRY_S = 5.0  # how often a server that missed a fence is asked again
QUICK_TIMEOUT_S = 0.5  # a retry's one attempt: the driver's loop waits at most this per server


class ReplicaFences:
    """The incarnations of a job's replicas and their fences on its servers (see the module
    docstring).

    Args:
        job: The job's name on the wire.
        servers: Every parameter server of the job (every server group's), ``HOST:PORT``.
        timeout_s, retries: Per fence request (``ps.timeout_s``, ``ps.retries``).
        keys: CURVE key directory (servers beyond loopback).
        retry_s: How often a server that did not take a fence is asked again.

    Attributes:
        incarnations: replica -> the incarnation started last (0: its first start).
        fenced: replica -> the fence given (its incarnations below are refused).
        unanswered: server address -> when a fence did not reach it (told again on its return).
    """

    def __init__(
        self,
        job: str,
        servers: list[str],
        *,
        timeout_s: float = 5.0,
        retries: int = 3,
        keys: str | None = None,
        retry_s: float = RETRY_S,
    ) -> None:
        self.job, self.servers = job, list(servers)
        self.timeout_s, self.retries, self.keys = timeout_s, retries, keys
        self.retry_s = retry_s
        self.incarnations: dict[int, int] = {}
        self.fenced: dict[int, int] = {}
        self.unanswered: set[str] = set()
        self.retried_at = float("-inf")
        self._clients: dict[tuple[str, bool], ControlClient] = {}

    def incarnation(self, replica: int) -> int:
        """The incarnation ``replica`` runs as (0 until it is replaced)."""
        return self.incarnations.get(replica, 0)

    def replace(self, replica: int) -> int:
        """``replica`` is taken for dead: its next incarnation, fenced on every server that
        answers (before its portions go to others). Fencing twice before the new incarnation
        starts gives the same one."""
        if self.fenced.get(replica, 0) > self.incarnation(replica):
            return self.fenced[replica]  # fenced already (it stopped answering, then exited)
        new = self.incarnation(replica) + 1
        self.fenced[replica] = new
        told = sum(  # one known not to answer is asked once, quickly (it is asked again)
            self._fence(server, replica, new, quick=server in self.unanswered)
            for server in self.servers
        )
        role_logger("cluster").warning(
            "replica %d fenced below incarnation %d on %d of %d parameter server(s)",
            replica, new, told, len(self.servers),
        )  # fmt: skip
        return new

    def started(self, replica: int, incarnation: int) -> None:
        """``replica`` is started as ``incarnation`` (the one :meth:`replace` gave)."""
        self.incarnations[replica] = incarnation

    def tell(self, server: str, quick: bool = False) -> bool:
        """``server`` is back (restarted, or answering again): every fence given so far,
        again; whether it took them all."""
        self.unanswered.discard(server)
        for replica, incarnation in sorted(self.fenced.items()):
            if not self._fence(server, replica, incarnation, quick):
                return False
        return True

    def retry(self, now: float) -> None:
        """Every ``retry_s`` seconds, the servers that did not take a fence, asked again (one
        quick attempt each, so that the driver's loop waits little on a server cut off)."""
        if not self.unanswered or now - self.retried_at < self.retry_s:
            return
        self.retried_at = now
        for server in sorted(self.unanswered):
            if self.tell(server, quick=True):
                role_logger("cluster").info("%s took the fences it missed", server)

    def _fence(self, server: str, replica: int, incarnation: int, quick: bool = False) -> bool:
        """Whether ``server`` took the fence (one that does not answer is told again later)."""
        try:
            answer = self._client(server, quick).call(
                "fence", replica=replica, incarnation=incarnation
            )
        except HogwildError as exc:
            self.unanswered.add(server)  # told again: on its restart, or by retry()
            if not quick:
                role_logger("cluster").warning(
                    "could not fence replica %d below incarnation %d on %s (asked again every "
                    "%g s): %s", replica, incarnation, server, self.retry_s, exc,
                )  # fmt: skip
            return False
        fence = answer.get("fence")
        if not isinstance(fence, int) or fence < incarnation:
            raise HogwildError(
                f"parameter server {server} answered the fence of replica {replica} below "
                f"incarnation {incarnation} with {answer!r}"
            )
        return True

    def _client(self, server: str, quick: bool) -> ControlClient:
        if (server, quick) not in self._clients:
            timeout_s = min(self.timeout_s, QUICK_TIMEOUT_S) if quick else self.timeout_s
            self._clients[server, quick] = ControlClient(
                server, self.job, timeout_s=timeout_s, retries=0 if quick else self.retries,
                keys=self.keys,
            )  # fmt: skip
        return self._clients[server, quick]

    def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()
