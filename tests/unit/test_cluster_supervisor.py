"""The restart policy of a cluster job (:mod:`hogwild.cluster.supervisor`), without processes.

Every test drives :class:`RestartPolicy` through stimuli alone and calls ``validate_state()``
after every step, as the processes of ``tests/cluster/test_cluster.py`` would drive it.
"""

from __future__ import annotations

import itertools

import pytest

from hogwild.cluster.launcher import RoleExit
from hogwild.cluster.supervisor import (
    EXITED,
    HELD,
    HOLD_NOT_SILENT,
    HOLD_TIMED_OUT,
    RESTARTING,
    RUNNING,
    Fence,
    ForgetServer,
    Recover,
    Restart,
    Restarted,
    RestartFailed,
    RestartPolicy,
    RoleExited,
    StopJob,
    Supervised,
    Supervisor,
)
from hogwild.data.remote import all_silent
from hogwild.errors import RoleFailedError

ids = (f"s{i}" for i in itertools.count())


def step(policy: RestartPolicy, stimulus) -> list:
    actions = policy.handle(stimulus)
    policy.validate_state()
    return actions


def job(limit: int = 2, kept: str = "ck", roles=(("replica", 0), ("replica", 1), ("data", 0))):
    policy = RestartPolicy(limit, kept)
    for kind, index in roles:
        assert step(policy, Supervised(f"{kind} {index}", kind, index, next(ids))) == []
    return policy


def died(name: str, code: int = -9, host: str = "h") -> RoleExited:
    return RoleExited(RoleExit(name, host, code), next(ids))


def test_a_dead_replica_is_restarted_until_its_restarts_are_spent() -> None:
    policy = job(limit=2)
    for count in (1, 2):
        assert step(policy, died("replica 1")) == []
        assert policy.awaiting_restart("replica 1")
        [restart] = step(policy, Recover(next(ids)))
        assert (restart.name, restart.kind, restart.index) == ("replica 1", "replica", 1)
        assert restart.count == count
        assert "replica 1" in policy.gone and not policy.awaiting_restart("replica 1")
        step(policy, Restarted("replica 1", next(ids)))
        assert "replica 1" not in policy.gone
    step(policy, died("replica 1"))
    [stop] = step(policy, Recover(next(ids)))
    assert isinstance(stop, StopJob)
    assert stop.reason == (
        "replica 1 on h was killed by SIGKILL (restarted 2 times already: cluster.restarts); "
        "the job is stopped and the last checkpoint in ck is kept"
    )
    assert policy.restarts == {"replica 1": 2}


def test_one_round_restarts_servers_then_data_servers_then_replicas() -> None:
    policy = job(roles=(("replica", 0), ("data", 0), ("ps", 1)))
    for name in ("replica 0", "data 0"):
        assert step(policy, died(name)) == []
    assert step(policy, died("ps 1")) == [ForgetServer(1)]  # its buckets fail over at once
    actions = step(policy, Recover(next(ids)))
    assert [a.name for a in actions] == ["ps 1", "data 0", "replica 0"]
    assert all(isinstance(a, Restart) and a.count == 1 for a in actions)


def test_a_replica_waits_for_a_silent_data_server_while_it_is_gone_then_restarts_once() -> None:
    # the replica's read failed first; the launcher knows of the data server's loss later
    policy = RestartPolicy(3, data_wait_s=60.0)
    for kind, index in (("ps", 0), ("data", 0), ("replica", 0), ("member", 0)):
        step(policy, Supervised(f"{kind} {index}", kind, index, next(ids)))
    step(policy, died("replica 0", code=2))
    step(policy, died("member 0", code=2))
    assert policy.readers_waiting()
    # held; the replica fenced at once (it may still run, cut off), the member not (no fence)
    assert step(policy, Recover(next(ids), data_silent=True, now=100.0)) == [Fence("replica 0", 0)]
    assert policy.awaiting_restart("replica 0") and policy.held == {"replica 0", "member 0"}
    assert step(policy, Recover(next(ids), data_silent=True, now=159.0)) == []
    step(policy, died("data 0"))  # its loss known: held past data_wait_s, until it is back
    step(policy, died("ps 0"))
    actions = step(policy, Recover(next(ids), data_silent=True, now=170.0))
    assert [a.name for a in actions] == ["ps 0", "data 0"]  # the readers after its restart
    step(policy, Restarted("ps 0", next(ids)))
    step(policy, RestartFailed("data 0", "h", "no node at its address yet", next(ids)))
    [again] = step(policy, Recover(next(ids), data_silent=True, now=200.0))
    assert again.name == "data 0" and again.count == 2
    step(policy, Restarted("data 0", next(ids)))
    actions = step(policy, Recover(next(ids), data_silent=False, now=201.0))  # it answers
    assert [(a.name, a.count) for a in actions] == [("replica 0", 1), ("member 0", 1)]
    assert [a.fenced for a in actions] == [True, False]  # the replica only started now
    assert policy.held == set() and not policy.readers_waiting()
    assert {len(entry) for entry in policy.story()} == {5}  # one shape (review I5)
    holds = [entry[4] for entry in policy.story("replica 0") if entry[4] is not None]
    assert holds == [HELD, HOLD_NOT_SILENT]  # when it began, and why it ended


def test_a_replica_waits_for_silent_data_servers_nobody_knows_gone_for_data_wait_s() -> None:
    policy = RestartPolicy(5, data_wait_s=60.0)
    for kind, index in (("data", 0), ("replica", 0)):
        step(policy, Supervised(f"{kind} {index}", kind, index, next(ids)))
    step(policy, died("replica 0", code=2))
    assert step(policy, Recover(next(ids), data_silent=True, now=10.0)) == [Fence("replica 0", 0)]
    assert step(policy, Recover(next(ids), data_silent=True, now=69.0)) == []
    [restart] = step(policy, Recover(next(ids), data_silent=True, now=70.0))  # waited enough
    assert restart.name == "replica 0" and restart.fenced and policy.held == set()
    assert policy.story("replica 0")[-2][4] == HOLD_TIMED_OUT
    step(policy, RestartFailed("replica 0", "h", "no data server answered", next(ids)))
    [again] = step(policy, Recover(next(ids), data_silent=True, now=71.0))  # not a second wait
    assert again.count == 2 and not again.fenced  # fenced again at this restart, as any
    step(policy, Restarted("replica 0", next(ids)))
    step(policy, died("replica 0", code=2))  # answered in between: a new outage waits again
    step(policy, Recover(next(ids), data_silent=False, now=80.0))
    step(policy, Restarted("replica 0", next(ids)))
    step(policy, died("replica 0", code=2))
    assert step(policy, Recover(next(ids), data_silent=True, now=90.0)) == [Fence("replica 0", 0)]
    assert RestartPolicy(3).handle(Recover(next(ids), data_silent=True, now=1.0)) == []


def test_a_lost_parameter_servers_lease_end_is_marked_and_an_exited_ones_is_not() -> None:
    """A server seen to exit answers nothing: its lease just ends. One lost with no exit seen
    (its node or actor gone: ``returncode`` None) may still run and answer reads by its own
    lease clock: the end is marked, and its buckets' takeovers wait a lease for reads."""
    policy = job(roles=(("ps", 0), ("ps", 1)))
    assert step(policy, died("ps 0", code=-9)) == [ForgetServer(0, lost=False)]
    assert step(policy, died("ps 1", code=None)) == [ForgetServer(1, lost=True)]


def test_a_parameter_server_nobody_supervises_stops_the_job_naming_every_exit() -> None:
    policy = job(limit=3, kept="")
    step(policy, died("replica 0", code=1))
    assert step(policy, died("ps 0", host="n2")) == []  # not supervised: one copy
    [stop] = step(policy, Recover(next(ids)))
    assert stop == StopJob(
        "replica 0 on h exited with status 1; ps 0 on n2 was killed by SIGKILL "
        "(a parameter server is not restarted); the job is stopped"
    )


def test_without_restarts_an_exit_is_told_as_it_is() -> None:
    policy = job(limit=0)
    step(policy, died("data 0"))
    assert not policy.awaiting_restart("data 0")
    [stop] = step(policy, Recover(next(ids)))
    assert stop.reason.startswith("data 0 on h was killed by SIGKILL; the job is stopped")


def test_a_restart_that_does_not_start_counts_and_is_tried_again() -> None:
    policy = job(limit=2)
    step(policy, died("replica 0"))
    step(policy, Recover(next(ids)))
    step(policy, RestartFailed("replica 0", "h", "replica 0 did not start: no CPUs", next(ids)))
    assert policy.awaiting_restart("replica 0")
    [again] = step(policy, Recover(next(ids)))
    assert again.count == 2 and again.exit.describe() == "replica 0 did not start: no CPUs"
    step(policy, RestartFailed("replica 0", "h", "still no CPUs", next(ids)))
    [stop] = step(policy, Recover(next(ids)))
    assert stop.reason.startswith("still no CPUs (restarted 2 times already")


def test_the_first_report_of_an_exit_is_kept_and_the_story_tells_each_transition() -> None:
    policy = job()
    step(policy, RoleExited(RoleExit("replica 0", "h", 3), "exit-a"))
    step(policy, RoleExited(RoleExit("replica 0", "h", 9), "exit-b"))
    assert policy.exits["replica 0"].returncode == 3
    step(policy, Recover("recover-c"))
    step(policy, Restarted("replica 0", "back-d"))
    story = policy.story("replica 0")
    assert [(s, before, after) for s, _, before, after, _ in story] == [
        (story[0][0], None, "running"),
        ("exit-a", "running", "exited"),
        ("exit-b", "exited", "exited"),
        ("recover-c", "exited", "restarting"),
        ("back-d", "restarting", "running"),
    ]


def test_a_stimulus_out_of_turn_is_refused() -> None:
    policy = job()
    with pytest.raises(ValueError, match="replica 0 is running, not restarting"):
        policy.handle(Restarted("replica 0", next(ids)))
    with pytest.raises(TypeError):
        policy.handle("Recover")
    policy.validate_state()


class FakeLauncher:
    def __init__(self) -> None:
        self.exits: list[RoleExit] = []

    def poll(self) -> list[RoleExit]:
        out, self.exits = self.exits, []
        return out


def test_the_supervisor_carries_the_actions_out() -> None:
    launcher, done = FakeLauncher(), []
    failing = {"data 0"}

    def start_again(restart: Restart) -> str:
        done.append(("start", restart.name))
        if restart.name in failing:
            failing.discard(restart.name)
            raise RoleFailedError("data 0 did not come back")
        return f"127.0.0.1:{restart.index + 7000}"

    supervisor = Supervisor(
        RestartPolicy(2), launcher, lambda i, lost: done.append(("forget", i, lost)), start_again,
        lambda restart, address: done.append(("back", restart.name, address)),
    )  # fmt: skip
    for kind, index in (("ps", 0), ("data", 0), ("replica", 0)):
        supervisor.supervise(f"{kind} {index}", kind, index)
    launcher.exits = [RoleExit("replica 0", "h", -9), RoleExit("ps 0", "h", -9)]
    supervisor.check()  # every exit may come back: nothing happens but the lease
    assert done == [("forget", 0, False)]
    launcher.exits = [RoleExit("data 0", "h", 1)]
    supervisor.recover()
    assert done[1:] == [  # the servers one tier: each started, then those started back
        ("start", "ps 0"),
        ("start", "data 0"),
        ("back", "ps 0", "127.0.0.1:7000"),
        ("start", "replica 0"),
        ("back", "replica 0", "127.0.0.1:7000"),
    ]
    assert supervisor.policy.awaiting_restart("data 0")  # its restart failed: again next time
    supervisor.policy.validate_state()
    supervisor.recover()
    assert done[-1] == ("back", "data 0", "127.0.0.1:7000")
    launcher.exits = [RoleExit("ps 1", "h", 2)]  # one copy: not supervised
    with pytest.raises(RoleFailedError, match="ps 1 on h exited with status 2 .a parameter server"):
        supervisor.check()


def test_the_supervisor_asks_the_data_servers_only_while_a_replica_awaits_its_restart(capfd):
    launcher, started, asked, fenced = FakeLauncher(), [], [], []
    answers = [False, False, True]  # silent at the first two asks, then back

    def data_silent() -> bool:
        asked.append(True)
        return not answers.pop(0)

    supervisor = Supervisor(
        RestartPolicy(3, data_wait_s=60.0), launcher, lambda i: None,
        lambda restart: started.append(restart.name) or "127.0.0.1:7000", lambda r, a: None,
        data_silent, fenced.append,
    )  # fmt: skip
    for kind, index in (("data", 0), ("replica", 0)):
        supervisor.supervise(f"{kind} {index}", kind, index)
    supervisor.recover()
    assert asked == [] and started == []  # nobody waits: nobody asked
    launcher.exits = [RoleExit("replica 0", "h", 2)]
    supervisor.recover()
    assert fenced == [Fence("replica 0", 0)]  # fenced at once, at the first hold
    supervisor.recover()
    assert started == [] and len(asked) == 2 and len(fenced) == 1
    said = capfd.readouterr().err
    assert said.count("replica 0: no data server answers; its restart waits") == 1  # once a wait
    supervisor.recover()
    assert started == ["replica 0"] and len(asked) == 3
    supervisor.policy.validate_state()


def test_a_data_server_probe_failing_otherwise_than_by_silence_is_not_silence(tmp_path):
    """``all_silent`` (the driver's probe while a replica awaits its restart): a failure that
    is no data error (an address that does not parse, keys that cannot be read) says the data
    servers are not silent, rather than escaping and stopping the driver (review F, F4)."""
    assert not all_silent(["no such:address"])
    assert not all_silent(["127.0.0.1:1"], keys=str(tmp_path / "no-keys"))


def test_a_host_lost_comes_back_tier_by_tier_each_tier_side_by_side() -> None:
    """A host's roles lost together: one round starts each tier's roles together (parameter
    and data servers one tier, then replicas, then members; in index order, whatever order
    their exits came in), the next tier once the last is back; a role of
    a tier that did not start is reported alone and restarted again at the next round."""
    launcher, done, failing = FakeLauncher(), [], {"replica 1"}

    def start_together(restarts: list[Restart]) -> list:
        done.append(("start", [r.name for r in restarts]))
        results = [
            RoleFailedError(f"{r.name} did not start") if r.name in failing else f"h:{r.index}"
            for r in restarts
        ]
        failing.difference_update(r.name for r in restarts)  # only the first time
        return results

    def start_again(restart: Restart) -> str:
        raise AssertionError(f"{restart.name} started alone")

    supervisor = Supervisor(
        RestartPolicy(2), launcher, lambda i, lost: done.append(("forget", i, lost)), start_again,
        lambda restart, address: done.append(("back", restart.name, address)),
        start_together=start_together,
    )  # fmt: skip
    roles = [("ps", 0), ("ps", 1), ("data", 0), ("replica", 0), ("replica", 1), ("replica", 2)]
    for kind, index in [*roles, ("member", 0)]:
        supervisor.supervise(f"{kind} {index}", kind, index)
    lost = ["replica 2", "ps 1", "replica 0", "data 0", "ps 0", "member 0", "replica 1"]
    launcher.exits = [RoleExit(name, "h", None) for name in lost]
    supervisor.recover()
    supervisor.policy.validate_state()
    assert done == [
        ("forget", 1, True),
        ("forget", 0, True),
        ("start", ["ps 0", "ps 1", "data 0"]),
        ("back", "ps 0", "h:0"),
        ("back", "ps 1", "h:1"),
        ("back", "data 0", "h:0"),
        ("start", ["replica 0", "replica 1", "replica 2"]),
        ("back", "replica 0", "h:0"),
        ("back", "replica 2", "h:2"),
        ("start", ["member 0"]),
        ("back", "member 0", "h:0"),
    ]
    told = [(entry[1], entry[3]) for entry in supervisor.policy.story() if entry[2] == RESTARTING]
    assert told == [  # into the policy in the tiers' order
        ("ps 0", RUNNING), ("ps 1", RUNNING), ("data 0", RUNNING), ("replica 0", RUNNING),
        ("replica 1", EXITED), ("replica 2", RUNNING), ("member 0", RUNNING),
    ]  # fmt: skip
    assert supervisor.policy.awaiting_restart("replica 1")
    assert "replica 1 did not start" in supervisor.policy.exits["replica 1"].why
    del done[:]
    supervisor.recover()
    supervisor.policy.validate_state()
    assert done == [("start", ["replica 1"]), ("back", "replica 1", "h:1")]
    assert supervisor.policy.restarts["replica 1"] == 2


def test_a_tier_answered_with_too_few_results_is_an_error_not_a_silent_restart() -> None:
    launcher = FakeLauncher()
    supervisor = Supervisor(
        RestartPolicy(2), launcher, lambda i, lost: None, lambda r: "h:0", lambda r, a: None,
        start_together=lambda restarts: ["h:0"],
    )  # fmt: skip
    for index in (0, 1):
        supervisor.supervise(f"replica {index}", "replica", index)
    launcher.exits = [RoleExit("replica 0", "h", -9), RoleExit("replica 1", "h", -9)]
    with pytest.raises(ValueError, match="1 results for 2 restarts"):
        supervisor.recover()
