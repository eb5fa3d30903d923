"""CURVE: a protected server admits the key holders only; beyond loopback needs keys."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.net.address import InsecureBindError
from hogwild.net.auth import make_keys
from hogwild.net.channel import PeerUnreachableError

pytestmark = pytest.mark.ps_kernels

GEOMETRY = ModelGeometry(2048)


def test_a_curve_server_refuses_clients_without_the_key(tmp_path):
    keys = make_keys(tmp_path / "keys")
    strangers = make_keys(tmp_path / "strangers")
    with local_server(GEOMETRY, shard_kib=4, keys=str(keys)) as server:
        address = str(server.address)
        with PSClient([address], "test", client_id=1, keys=str(keys)) as client:
            client.push_deltas(np.ones(2048, np.float32))
            out = np.zeros(2048, np.float32)
            client.pull(out)
            assert (out == 1).all()
        for wrong in (None, str(strangers)):  # no keys at all; keys the server does not admit
            with pytest.raises(PeerUnreachableError, match=address):
                PSClient([address], "test", client_id=2, keys=wrong, timeout_s=0.3, retries=1)
        assert server.status()["applied_requests"] == 2


def test_binding_beyond_loopback_without_keys_is_refused():
    with pytest.raises(InsecureBindError, match="hogwild ps keys DIR"):
        with local_server(GEOMETRY, servers=("0.0.0.0:0",), shard_kib=4):
            pass


def test_the_cli_refuses_too_and_makes_keys(tmp_path):
    cli = [sys.executable, "-m", "hogwild.cli", "ps"]
    done = subprocess.run(
        [*cli, "serve", "--bind", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "refusing to bind 0.0.0.0:0" in done.stderr and "hogwild ps keys DIR" in done.stderr
    done = subprocess.run(
        [*cli, "keys", str(tmp_path / "k")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and (tmp_path / "k" / "server.key_secret").is_file()
    done = subprocess.run(
        [*cli, "keys", str(tmp_path / "k")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "never overwritten" in done.stderr
