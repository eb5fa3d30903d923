"""A replicated server's first registration with etcd, against a real etcd on loopback: a member
that accepts connections but does not answer (as one just restarted does, or one whose host is
cut) does not make the server's start fail while another member answers; etcd silent past the
bound is an error naming the tries; a lease that lapses between its grant and its key's write (a
start starved of CPU for longer than the TTL) is followed by a new one, not by the server's exit.

The silent member is a listening socket that never accepts: the kernel completes each
connection, the client's request is sent, and no answer comes, which is what a member that
rejoins its cluster gives a write before it can serve it.
"""

from __future__ import annotations

import socket
import uuid

import pytest
from hogwild_plugins.ps.etcd import Etcd, EtcdUnavailable
from hogwild_plugins.ps.failover import lease_now
from hogwild_plugins.ps.replication.membership import Membership

pytestmark = pytest.mark.kernel_free

ASK_S = 0.5  # each ask's timeout: a silent member costs this much per try


@pytest.fixture
def silent_member():
    """``HOST:PORT`` of a member that takes connections and never answers."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def membership(address: str) -> tuple[Membership, Etcd]:
    etcd = Etcd(address, prefix=f"/hogwild/test-{uuid.uuid4().hex[:8]}/", timeout_s=ASK_S)
    return Membership(etcd, 0, "127.0.0.1:7100", 2, lambda: None, list), etcd


def test_a_silent_member_first_does_not_fail_the_start_while_another_answers(
    etcd_server, silent_member
):
    member, etcd = membership(f"{silent_member},{etcd_server.address}")
    try:
        member.start()  # the first grant goes to the silent member and times out
        record, _ = etcd.get("members/0")
        assert record is not None and record["lease"] == member.clock.lease
        assert member.clock.valid(lease_now())
    finally:
        member.stop()
        member.revoke()
        etcd.close()


def test_etcd_silent_past_the_bound_is_an_error_naming_the_tries(silent_member):
    member, etcd = membership(silent_member)
    try:
        with pytest.raises(EtcdUnavailable, match=r"server 0: etcd did not answer its "
                           r"registration in \d+ tries over 2 s"):  # fmt: skip
            member.start(within_s=2.0)
        assert member._thread is None  # no heartbeat for a lease it never had
    finally:
        member.stop()
        etcd.close()


def test_a_lease_lapsed_before_its_key_was_written_is_granted_again(etcd_server, capsys):
    member, etcd = membership(etcd_server.address)
    put, lapsed = etcd.put, []

    def put_after_the_first_lease_lapsed(key, value, lease=None):
        if not lapsed:  # the real lapse, as a starved start meets it: etcd no longer has it
            lapsed.append(lease)
            etcd.revoke(lease)
        return put(key, value, lease=lease)

    etcd.put = put_after_the_first_lease_lapsed
    try:
        member.start()
        record, _ = etcd.get("members/0")
        assert record is not None and record["lease"] == member.clock.lease != lapsed[0]
        assert member.clock.valid(lease_now())
        said = capsys.readouterr().err
        assert "etcd let the lease of its registration lapse before its key was written" in said
    finally:
        member.stop()
        member.revoke()
        etcd.close()
