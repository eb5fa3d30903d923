"""The driver's control channel under ``cluster.auth = "always"``: a stranger on loopback gets
nothing, a key holder's fuzzed and hostile requests each get an error, and the channel still
tells the job's table exactly.

The channel is the driver's own (:func:`hogwild.cluster.status.status_act` served by a
:class:`~hogwild.net.control.ControlServer` with the keys
:func:`hogwild.cluster.curve_keys.job_keys` makes for the job); the clients are raw sockets
(:class:`tests.adversarial.hostile.RawClient`) with no keys, another job's keys, and the job's.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given

from hogwild.cluster.curve_keys import job_keys
from hogwild.cluster.status import format_table, status_act
from hogwild.config import load_config
from hogwild.net.address import parse_address
from hogwild.net.auth import make_keys
from hogwild.net.control import ControlServer
from hogwild.net.router import MAX_ROUTES
from hogwild.net.wire import DType, ErrorCode, Header, MsgType, job_id, pack_header, unpack_header
from tests.adversarial.hostile import RawClient, raw_headers
from tests.adversarial.test_fuzz_headers import FUZZ

JOB = "adversarial-driver"
ROWS = [{"role": "replica 0", "state": "training", "epoch": 1, "examples": 640}]


def control(text: bytes, job: int = job_id(JOB)) -> list[bytes]:
    header = Header(MsgType.CONTROL, job=job, dtype=DType.UINT8, shape=(len(text),), frames=1)
    return [pack_header(header), text]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    root = tmp_path_factory.mktemp("driver")
    config = load_config(overrides={"cluster.auth": "always"})
    keys = job_keys(config, root, lambda line: None).ps.keys
    strangers = str(make_keys(root / "strangers"))
    with ControlServer("127.0.0.1:0", JOB, status_act(JOB, lambda: ROWS), keys=keys) as server:
        endpoint = parse_address(server.address).endpoint
        with RawClient(endpoint, keys=keys) as raw:
            yield server, raw, endpoint, strangers


def status_is_exact(raw: RawClient) -> None:
    raw.send(control(b'{"op":"status"}'))
    head, text = raw.reply()
    assert unpack_header(head).type == MsgType.JSON
    assert json.loads(text) == {"job": JOB, "rows": ROWS, "table": format_table(ROWS)}


def test_a_client_without_the_keys_gets_nothing(driver):
    server, _, endpoint, strangers = driver
    received = server.router.received
    for keys in (None, strangers):
        with RawClient(endpoint, keys=keys) as stranger:
            if stranger.send(control(b'{"op":"status"}'), may_drop=True):  # refused: may drop
                stranger.send(control(b'{"op":"stop"}'), may_drop=True)
            assert not stranger.socket.poll(500)
    assert server.router.received == received


@pytest.mark.parametrize(
    ("text", "job"),
    [
        (b'{"op":"stop"}', job_id(JOB)),  # the driver takes status only
        (b'{"op":"train","epoch":1e308,"lr":1e308}', job_id(JOB)),
        (b'{"op":"status","n":NaN}', job_id(JOB)),
        (b'{"op":' + b"[" * 100_000 + b"]" * 100_000 + b"}", job_id(JOB)),  # deep nesting
        (b'{"op":"' + b"x" * (2**20) + b'"}', job_id(JOB)),  # past the 1 MiB limit
        (b"\xff\xfe not json", job_id(JOB)),
        (b'["status"]', job_id(JOB)),
        (b'{"op":"status"}', job_id("another job")),
    ],
    ids=["stop", "train", "nan", "nested", "huge", "bytes", "array", "other-job"],
)
def test_hostile_requests_are_refused_and_the_table_stays_exact(driver, text, job):
    _, raw, _, _ = driver
    raw.send(control(text, job))
    head, said = raw.reply()
    reply = unpack_header(head)
    assert reply.type == MsgType.ERROR and reply.code != ErrorCode.INTERNAL and said
    status_is_exact(raw)


@FUZZ
@given(message=raw_headers(job_id(JOB), types=(MsgType.CONTROL, MsgType.STATUS, MsgType.PING)))
def test_the_driver_answers_every_fuzzed_message(driver, message):
    server, raw, _, _ = driver
    raw.send(message)
    raw.reply()
    status_is_exact(raw)
    assert len(server.router.window) <= 4096 and len(server.router._routes) <= MAX_ROUTES
    assert not server.router.survived  # no failure escaped a message's handling
