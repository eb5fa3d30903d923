"""Every role answers every fuzzed message, and still serves honestly afterwards.

Each role runs once for its module (a parameter server, a data server, a replica's control
service) and gets hypothesis's messages (:func:`tests.adversarial.hostile.raw_headers`: any
value in every header field, mostly past the magic and version so the field checks are reached,
and random frames). For each message: one reply comes, its header decodes, the role still
answers ``STATUS``; at the end an honest client's update lands exactly (the parameters moved by
exactly what it pushed; a batch holds exactly the records asked for). The replicated copy's
peer messages (``PREPARE``, ``COMMIT``, ``SNAPSHOT``) are among those sent to the server, which
refuses them as a server of one copy.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.layout import FcLayer, ModelGeometry
from hogwild_plugins.ps.serving.launch import local_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hogwild.cluster.serving import MAX_EPOCH, MAX_SEED, ReplicaServer
from hogwild.data.idx import write_idx
from hogwild.data.resident import Delivery, load_source
from hogwild.data.server import DataServer
from hogwild.net.address import parse_address
from hogwild.net.control import ControlServer
from hogwild.net.wire import DType, ErrorCode, Header, MsgType, job_id, pack_header, unpack_header
from tests.adversarial.hostile import RawClient, raw_headers
from tests.adversarial.test_replica_control import JOB as REPLICA_JOB
from tests.adversarial.test_replica_control import RecordingRole

EXAMPLES = 100
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
GEOMETRY = ModelGeometry(3000, (FcLayer(2, 100, 20, 30),))


def _still_answers_status(client: RawClient, job: int) -> dict:
    client.send([pack_header(Header(MsgType.STATUS, job=job))])
    parts = client.reply()
    assert unpack_header(parts[0]).type == MsgType.JSON
    return json.loads(parts[1])


# ---------------------------------------------------------------------- parameter server


@pytest.fixture(scope="module")
def ps():
    with local_server(GEOMETRY, job="fuzz-ps", shard_kib=4) as server:
        with RawClient(server.address.endpoint) as raw:
            yield server, raw


@FUZZ
@given(message=raw_headers(job_id("fuzz-ps")))
def test_a_parameter_server_answers_every_fuzzed_message(ps, message):
    server, raw = ps
    raw.send(message)
    raw.reply()
    _still_answers_status(raw, server.job)


def test_after_the_fuzzing_an_honest_push_lands_exactly(ps):
    """Refusals are counted, and an honest client's push still lands exactly. The test sends its
    own refusals: under ``pytest -n 2`` the fuzzing above may have run on the other worker."""
    server, raw = ps
    refused_before = sum(server.status()["errors"].values())
    for wrong in (
        b"HGW",
        b"HGWX" + bytes(80),
        pack_header(Header(MsgType.PULL, job=server.job ^ 1)),
    ):
        raw.send([wrong])
        assert unpack_header(raw.reply()[0]).type == MsgType.ERROR
    with PSClient([str(server.address)], "fuzz-ps", client_id=4242, timeout_s=3.0) as c:
        before = np.empty(GEOMETRY.n_params, np.float32)
        c.pull(before)
        c.push_deltas(np.full(GEOMETRY.n_params, 0.5, np.float32))
        after = np.empty(GEOMETRY.n_params, np.float32)
        c.pull(after)
        np.testing.assert_array_equal(after, before + np.float32(0.5))
    status = server.status()
    assert server.router.alive and not status["failures"]
    assert sum(status["errors"].values()) == refused_before + 3  # each refusal counted once


# ---------------------------------------------------------------------- data server


@pytest.fixture(scope="module")
def data_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("idx")
    rng = np.random.default_rng(5)
    for prefix, n in (("train", 60), ("t10k", 20)):
        write_idx(root / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), np.uint8))
        write_idx(root / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n, dtype=np.uint8))
    server = DataServer(Delivery(load_source(str(root))), parse_address("127.0.0.1:0"))
    address = server.start()
    try:
        with RawClient(address.endpoint) as raw:
            yield server, raw
    finally:
        server.stop()


@FUZZ
@given(message=raw_headers(0, types=(MsgType.BATCH, MsgType.CONTROL, MsgType.PING)))
def test_a_data_server_answers_every_fuzzed_message(data_server, message):
    server, raw = data_server
    head = bytearray(message[0])
    if len(head) == 84:  # aim a third of them at the data's id (the header's job)
        if head[12] % 3 == 0:
            head[12:20] = server.data_id.to_bytes(8, "little")
    raw.send([bytes(head), *message[1:]])
    raw.reply()
    _still_answers_status(raw, server.data_id)


def test_a_bracket_bomb_is_refused_as_bad_json(data_server):
    server, raw = data_server
    text = b'{"op":' + b"[" * 2000 + b"]" * 2000 + b"}"  # json's decoder recurses per level
    raw.send([pack_header(Header(MsgType.CONTROL, job=server.data_id, dtype=DType.UINT8,
                                 shape=(len(text),), frames=1)), text])  # fmt: skip
    head, said = raw.reply()
    assert unpack_header(head).code == ErrorCode.BAD_VALUE and b"nested too deeply" in said


def test_after_the_fuzzing_a_batch_holds_exactly_what_was_asked(data_server):
    server, raw = data_server
    idx = np.array([3, 1, 59], np.int64)
    header = Header(MsgType.BATCH, job=server.data_id, target=0, dtype=DType.INT64,
                    shape=(3,), frames=1)  # fmt: skip
    raw.send([pack_header(header), idx.tobytes()])
    parts = raw.reply()
    reply = unpack_header(parts[0])
    assert reply.type == MsgType.DATA and reply.shape == (3, 1, 28, 28)
    images = np.empty((3, 28, 28, 1), np.uint8)
    labels = np.empty(3, np.int32)
    server.delivery.source.splits["train"].reader.read(idx, images, labels)
    assert bytes(parts[1]) == images.tobytes()
    np.testing.assert_array_equal(np.frombuffer(parts[2], np.int32), labels)


# ---------------------------------------------------------------------- replica control


@pytest.fixture(scope="module")
def replica_control():
    role = RecordingRole()
    with ControlServer("127.0.0.1:0", REPLICA_JOB, ReplicaServer(role, "127.0.0.1").act) as ctl:
        with RawClient(parse_address(ctl.address).endpoint) as raw:
            yield role, raw


@FUZZ
@given(message=raw_headers(job_id(REPLICA_JOB), types=(MsgType.CONTROL,)))
def test_a_replica_answers_every_fuzzed_message(replica_control, message):
    role, raw = replica_control
    raw.send(message)
    raw.reply()
    text = b'{"op":"status"}'
    raw.send([pack_header(Header(MsgType.CONTROL, job=job_id(REPLICA_JOB), dtype=DType.UINT8,
                                 shape=(len(text),), frames=1)), text])  # fmt: skip
    assert unpack_header(raw.reply()[0]).type == MsgType.JSON
    assert role.commands.empty()  # random bytes are never a train command


_NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**63, 2**64, 1e308, -0.0, 0.05]),
    st.text(max_size=3),
    st.none(),
    st.booleans(),
)


@FUZZ
@given(op=st.sampled_from(["train", "close"]), fields=st.dictionaries(
    st.sampled_from(["epoch", "lr", "start", "stop", "seed"]), _NUMBERS))  # fmt: skip
def test_a_replica_queues_only_commands_within_range(replica_control, op, fields):
    role, raw = replica_control
    text = json.dumps({"op": op, **fields}).encode()
    raw.send([pack_header(Header(MsgType.CONTROL, job=job_id(REPLICA_JOB), dtype=DType.UINT8,
                                 shape=(len(text),), frames=1)), text])  # fmt: skip
    raw.reply()
    while not role.commands.empty():
        command = role.commands.get_nowait()
        assert 0 <= command.epoch <= MAX_EPOCH and 0 <= command.seed <= MAX_SEED
        assert 0.0 <= command.lr <= role.max_lr and math.isfinite(command.lr)
        assert 0 <= command.start <= command.stop <= role.n_train
    assert all(0 <= epoch <= MAX_EPOCH for epoch in role.closed)
