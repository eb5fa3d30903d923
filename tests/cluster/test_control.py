"""Control requests between the driver and the roles, over a real ZeroMQ socket on loopback:
answers, refusals naming the field, job ids, and JSON a role must not take (NaN, Infinity)."""

from __future__ import annotations

import math

import pytest

from hogwild.net.control import ControlClient, ControlRefused, ControlServer, field

pytestmark = pytest.mark.kernel_free


def act(op: str, body: dict) -> dict:
    if op == "status":
        return {"state": "idle"}
    if op == "train":
        return {"lr": field(body, "lr", (int, float), minimum=0)}
    raise ControlRefused(f"unknown op {op!r}")


@pytest.fixture
def server():
    control = ControlServer("127.0.0.1:0", "job-a", act)
    address = control.start()
    yield address
    control.stop()


def test_a_request_is_answered_and_a_refusal_names_the_field(server):
    with ControlClient(server, "job-a", timeout_s=2.0, retries=1) as client:
        assert client.call("status") == {"state": "idle"}
        assert client.call("train", lr=0.5) == {"lr": 0.5}
        with pytest.raises(ControlRefused, match="field 'lr': expected int/float >= 0"):
            client.call("train", lr=-1)
        with pytest.raises(ControlRefused, match="unknown op 'dance'"):
            client.call("dance")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_numbers_that_are_not_finite_are_refused(server, value):
    with ControlClient(server, "job-a", timeout_s=2.0, retries=1) as client:
        with pytest.raises(ControlRefused, match="not a number this protocol takes"):
            client.call("train", lr=value)


def test_a_status_for_any_job_says_nothing_and_another_job_is_refused(server):
    with ControlClient(server, None, timeout_s=2.0, retries=1) as anyone:
        assert anyone.call("status") == {}  # alive; what it holds only for its job
        with pytest.raises(ControlRefused, match="needs the job's id"):
            anyone.call("train", lr=0.1)
    with ControlClient(server, "job-b", timeout_s=2.0, retries=1) as other:
        with pytest.raises(ControlRefused, match="WRONG_JOB|not this role's job"):
            other.call("status")


def test_field_refuses_booleans_for_numbers_and_non_finite_floats():
    assert field({"n": 3}, "n", int, minimum=0) == 3
    for bad in (True, math.nan, "3", None, -1):
        with pytest.raises(ControlRefused, match="field 'n'"):
            field({"n": bad}, "n", (int, float), minimum=0)
