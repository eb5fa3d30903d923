"""A key pair per role: a server admits exactly the roster's roles and knows who sent each
message, so a role cannot speak as another; clients refuse the network without keys."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zmq
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.net.address import InsecureBindError
from hogwild.net.auth import (
    KeysError,
    make_identity,
    read_roster,
    secure_client,
    use_identity,
    write_roster,
)
from hogwild.net.channel import Peers, PeerUnreachableError
from hogwild.net.wire import DType, ErrorCode, Header, MsgType, job_id, pack_header, unpack_header

pytestmark = pytest.mark.ps_kernels

GEOMETRY = ModelGeometry(2048)


@pytest.fixture
def roster(tmp_path):
    """A job's key directory with a roster of a server, a replica and a second server (each
    key pair in a private directory of its own, as on its own node); the process's identity
    is put back afterwards."""
    keys = tmp_path / "keys"
    made = {
        name: make_identity(tmp_path / f"node-{name.replace(' ', '-')}", name)
        for name in ("ps 0", "ps 1", "replica 0")
    }
    write_roster(keys, {name: {"key": public, "address": ""} for name, (_, public) in made.items()})
    yield keys, {name: path for name, (path, _) in made.items()}
    use_identity(None)


def _serve(keys, identities):
    use_identity(identities["ps 0"])  # the server's own key pair, read as it starts
    return local_server(GEOMETRY, shard_kib=4, keys=str(keys))


def _located(keys, role: str, address: str) -> None:
    roles = read_roster(keys)
    roles[role]["address"] = address
    write_roster(keys, roles)


def _send(address: str, keys, header: Header, frames=()) -> Header:
    with Peers([address], sender=4242, keys=str(keys), timeout_s=2.0, retries=1) as peers:
        reply, _ = peers.request(0, header, frames)
    return reply


def test_a_replica_cannot_send_a_copys_messages(roster):
    keys, identities = roster
    with _serve(keys, identities) as server:
        address = str(server.address)
        _located(keys, "ps 0", address)
        job = job_id("test")
        payload = np.zeros(4, np.float32)
        forged = Header(MsgType.PREPARE, job=job, dtype=DType.FLOAT32, shape=(4,), frames=1)
        use_identity(identities["replica 0"])  # the replica's own, admitted key
        with PSClient([address], "test", client_id=1, keys=str(keys)) as client:
            client.push_deltas(np.ones(2048, np.float32))  # what a replica may send: taken
        for kind in (MsgType.PREPARE, MsgType.COMMIT, MsgType.SNAPSHOT):
            reply = _send(address, keys, forged._replace(type=kind), [payload])
            assert reply.type == MsgType.ERROR and reply.code == ErrorCode.UNEXPECTED
        use_identity(identities["ps 1"])  # a server's key: past the sender check (one copy:
        reply = _send(address, keys, forged, [payload])  # the server takes no replication)
        assert reply.type == MsgType.ERROR
        status = server.status()
        assert status["forged"] == {"replica 0": 3}
        assert status["applied_requests"] == 2  # the push, one request per 4 KiB shard


def test_the_sender_is_its_key_not_what_its_header_says(roster):
    keys, identities = roster
    with _serve(keys, identities) as server:
        address = str(server.address)
        _located(keys, "ps 0", address)
        use_identity(identities["replica 0"])
        context = zmq.Context()
        sock = context.socket(zmq.DEALER)
        try:  # a raw socket with the replica's key, claiming a server's sender id
            sock.setsockopt(zmq.LINGER, 0)
            secure_client(sock, keys, server.address.endpoint)
            sock.connect(server.address.endpoint)
            header = Header(MsgType.COMMIT, job=job_id("test"), sender=0, seq=1)
            sock.send(pack_header(header))
            assert sock.poll(5000), "no answer from the server"
            reply = unpack_header(sock.recv_multipart()[0])
            assert reply.type == MsgType.ERROR and reply.code == ErrorCode.UNEXPECTED
        finally:
            sock.close(linger=0)
            context.term()
        assert server.status()["forged"] == {"replica 0": 1}


def test_the_roster_is_the_allow_list_and_grows_as_roles_join(roster, tmp_path):
    keys, identities = roster
    with _serve(keys, identities) as server:
        address = str(server.address)
        _located(keys, "ps 0", address)
        stranger, public = make_identity(tmp_path / "elsewhere", "replica 7")
        use_identity(stranger)  # a well-formed key the job does not know: never answered
        with pytest.raises(PeerUnreachableError, match=address):
            PSClient([address], "test", client_id=2, keys=str(keys), timeout_s=0.3, retries=1)
        roles = read_roster(keys)
        roles["replica 7"] = {"key": public, "address": ""}
        write_roster(keys, roles)  # the driver adds a role: admitted without a restart
        with PSClient([address], "test", client_id=3, keys=str(keys), timeout_s=2.0) as client:
            out = np.zeros(2048, np.float32)
            client.pull(out)


def test_a_client_needs_the_servers_key_and_its_own(roster):
    keys, identities = roster
    use_identity(identities["replica 0"])
    with pytest.raises(KeysError, match="no role of the job serves at tcp://127.0.0.1:9"):
        Peers(["127.0.0.1:9"], sender=1, keys=str(keys))
    _located(keys, "ps 0", "127.0.0.1:9")
    use_identity(None)
    with pytest.raises(KeysError, match="no key pair of its own"):
        Peers(["127.0.0.1:9"], sender=1, keys=str(keys))


def test_clients_refuse_the_network_without_keys():
    with pytest.raises(InsecureBindError, match="refusing to connect to 10.9.8.7:5570"):
        Peers(["10.9.8.7:5570"], sender=1)


def test_a_roster_from_elsewhere_is_checked(tmp_path):
    (tmp_path / "roster.json").write_text(json.dumps({"roles": {"ps 0": {"key": "short"}}}))
    with pytest.raises(KeysError, match="40-character Z85 public key"):
        read_roster(tmp_path)
    (tmp_path / "roster.json").write_text(json.dumps({"roles": {"../x": {"key": "a" * 40}}}))
    with pytest.raises(KeysError, match="expected a role name"):
        read_roster(tmp_path)
    path, public = make_identity(tmp_path / "private", "ps 0")
    assert path.stat().st_mode & 0o077 == 0 and path.parent.stat().st_mode & 0o077 == 0
    assert make_identity(tmp_path / "private", "ps 0") == (path, public)  # kept on a restart
    assert "secret" not in (write_roster(tmp_path, {"ps 0": {"key": public, "address": ""}})
                            .read_text())  # fmt: skip
