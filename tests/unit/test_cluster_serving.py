"""The one serve loop of every replica role (:mod:`hogwild.cluster.serving`), without sockets.

The driver's requests go straight to :meth:`ReplicaServer.act`, as its control server's thread
would hand them over; the role is a recording stand-in.
"""

from __future__ import annotations

import queue

import pytest

from hogwild.cluster.serving import ReplicaServer
from hogwild.net.control import ControlRefused


class Recorder:
    """A served role that records what it is asked."""

    index, job, n_train, silence_s, max_lr = 3, "job", 100, 60.0, 0.1

    def __init__(self) -> None:
        self.commands: queue.Queue = queue.Queue()
        self.calls: list = []

    def describe(self) -> dict:
        return {"replica": self.index}

    def status(self) -> dict:
        return {"replica": self.index, "state": "idle"}

    def check_train(self, command) -> None:
        if command.stop > self.n_train:
            raise ControlRefused(f"portion {command.start}:{command.stop} outside")

    def queued(self) -> None:
        self.calls.append("queued")

    def close(self, epoch: int) -> None:
        self.calls.append(("close", epoch))

    def stop(self) -> None:
        self.calls.append("stop")

    def step(self) -> None:
        self.calls.append("step")


def train(epoch=0, start=0, stop=50, **more) -> dict:
    return {"epoch": epoch, "lr": 0.1, "start": start, "stop": stop, "seed": 7, **more}


def test_a_portion_is_queued_once_even_when_the_driver_resends_it() -> None:
    role = Recorder()
    server = ReplicaServer(role, "127.0.0.1")
    for _ in range(2):
        assert server.act("train", train()) == {"ok": True}
    server.act("train", train(start=50, stop=100))
    taken = [role.commands.get_nowait() for _ in range(role.commands.qsize())]
    assert [(c.epoch, c.lr, c.start, c.stop, c.seed) for c in taken] == [
        (0, 0.1, 0, 50, 7),
        (0, 0.1, 50, 100, 7),
    ]
    assert role.calls == ["queued", "queued"]


def test_bad_requests_are_refused_and_nothing_is_queued() -> None:
    role = Recorder()
    server = ReplicaServer(role, "127.0.0.1")
    with pytest.raises(ControlRefused, match="outside"):
        server.act("train", train(stop=101))
    with pytest.raises(ControlRefused):
        server.act("train", train(seed=-1))
    with pytest.raises(ControlRefused, match="unknown op 'fly'"):
        server.act("fly", {})
    assert role.commands.empty() and role.calls == []


def test_status_describe_close_and_stop_reach_the_role() -> None:
    role = Recorder()
    server = ReplicaServer(role, "127.0.0.1")
    assert server.act("status", {}) == {"replica": 3, "state": "idle"}
    assert server.act("describe", {}) == {"replica": 3}
    server.act("close", {"epoch": 2})
    assert not server.stopping
    server.act("stop", {})
    assert server.stopping and role.calls == [("close", 2), "stop"]
    server._loop()  # stopped: not one more step
    assert role.calls[-1] == "stop"


def test_a_silent_driver_is_taken_for_dead(capsys) -> None:
    role = Recorder()
    role.silence_s = 0.0
    server = ReplicaServer(role, "127.0.0.1")
    server.last_contact -= 1.0
    server._loop()
    assert "step" not in role.calls
    err = capsys.readouterr().err
    assert "hogwild replica 3: WARNING: no word from the driver for 0 s; leaving" in err
