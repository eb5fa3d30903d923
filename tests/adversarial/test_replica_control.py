"""A replica's control service refuses hostile values: every numeric field of ``train`` and
``close`` has a range, and its queue of portions is bounded.

The requests go over real sockets (a :class:`~hogwild.net.control.ControlServer` serving
:meth:`~hogwild.cluster.serving.ReplicaServer.act`, a :class:`~hogwild.net.control.ControlClient`
sending them); the role behind is a recorder of what it was given, so each refusal is seen to
leave nothing queued. An epoch of 2^63 once ended the replica's main thread; an ``lr`` of 1e308
was accepted and poisoned the model.
"""

from __future__ import annotations

import pytest

from hogwild.cluster.replica_role import ReplicaRole
from hogwild.cluster.serving import MAX_EPOCH, MAX_QUEUED_PORTIONS, ReplicaServer
from hogwild.config import config_from_dict
from hogwild.net.control import ControlClient, ControlRefused, ControlServer

JOB = "adversarial-replica"
N_TRAIN = 1000
PEAK_LR = 0.05


class RecordingRole(ReplicaRole):
    """Every replica role's handling of the driver's requests (its queue of portions, its peak
    rate, its check of a portion's range), recording what it is given instead of training."""

    job, n_train = JOB, N_TRAIN

    def __init__(self) -> None:
        model = {"input": [1, 28, 28], "layers": [{"type": "fc", "units": 10}, {"type": "softmax"}]}
        config = config_from_dict({"model": model, "optim": {"lr": PEAK_LR}})
        super().__init__(config, 0, silence_s=60.0)
        self.closed: list[int] = []

    def status(self) -> dict:
        return {"queued": self.commands.qsize()}

    def describe(self) -> dict:
        return {"replica": 0}

    def queued(self) -> None:
        pass

    def close(self, epoch: int) -> None:
        self.closed.append(epoch)

    def stop(self) -> None:
        pass


@pytest.fixture(scope="module")
def replica():
    role = RecordingRole()
    server = ReplicaServer(role, "127.0.0.1")
    with ControlServer("127.0.0.1:0", JOB, server.act) as control:
        with ControlClient(control.address, JOB, timeout_s=2.0, retries=1) as client:
            yield role, client


def train(client, **changes) -> dict:
    body = {"epoch": 1, "lr": PEAK_LR, "start": 0, "stop": 10, "seed": 3, **changes}
    return client.call("train", **body)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("epoch", 2**63),
        ("epoch", MAX_EPOCH + 1),
        ("epoch", -1),
        ("lr", 1e308),
        ("lr", PEAK_LR * 1.01),  # above what the job's schedule ever gives
        ("lr", -0.1),
        ("lr", "0.1"),
        ("start", 2**64),
        ("stop", N_TRAIN + 1),
        ("seed", 2**64),
        ("seed", 1.5),
    ],
)
def test_a_hostile_train_field_is_refused_and_nothing_is_queued(replica, name, value):
    role, client = replica
    with pytest.raises(ControlRefused, match=name if name not in ("start", "stop") else "portion"):
        train(client, **{name: value})
    assert role.commands.empty()
    assert client.call("status") == {"queued": 0}  # still answering


@pytest.mark.parametrize("epoch", [2**63, MAX_EPOCH + 1, -1])
def test_a_hostile_close_epoch_is_refused(replica, epoch):
    role, client = replica
    with pytest.raises(ControlRefused, match="epoch"):
        client.call("close", epoch=epoch)
    assert role.closed == []


def test_the_queue_of_portions_is_bounded(replica):
    role, client = replica
    try:
        for k in range(MAX_QUEUED_PORTIONS):
            assert train(client, start=k, stop=k + 1) == {"ok": True}
        with pytest.raises(ControlRefused, match="queued"):
            train(client, start=900, stop=901)
        assert role.commands.qsize() == MAX_QUEUED_PORTIONS
        role.commands.get_nowait()  # the role took one: room for the next
        assert train(client, epoch=MAX_EPOCH, start=900, stop=901) == {"ok": True}
    finally:
        while not role.commands.empty():
            role.commands.get_nowait()
