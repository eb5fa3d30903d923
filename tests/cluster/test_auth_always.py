"""``cluster.auth``: when a job's roles use CURVE on loopback, and that a keyless client of a role
so protected gets nothing.

Who else is logged in is read from a utmp file written here in glibc's format (live and stale
sessions, this user, root); the job's keys are made by the driver's own :func:`job_keys` from a
real config; the control channel the driver and every replica serve is started on loopback with
those keys and asked by a client with them, without them, and with another job's keys.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys

import pytest

from hogwild.cluster.curve_keys import job_keys
from hogwild.config import load_config
from hogwild.errors import ConfigError
from hogwild.net.auth import make_keys
from hogwild.net.channel import PeerUnreachableError
from hogwild.net.control import ControlClient, ControlServer
from hogwild.net.exposure import (
    USER_PROCESS,
    UTMP,
    curve_reason,
    other_logins,
    read_utmp,
)

pytestmark = pytest.mark.ps_kernels

DEAD_PROCESS = 8
ME = pwd.getpwuid(os.getuid()).pw_name


def utmp_record(kind: int, user: str, pid: int) -> bytes:
    return UTMP.pack(kind, pid, b"pts/1", b"ts/1", user.encode(), b"host", 0, 0, 0, 0, 0,
                     0, 0, 0, 0, b"")  # fmt: skip


@pytest.fixture
def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_other_logins_are_live_sessions_of_other_users(tmp_path, dead_pid):
    utmp = tmp_path / "utmp"
    live = os.getpid()
    utmp.write_bytes(
        utmp_record(USER_PROCESS, ME, live)
        + utmp_record(USER_PROCESS, "root", live)
        + utmp_record(USER_PROCESS, "alice", live)
        + utmp_record(USER_PROCESS, "bob", dead_pid)  # a stale record
        + utmp_record(DEAD_PROCESS, "carol", live)  # a session that ended
        + utmp_record(USER_PROCESS, "alice", live)
        + b"\0" * 17  # a torn last record: ignored
    )
    assert len(read_utmp(utmp)) == 5
    assert other_logins([tmp_path / "missing", utmp]) == ["alice"]
    assert other_logins([tmp_path / "missing"]) == []


def test_curve_reason_follows_cluster_auth():
    assert curve_reason("auto", False, []) == "the roles listen beyond loopback"
    assert curve_reason("beyond-loopback", False, ["alice"]) is not None
    assert curve_reason("always", True, []) == 'cluster.auth = "always"'
    assert "alice" in curve_reason("auto", True, ["alice"])
    assert curve_reason("auto", True, []) is None
    assert curve_reason("beyond-loopback", True, ["alice"]) is None
    with pytest.raises(ValueError, match="cluster.auth = 'sometimes'"):
        curve_reason("sometimes", True, [])
    with pytest.raises(ConfigError, match="auth"):
        load_config(overrides={"cluster.auth": "sometimes"})


def test_always_makes_keys_on_loopback_and_a_keyless_client_gets_nothing(tmp_path):
    said = []
    open_config = load_config(overrides={"cluster.auth": "beyond-loopback"})
    assert job_keys(open_config, tmp_path / "open", said.append).ps.keys == ""
    config = load_config(overrides={"cluster.auth": "always"})
    assert config.cluster.host == "127.0.0.1"
    keys = job_keys(config, tmp_path, said.append).ps.keys
    assert keys == str(tmp_path / "job-keys") and (tmp_path / "job-keys" / "server.key").is_file()
    assert said == [f'CURVE keys for the job\'s roles in {keys} (cluster.auth = "always")']
    assert job_keys(config, tmp_path, said.append).ps.keys == keys  # a resumed job: the same
    strangers = make_keys(tmp_path / "strangers")

    def act(op: str, body: dict) -> dict:
        return {"job": "locked", "op": op}

    with ControlServer("127.0.0.1:0", "locked", act, keys=keys) as server:
        with ControlClient(server.address, "locked", timeout_s=2.0, keys=keys) as client:
            assert client.call("status") == {"job": "locked", "op": "status"}
        for other in (None, str(strangers)):  # no keys; keys the server does not admit
            with ControlClient(server.address, "locked", timeout_s=0.5, retries=1,
                               keys=other) as client:  # fmt: skip
                with pytest.raises(PeerUnreachableError):
                    client.call("status")
        assert server.router.received == 1  # nothing of theirs reached the role
