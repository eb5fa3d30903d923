"""The board across processes: what a member's messages do to its coordinator's board.

:class:`BoardService` answers members' requests with the board's instructions; these tests call
it as the control server's network thread does (``answer(op, body)``), and through a
:class:`RemoteBoard` whose ``call`` is the service itself, so the protocol is checked without
sockets (tests/cluster/test_sandblaster_members.py runs it over the network, between processes).
"""

from __future__ import annotations

import numpy as np
import pytest
from hogwild_plugins.ps.sandblaster.batch import REJOIN, STOP, Board
from hogwild_plugins.ps.sandblaster.board_service import BoardService, RemoteBoard
from hogwild_plugins.ps.sandblaster.portions import WAIT, Compute, Fetch, PortionScheduler, Push

from hogwild.net.control import ControlRefused


def board(push_every: int = 2) -> Board:
    return Board(PortionScheduler(push_every=push_every, max_copies=2), timeout_s=5.0)


def remote(service: BoardService, seen: list) -> RemoteBoard:
    return RemoteBoard(
        lambda op, **body: service.answer(op, body), lambda o, p: seen.append((o, p))
    )


def test_a_member_is_told_each_instruction_and_learns_the_batch_examples():
    service, seen = BoardService(range(4, 6), silence_s=60.0), []
    b = board()
    service.install(b, np.arange(10, 20), 5)
    member = remote(service, seen)
    member.join(4)
    b.scheduler.begin(1, 2)
    b.scheduler.folded(b.scheduler.folds[0])  # its vector zeroed when it joined: it may push
    assert member.request(4, timeout_s=0) == Fetch(1)
    assert [o.tolist() for o, _ in seen] == [list(range(10, 20))] and seen[0][1] == 5
    member.fetched(4, 1)
    assert member.request(4, timeout_s=0) == Compute(1, 0)  # the reply to `fetched` carried it
    assert member.finished(4, 1, 0, 1.5) is True
    assert member.request(4, timeout_s=0) == Compute(1, 1)
    assert member.finished(4, 1, 1, float("inf")) is True  # named, not refused: JSON has no inf
    assert member.request(4, timeout_s=0) == Push(1, (0, 1))
    member.pushed(4, 1, (0, 1))
    assert [f.portions for f in b.scheduler.folds] == [(0, 1)]
    assert service.kept == {4: 2, 5: 0}
    b.scheduler.folded(b.scheduler.folds[0])
    assert b.scheduler.complete and b.scheduler.loss == float("inf")


def test_a_resent_request_is_answered_again_and_not_applied_twice():
    service = BoardService(range(2), silence_s=60.0)
    b = board()
    service.install(b, np.arange(8), 4)
    join = service.answer("join", {"member": 0, "incarnation": 7, "seq": 1})
    generation = join["generation"]
    b.scheduler.begin(1, 2)
    asks = {"member": 0, "incarnation": 7, "generation": generation}
    assert service.answer("request", {**asks, "seq": 2}) == {
        "do": "fetch",
        "batch": 1,
        "examples": 1,
    }
    service.answer("fetched", {**asks, "seq": 3, "batch": 1})
    first = service.answer("finished", {**asks, "seq": 4, "batch": 1, "portion": 0, "loss": 2.0})
    again = service.answer("finished", {**asks, "seq": 4, "batch": 1, "portion": 0, "loss": 2.0})
    assert first == again and first["keep"] is True
    assert b.scheduler.stats.portions == 1 and service.kept[0] == 1  # applied once
    with pytest.raises(ControlRefused, match="request 3 is older than 4"):
        service.answer("fetched", {**asks, "seq": 3, "batch": 1})


def test_a_new_board_makes_every_member_join_again_and_drop_what_it_accrued():
    service, seen = BoardService(range(2), silence_s=60.0), []
    first = board()
    service.install(first, np.arange(4), 2)
    member = remote(service, seen)
    member.join(1)
    first.scheduler.begin(1, 2)
    assert member.request(1, timeout_s=0) == Fetch(1)
    member.fetched(1, 1)
    member.request(1, timeout_s=0)  # Compute(1, 0)
    second = board()
    service.install(second, np.arange(4, 8), 2)
    # its report on the old board is stale: not kept, nothing on the new board
    assert member.finished(1, 1, 0, 1.0) is False
    assert member.request(1, timeout_s=0) is REJOIN
    member.join(1)
    assert sorted(second.scheduler.replicas) == [1] and not first.scheduler.stats.portions
    second.scheduler.begin(1, 2)
    assert member.request(1, timeout_s=0) == Fetch(1)
    assert seen[-1][0].tolist() == [4, 5, 6, 7]


def test_a_silent_member_leaves_the_board_and_its_portion_goes_to_another():
    service = BoardService(range(2), silence_s=0.0)  # any silence is too long
    b = board()
    service.install(b, np.arange(4), 2)
    generation = service.answer("join", {"member": 0, "incarnation": 7, "seq": 1})["generation"]
    b.scheduler.begin(1, 2)
    asks = {"member": 0, "incarnation": 7, "generation": generation}
    service.answer("request", {**asks, "seq": 2})
    service.answer("fetched", {**asks, "seq": 3, "batch": 1})  # then it goes silent
    assert service.answer(
        "join", {"member": 1, "incarnation": 7, "seq": 1}
    )  # another speaks: 0 is reaped
    assert sorted(b.scheduler.replicas) == [1] and service.reaped == 1
    assert any("silent for more than 0 s" in f for f in b.failures)
    # member 0 speaks again: told to join again, never handed the old board's work
    assert service.answer("request", {**asks, "seq": 4}) == {"do": "join"}


def test_a_member_that_joins_again_replaces_its_earlier_self():
    service = BoardService(range(2), silence_s=60.0)
    b = board()
    service.install(b, np.arange(4), 2)
    service.answer("join", {"member": 0, "incarnation": 7, "seq": 1})
    b.scheduler.begin(1, 2)
    generation = service.generation
    service.answer("request", {"member": 0, "incarnation": 7, "seq": 2, "generation": generation})
    fetched = service.answer(
        "fetched", {"member": 0, "incarnation": 7, "seq": 3, "generation": generation, "batch": 1}
    )
    assert fetched["next"] == {"do": "compute", "batch": 1, "portion": 0, "backup": False}
    # restarted: a new incarnation, numbered from 1 again; its earlier self leaves the board
    service.answer("join", {"member": 0, "incarnation": 8, "seq": 1})
    assert b.scheduler.stats.lost == 1 and any("restarted" in f for f in b.failures)
    with pytest.raises(ControlRefused, match="incarnation 7 was replaced by 8"):
        service.answer("request", {"member": 0, "incarnation": 7, "seq": 5, "generation": 1})


def test_a_closed_service_tells_every_member_to_stop():
    service, seen = BoardService(range(1), silence_s=60.0), []
    service.install(board(), np.arange(4), 2)
    member = remote(service, seen)
    member.join(0)
    service.close()
    assert member.request(0, timeout_s=0) is STOP


def test_before_the_first_board_a_member_waits():
    service, seen = BoardService(range(1), silence_s=60.0), []
    member = remote(service, seen)
    member.join(0)
    assert member.request(0, timeout_s=0) is WAIT


@pytest.mark.parametrize(
    ("op", "body", "says"),
    [
        ("request", {"member": 2, "incarnation": 7, "seq": 1, "generation": 1}, "field 'member'"),
        ("request", {"member": 0, "incarnation": 7, "seq": -1, "generation": 1}, "field 'seq'"),
        (
            "request",
            {"member": 0, "incarnation": 7, "seq": 1, "generation": "x"},
            "field 'generation'",
        ),
        (
            "finished",
            {
                "member": 0,
                "incarnation": 7,
                "seq": 1,
                "generation": 1,
                "batch": 1,
                "portion": 0,
                "loss": "many",
            },
            "field 'loss'",
        ),  # fmt: skip
        (
            "pushed",
            {
                "member": 0,
                "incarnation": 7,
                "seq": 1,
                "generation": 1,
                "batch": 1,
                "portions": [True],
            },
            "field 'portions'",
        ),  # fmt: skip
        ("examples", {"member": 0, "incarnation": 7, "seq": 1, "offset": 99}, "field 'offset'"),
        ("dance", {"member": 0, "incarnation": 7, "seq": 1}, "unknown op 'dance'"),
    ],
)
def test_what_a_member_sends_is_checked(op, body, says):
    service = BoardService(range(2), silence_s=60.0)
    service.install(board(), np.arange(4), 2)
    service.answer("join", {"member": 0, "incarnation": 7, "seq": 0})
    with pytest.raises(ControlRefused, match=says):
        service.answer(op, body)


def test_a_report_that_breaks_the_protocol_is_refused_not_raised():
    service = BoardService(range(1), silence_s=60.0)
    b = board()
    service.install(b, np.arange(4), 2)
    generation = service.answer("join", {"member": 0, "incarnation": 7, "seq": 1})["generation"]
    b.scheduler.begin(1, 2)
    with pytest.raises(ControlRefused, match="member 0: replica 0 reported portion 1"):
        service.answer(
            "finished",
            {
                "member": 0,
                "incarnation": 7,
                "seq": 2,
                "generation": generation,
                "batch": 1,
                "portion": 1,
                "loss": 0,
            },
        )


def test_a_synchronous_group_is_a_coordinator_role_and_a_member_role_per_replica():
    from hogwild.cluster.roles import member_count, plan_roles, replica_cpus
    from hogwild.config import load_config

    overrides = {"cluster.framework": "hybrid", "cluster.replicas": 2,
                 "cluster.workers_per_replica": 3, "train.batch": 64}  # fmt: skip
    config = load_config(None, overrides)
    plan = plan_roles(config, "job.json", "mnist", "10.0.0.1")
    assert [(s.name, s.cpus) for s in plan.replicas] == [("replica 0", 1), ("replica 1", 1)]
    assert member_count(config) == 6 and replica_cpus(config) == 1
    assert [s.name for s in plan.members] == [f"member {m}" for m in range(6)]
    assert all(s.cpus == 1 and s.group == "" for s in plan.members)  # any node
    assert plan.members[4].argv[-5:] == ("member", "--index", "4", "--bind", "10.0.0.1")
    assert plan.roles[-6:] == plan.members
    downpour = load_config(None, {"cluster.replicas": 2, "cluster.workers_per_replica": 3})
    assert plan_roles(downpour, "job.json", "mnist", "127.0.0.1").members == []
    assert replica_cpus(downpour) == 3 and member_count(downpour) == 0


def test_the_ray_launcher_counts_a_cpu_per_member():
    pytest.importorskip("ray")
    from hogwild_plugins.ray.joining import needed_cpus

    from hogwild.cluster.roles import member_count
    from hogwild.config import load_config

    overrides = {
        "cluster.framework": "sandblaster",
        "cluster.replicas": 1,
        "cluster.workers_per_replica": 2,
        "cluster.ps": 2,
    }  # as the topology resolves
    config = load_config(None, overrides)
    cluster = config.cluster
    # two servers, the coordinator, its two members
    assert needed_cpus(cluster, per_replica=1, members=member_count(config)) == 5


def test_a_member_leaving_with_an_error_says_so_and_one_told_to_stop_says_nothing():
    service, seen = BoardService(range(2), silence_s=60.0), []
    b = board()
    service.install(b, np.arange(4), 2)
    failing, stopped = remote(service, seen), remote(service, seen)
    failing.join(0)
    stopped.join(1)
    failing.leave(0, "PeerUnreachableError: a server did not answer")
    assert sorted(b.scheduler.replicas) == [1] and sorted(service.joined) == [1]
    assert b.failures == ["replica 0: PeerUnreachableError: a server did not answer"]
    asked = stopped.seq
    stopped.leave(1)
    assert stopped.seq == asked and sorted(service.joined) == [1]  # nothing sent
