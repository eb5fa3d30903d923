"""What every replica role keeps for the driver (:mod:`hogwild.cluster.replica_role`), without
processes: the driver's requests go through :meth:`ReplicaServer.act` as its control server's
thread hands them over; the role's arena counters are a plain array its "workers" move."""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.cluster.coordinator import PortionDone, Progress, status_events
from hogwild.cluster.replica_role import PortionRole, ReplicaRole, driver_silence_s
from hogwild.cluster.serving import DRIVER_SILENCE_S, ReplicaServer
from hogwild.config import load_config
from hogwild.net.control import ControlRefused
from hogwild.partition import process as partition_process
from hogwild.training import job as single_node
from hogwild.training.messages import Train


class Counters:
    """An arena's ``stats``: a row of counters per worker."""

    def __init__(self, workers: int) -> None:
        self.stats = np.zeros((workers, 8))

    def array(self, name: str) -> np.ndarray:
        assert name == "stats"
        return self.stats


class Role(PortionRole):
    """A portion role whose main thread the test plays."""

    job = "job"

    def __init__(self, config, n_train: int = 100) -> None:
        super().__init__(config, 3, silence_s=60.0)
        self.n_train = n_train
        self.arena = Counters(2)
        self.wakes = 0
        self.closed_now: list[int] = []  # the epochs `closing` saw under the lock
        self.began: list[tuple[int, bool]] = []

    def facts(self) -> dict:
        return {"workers": 2}

    def wake_main(self) -> None:
        self.wakes += 1

    def closing(self, epoch: int) -> None:
        assert self.lock.locked()
        self.closed_now.append(epoch)

    def beginning(self, command: Train, closed: bool) -> None:
        assert self.lock.locked()
        self.began.append((command.epoch, closed))

    def train(self, worker: int, examples: int, loss: float, correct: int = 0) -> None:
        row = self.arena.stats[worker]
        row[single_node.STAT_EXAMPLES] += examples
        row[single_node.STAT_LOSS] += loss
        row[single_node.STAT_CORRECT] += correct


@pytest.fixture(scope="module")
def config():
    return load_config(None)


def request(epoch=0, start=0, stop=50) -> dict:
    return {"epoch": epoch, "lr": 0.0, "start": start, "stop": stop, "seed": 7}


def test_the_partitions_count_in_the_single_node_engines_columns() -> None:
    # PortionRole.status reads the partitions' counters by the single-node engine's columns
    for name in ("STAT_EXAMPLES", "STAT_LOSS", "STAT_CORRECT"):
        assert getattr(partition_process, name) == getattr(single_node, name)


def test_a_portion_is_reported_under_way_then_finished_as_the_coordinator_reads_it(config):
    role = Role(config)
    server = ReplicaServer(role, "127.0.0.1")
    assert server.act("status", {}) == {"replica": 3, "state": "idle"}
    role.train(0, 5, 1.0)  # before the portion: not its
    server.act("train", request(start=0, stop=50))
    assert role.wakes == 1
    assert role.begin(role.commands.get_nowait()) is False
    role.train(0, 10, 2.0)
    role.train(1, 20, 3.0)
    status = server.act("status", {})
    assert status["state"] == "training" and status["finished"] == []
    assert status["portion"]["start"] == 0 and status["portion"]["examples"] == 30
    assert (status["examples"], status["loss"]) == (30, 5.0)
    assert status_events(3, status) == [Progress(3, 0, 0, 30)]
    role.finish(role.portion, examples=50, loss=6.0, correct=40, store_wait_s=0.5)
    status = server.act("status", {})
    assert status["state"] == "done" and "portion" not in status
    assert status["finished"] == [
        {"start": 0, "examples": 50, "loss": 6.0, "correct": 40, "data_wait_s": 0.0,
         "store_wait_s": 0.5}
    ]  # fmt: skip
    assert (status["examples"], status["correct"], status["store_wait_s"]) == (50, 40, 0.5)
    assert status_events(3, status) == [PortionDone(3, 0, 0, 50, 6.0, 40, 0.0, 0.5)]


def test_the_epochs_portions_add_up_and_a_new_epoch_starts_the_list_again(config):
    role = Role(config)
    for start, stop in ((0, 50), (50, 100)):
        role.begin(Train(0, 0.0, start, stop, 7))
        role.finish(role.portion, examples=stop - start, loss=1.0)
    role.begin(Train(0, 0.0, 0, 10, 7))  # queued after them: "training" while it runs
    assert [p["start"] for p in role.status()["finished"]] == [0, 50]
    with pytest.raises(TypeError, match="exampels"):
        role.finish(role.portion, exampels=10)
    role.portion.examples = 10  # counted as the workers answered (the single-node engine)
    role.finish(role.portion)
    status = role.status()
    assert [p["examples"] for p in status["finished"]] == [50, 50, 10]
    assert status["examples"] == 110 and status["loss"] == 2.0
    role.begin(Train(1, 0.0, 0, 10, 7))
    status = role.status()
    assert status["epoch"] == 1 and status["finished"] == [] and status["state"] == "training"


def test_a_close_reaches_the_portion_under_way_or_one_not_yet_begun(config):
    role = Role(config)
    server = ReplicaServer(role, "127.0.0.1")
    server.act("close", {"epoch": 0})
    assert role.closed_epoch == 0 and role.closed_now == [0]
    assert role.begin(Train(0, 0.0, 0, 10, 7)) is True  # closed before it began
    assert role.begin(Train(1, 0.0, 0, 10, 7)) is False
    assert role.began == [(0, True), (1, False)]
    server.act("close", {"epoch": 0})  # an older epoch's close moves nothing back
    assert role.closed_epoch == 0


def test_a_train_outside_the_examples_is_refused_naming_the_unit(config):
    role = Role(config, n_train=100)
    server = ReplicaServer(role, "127.0.0.1")
    with pytest.raises(ControlRefused, match="portion 90:101 outside the 100 examples"):
        server.act("train", request(start=90, stop=101))
    server.act("train", request(start=100, stop=100))  # an empty portion: nothing to train
    assert role.commands.qsize() == 1

    class Share(ReplicaRole):
        unit, least_examples, n_train = "share", 1, 100

    with pytest.raises(ControlRefused, match="share 100:100 outside the 100 examples"):
        Share(config, 0, 60.0).check_train(Train(0, 0.0, 100, 100, 7))


def test_describe_stop_and_the_roles_limits(config):
    role = Role(config)
    server = ReplicaServer(role, "127.0.0.1")
    facts = server.act("describe", {})
    assert facts["replica"] == 3 and facts["workers"] == 2 and facts["n_train"] == 100
    server.act("stop", {})
    assert role.stopping and server.stopping and role.wakes == 1
    assert driver_silence_s(config, 0) == DRIVER_SILENCE_S
    many = config.override({"cluster.start_timeout_s": 100.0})
    assert driver_silence_s(many, 3) == 300.0
    assert role.commands.maxsize > 0 and role.max_lr > 0
