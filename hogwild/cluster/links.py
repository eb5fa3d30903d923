"""The driver's control links to its replicas: one client each, and what a failed call means.

Every request the driver makes of a replica (``train``, ``close``, ``status``, ``stop``) goes
through :meth:`ReplicaLinks.call`, which keeps these promises:

* a replica the launcher saw exit is not waited for: its client asks the supervisor whether the
  role still lives between retries (:meth:`~hogwild.cluster.supervisor.Supervisor.poll`), and a
  replica that died and will be restarted is answered None at once (the next recovery restarts
  it and hands its work out again);
* a replica that does not answer through every retry while the launcher sees it alive (paused,
  or cut off from the driver) is handed to ``unresponsive``, the driver's, which fences it on the
  servers and kills it (:mod:`hogwild.cluster.fences`): once the launcher saw it exit it is
  answered None like any dead replica that will be restarted;
* a replica between its fence and its return (its client closed, the restart under way, the
  new incarnation not yet serving) is answered None without a request: nobody serves it yet;
* a call that fails otherwise names its cause: the role that died and will not come back (the
  supervisor's :meth:`~hogwild.cluster.supervisor.Supervisor.check` stops the job naming it), or
  else the replica and the request it did not answer.
"""

from __future__ import annotations

from collections.abc import Callable

from hogwild.cluster.supervisor import RestartPolicy, Supervisor
from hogwild.errors import HogwildError
from hogwild.net.control import ControlClient

__all__ = ["ReplicaLinks"]


class ReplicaLinks:
    """Control clients of a job's replicas (see the module docstring).

    Args:
        job: The job's name on the wire.
        ps: The job's ``[ps]`` section (``timeout_s``, ``retries``, ``keys``).
        policy: The restart policy (who exited, who will come back).
        supervisor: Its adapter (polls the launcher, stops the job).
        unresponsive: ``unresponsive(replica)``: a replica that did not answer is taken for dead
            (fenced, killed); whether it will be restarted. None: the call fails.
    """

    def __init__(
        self,
        job: str,
        ps,
        policy: RestartPolicy,
        supervisor: Supervisor,
        unresponsive: Callable[[int], bool] | None = None,
    ) -> None:
        self.job, self.ps, self.policy, self.supervisor = job, ps, policy, supervisor
        self.unresponsive = unresponsive
        self.clients: list[ControlClient | None] = []  # None: closed until its return

    def __len__(self) -> int:
        return len(self.clients)

    def connect(self, addresses: list[str]) -> None:
        """A client for each replica, in replica order."""
        self.clients = [self._client(i, address) for i, address in enumerate(addresses)]

    def reconnect(self, replica: int, address: str) -> None:
        """Replica ``replica`` is back on ``address`` (its old client was closed at its fence;
        closed here if it was not)."""
        self.close(replica)
        self.clients[replica] = self._client(replica, address)

    def close(self, replica: int) -> None:
        """Replica ``replica`` was fenced (it is restarting): its client closed until
        :meth:`reconnect`; calls to it are answered None meanwhile."""
        client, self.clients[replica] = self.clients[replica], None
        if client is not None:
            client.close()

    def call(self, replica: int, op: str, **body) -> dict | None:
        """A control request to a replica; None when it died and will be restarted, or was
        fenced and is not back yet (its work is the coordinator's again), else a failure names
        the replica (or the role that died)."""
        name = f"replica {replica}"
        client = self.clients[replica]
        if client is None or self.policy.awaiting_restart(name):
            return None  # dead, or restarting and not back yet: nobody to ask
        try:
            return client.call(op, **body)
        except HogwildError as exc:
            self.supervisor.poll()
            if self.policy.awaiting_restart(name):
                return None
            if self.unresponsive is not None and self.unresponsive(replica):
                return None
            self.supervisor.check()  # a role that died is the cause: say so
            raise HogwildError(f"replica {replica} did not answer {op!r}: {exc}") from None

    def stop_all(self) -> bool:
        """Tell every live replica to stop and close every client; whether any was asked."""
        asked, clients, self.clients = bool(self.clients), self.clients, []
        for index, client in enumerate(clients):
            if client is None:  # fenced, not back: nothing to ask or close
                continue
            try:
                if f"replica {index}" not in self.policy.gone:  # nobody there: do not wait
                    client.call("stop")
            except HogwildError:
                pass
            finally:
                client.close()
        return asked

    def _client(self, replica: int, address: str) -> ControlClient:
        ps = self.ps
        return ControlClient(
            address,
            self.job,
            timeout_s=ps.timeout_s,
            retries=ps.retries,
            keys=ps.keys or None,
            alive=self._alive_check(f"replica {replica}"),
        )

    def _alive_check(self, name: str):
        """For a role's control client: False once the launcher saw the role exit, so a call
        to a dead replica ends at once instead of after every retry."""

        def alive() -> bool:
            self.supervisor.poll()
            return name not in self.policy.gone

        return alive
