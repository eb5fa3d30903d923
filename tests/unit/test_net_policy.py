"""Addresses and the bind policy, CURVE key directories, and the duplicate-request window."""

from __future__ import annotations

import os
import stat

import pytest

from hogwild.net.address import (
    AddressError,
    InsecureBindError,
    check_bind,
    is_loopback,
    parse_address,
)
from hogwild.net.auth import KeysError, make_keys, secure_client
from hogwild.net.dedup import RequestWindow, Seen


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("127.0.0.1:5570", "tcp://127.0.0.1:5570"),
        ("tcp://10.0.0.2:9", "tcp://10.0.0.2:9"),
        ("[::1]:5570", "tcp://[::1]:5570"),
        ("ps-3.example:1", "tcp://ps-3.example:1"),
        ("ipc:///tmp/ps.sock", "ipc:///tmp/ps.sock"),
        ("inproc://ps", "inproc://ps"),
    ],
)
def test_addresses_parse_to_endpoints(text, endpoint):
    assert parse_address(text).endpoint == endpoint


@pytest.mark.parametrize("text", ["", "host", "host:port", "h:70000", "::1:5", "udp://x:1", ":5"])
def test_bad_addresses_name_the_text(text):
    with pytest.raises(AddressError, match="address"):
        parse_address(text)


def test_only_loopback_binds_without_keys():
    for text in ("127.0.0.1:1", "[::1]:1", "localhost:1", "ipc:///tmp/x", "inproc://x"):
        assert is_loopback(parse_address(text))
        check_bind(parse_address(text), None)
    for text in ("0.0.0.0:5570", "[::]:5570", "10.1.2.3:5570", "ps.example:5570"):
        with pytest.raises(InsecureBindError, match="hogwild ps keys DIR"):
            check_bind(parse_address(text), None)
        check_bind(parse_address(text), "/some/keys")  # allowed with keys


def test_make_keys_writes_private_secrets_and_never_overwrites(tmp_path):
    root = make_keys(tmp_path / "keys")
    names = sorted(p.name for p in root.iterdir())
    assert names == [
        "authorized",
        "client.key",
        "client.key_secret",
        "server.key",
        "server.key_secret",
    ]
    assert (root / "authorized" / "client.key").is_file()
    for secret in ("client.key_secret", "server.key_secret"):
        assert stat.S_IMODE(os.stat(root / secret).st_mode) == 0o600
    with pytest.raises(KeysError, match="never overwritten"):
        make_keys(root)


def test_missing_keys_say_how_to_make_them(tmp_path):
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        with pytest.raises(KeysError, match="hogwild ps keys DIR"):
            secure_client(sock, tmp_path)
    finally:
        sock.close(linger=0)
        ctx.term()


def test_request_window_drops_and_reanswers_duplicates():
    window = RequestWindow(per_sender=3)
    assert window.check(1, 10) == (Seen.NEW, None)
    assert window.check(1, 10) == (Seen.IN_PROGRESS, None)
    window.finish(1, 10, [b"ack"])
    assert window.check(1, 10) == (Seen.DONE, [b"ack"])
    assert window.check(2, 10) == (Seen.NEW, None)  # another sender
    window.finish(2, 10, None)  # forgotten (idempotent): served again
    assert window.check(2, 10) == (Seen.NEW, None)
    for seq in (11, 12, 13):
        window.check(1, seq)
    assert window.check(1, 10) == (Seen.NEW, None)  # aged out of the last 3
    assert window.duplicates == 2
