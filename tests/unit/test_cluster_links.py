"""The driver's links to its replicas (:mod:`hogwild.cluster.links`), with stand-in clients."""

from __future__ import annotations

import pytest

from hogwild.cluster.launcher import RoleExit
from hogwild.cluster.links import ReplicaLinks
from hogwild.cluster.supervisor import RestartPolicy, Supervisor
from hogwild.errors import HogwildError, RoleFailedError
from hogwild.net.channel import Cancelled


class Launcher:
    def __init__(self) -> None:
        self.exits: list[RoleExit] = []

    def poll(self) -> list[RoleExit]:
        out, self.exits = self.exits, []
        return out


class Client:
    def __init__(self, answer=None, fail: str = "") -> None:
        self.answer, self.fail, self.asked, self.closed = answer, fail, [], False

    def call(self, op: str, **body):
        self.asked.append(op)
        if self.fail:
            raise HogwildError(self.fail)
        return self.answer

    def close(self) -> None:
        self.closed = True


def links(restarts: int = 1, *clients: Client):
    launcher = Launcher()
    policy = RestartPolicy(restarts)
    supervisor = Supervisor(policy, launcher, lambda i: None, lambda r: "", lambda r, a: None)
    for i in range(len(clients)):
        supervisor.supervise(f"replica {i}", "replica", i)
    out = ReplicaLinks("job", None, policy, supervisor)
    out.clients = list(clients)
    return out, launcher


def test_a_live_replica_answers_and_a_dead_one_that_comes_back_is_not_asked() -> None:
    alive, dead = Client({"state": "idle"}), Client(fail="timed out")
    replicas, launcher = links(1, alive, dead)
    assert replicas.call(0, "status") == {"state": "idle"}
    launcher.exits = [RoleExit("replica 1", "h", -9)]
    assert replicas.call(1, "status") is None  # it died: the next recovery restarts it
    assert replicas.call(1, "status") is None and dead.asked == ["status"]


def test_a_failed_call_names_the_role_that_will_not_come_back_or_the_replica() -> None:
    replicas, launcher = links(0, Client(fail="timed out"))
    with pytest.raises(HogwildError, match="replica 0 did not answer 'train': timed out"):
        replicas.call(0, "train", epoch=0)
    launcher.exits = [RoleExit("replica 0", "h", 1)]  # no restarts: the job stops, naming it
    with pytest.raises(RoleFailedError, match="replica 0 on h exited with status 1"):
        replicas.call(0, "status")


def test_stop_all_asks_the_live_replicas_only_and_closes_every_client() -> None:
    live, gone = Client({"ok": True}), Client(fail="refused")
    replicas, launcher = links(1, live, gone)
    launcher.exits = [RoleExit("replica 1", "h", -9)]
    replicas.supervisor.poll()
    assert replicas.stop_all() is True
    assert live.asked == ["stop"] and gone.asked == [] and live.closed and gone.closed
    assert len(replicas) == 0 and replicas.stop_all() is False


def test_a_replica_that_does_not_answer_is_handed_over_and_answered_none_once_it_exited() -> None:
    silent = Client(fail="timed out")
    replicas, launcher = links(1, silent)
    taken: list[int] = []

    def unresponsive(replica: int) -> bool:  # the driver: fence, kill, wait for the exit
        taken.append(replica)
        launcher.exits = [RoleExit("replica 0", "h", -9)]
        replicas.supervisor.poll()
        return replicas.policy.awaiting_restart("replica 0")

    replicas.unresponsive = unresponsive
    assert replicas.call(0, "status") is None and taken == [0]
    assert replicas.call(0, "status") is None and taken == [0]  # dead now: not asked again

    stuck, _ = links(1, Client(fail="timed out"))
    stuck.unresponsive = lambda replica: False  # it could not be made to exit: the call fails
    with pytest.raises(HogwildError, match="replica 0 did not answer 'status'"):
        stuck.call(0, "status")


def test_a_fenced_replica_is_answered_none_until_it_is_back_and_its_new_client_is_asked() -> None:
    """Between its fence (its client closed) and its return (a new client), a replica whose
    restart is under way (no longer awaiting one) is answered None, not asked through its closed
    client (the keep-alive's call crashed the job there); a closed client refuses a request with
    a clear error."""
    from hogwild.config import default_config_path, load_config
    from hogwild.net.ports import free_port

    replicas, launcher = links(1, Client({"state": "idle"}))
    replicas.ps = load_config(default_config_path()).ps
    replicas.connect([f"127.0.0.1:{free_port()}"])  # nobody serves it: never reached below
    closed = replicas.clients[0]
    replicas.close(0)
    assert replicas.call(0, "status") is None and replicas.call(0, "train", epoch=1) is None
    with pytest.raises(Cancelled, match="refused: the client is closed"):
        closed.call("status")
    back = Client({"state": "idle"})
    replicas.reconnect(0, "127.0.0.1:1")
    replicas.clients[0].close()
    replicas.clients[0] = back
    assert replicas.call(0, "status") == {"state": "idle"} and back.asked == ["status"]
    assert replicas.stop_all() is True and back.closed
    replicas.clients = [None]
    assert replicas.stop_all() is True  # a fenced one is neither asked nor closed again
