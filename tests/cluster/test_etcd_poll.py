"""The watch's own transport (:mod:`hogwild_plugins.ps.etcd_poll`) against a real etcd on
loopback: a poll goes to a member that answers, a member's error is typed and names it, and
when no member answers the failure names each one, as the client's reads do."""

from __future__ import annotations

import base64

import pytest
from hogwild_plugins.ps.etcd import LEADERLESS, Etcd, EtcdClusterLost, EtcdUnavailable
from hogwild_plugins.ps.etcd_poll import RangePoller

from hogwild.errors import HogwildError
from hogwild.net.ports import free_ports

pytestmark = pytest.mark.kernel_free


def _range(key: str) -> dict:
    return {"key": base64.b64encode(key.encode()).decode(), "count_only": True}


def test_a_poll_reaches_the_member_that_answers_and_names_every_member_when_none_does(
    etcd: Etcd,
) -> None:
    dead = [f"127.0.0.1:{port}" for port in free_ports(2)]  # nothing listens there
    etcd.put("k", {"v": 1})
    live = etcd.members[0]
    clients = etcd._clients  # the client's etcd3gw transport: its member's API path, asked once

    poller = RangePoller([dead[0], live], lambda i: clients[0].api_path, 1.0, LEADERLESS)
    try:
        for _ in range(3):  # the dead member is passed over, the live one's connection kept
            reply = poller.post("/kv/range", _range(f"{etcd.prefix}k"))
            assert int(reply["count"]) == 1 and "header" in reply
        # a request the member refuses is the member's error, typed, naming it
        with pytest.raises(HogwildError, match=f"etcd at {live}: /kv/range failed: HTTP 400"):
            poller.post("/kv/range", {"key": "not base64 !"})
    finally:
        poller.close()

    alone = RangePoller([dead[0]], lambda i: "/v3/", 1.0, LEADERLESS)
    with pytest.raises(EtcdUnavailable, match=f"etcd at {dead[0]} cannot be reached"):
        alone.post("/kv/range", _range("k"))
    both = RangePoller(dead, lambda i: "/v3/", 1.0, LEADERLESS)
    with pytest.raises(EtcdClusterLost, match=f"{dead[0]}: .*; {dead[1]}: "):
        both.post("/kv/range", _range("k"))
