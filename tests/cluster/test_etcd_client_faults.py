"""The etcd client (:mod:`hogwild_plugins.ps.etcd`) where something other than a healthy etcd
answers, or fails under it: closing a client whose sessions fail to close, a hedged read among
a broken member and leaderless ones, a proxy's error page. Against tiny real HTTP servers of the
tests' own (:class:`~tests.cluster.test_etcd_poll.Gateway`), no etcd: each case is a reply no
healthy etcd sends on cue."""

from __future__ import annotations

import queue
import threading

import pytest
from hogwild_plugins.ps.etcd import Etcd, EtcdClusterLost
from hogwild_plugins.ps.etcd_errors import EtcdReplyError, is_etcd_error

from hogwild.errors import HogwildError
from tests.cluster.test_etcd_poll import RANGE, Gateway, _until

pytestmark = pytest.mark.kernel_free


def test_closing_a_client_closes_every_session_though_one_fails_to() -> None:
    # Review AE 1: one session failing to close (as one did, its lent connections changed
    # under the closing thread) must not leave the later members' sessions open.
    client = Etcd("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", prefix="/j/")  # never asked
    closed = []
    for i, member in enumerate(client._clients):
        close = member.session.close

        def noted(i=i, close=close) -> None:
            closed.append(i)
            close()
            if i == 0:
                raise RuntimeError("Set changed size during iteration")

        member.session.close = noted
    with pytest.raises(HogwildError, match="closing a session failed: Set changed size"):
        client.close()
    assert closed == [0, 1, 2]


def test_a_hedged_read_with_a_broken_member_and_a_leaderless_one_is_a_lost_cluster() -> None:
    # Review AE 3: a junk reply from one member while the other has no leader (an election
    # under way) is EtcdClusterLost, which failovers read again on, not the junk member's
    # EtcdReplyError, which would end them. Junk from every member is the EtcdReplyError.
    leaderless = 503, b'{"error":"etcdserver: no leader","code":14}'
    with Gateway(200, b"<html>not etcd</html>") as broken, Gateway(*leaderless) as electing:
        client = Etcd(f"{broken.address},{electing.address}", prefix="/j/", read_hedge_s=5.0)
        try:
            with pytest.raises(EtcdClusterLost, match="no leader") as lost:
                client.get_prefix("map/")
            assert "reply is not JSON" in str(lost.value)  # the broken member's failure named
            electing.status, electing.body = 200, b"[]"
            with pytest.raises(EtcdReplyError):
                client.get_prefix("map/")
        finally:
            client.close()


@pytest.mark.parametrize(
    "status, body",
    [(502, b"<html><body>502 Bad Gateway</body></html>"), (404, b"404 page not found\n")],
)
def test_an_error_status_without_etcds_error_object_is_the_members_fault(status, body) -> None:
    # Review AE 4: a proxy's HTML 502, or Go's plain 404 from a server that is not etcd's
    # gateway, is no answer of etcd's about the request: EtcdReplyError (a hedged read asks
    # the next member, which answers), not the plain error that ends a read at once.
    with Gateway(status, body) as proxy, Gateway(200, RANGE) as other:
        client = Etcd(proxy.address, prefix="/j/")
        hedged = Etcd(f"{proxy.address},{other.address}", prefix="/j/", read_hedge_s=5.0)
        try:
            with pytest.raises(EtcdReplyError, match=f"HTTP {status}: .*no error reply of etcd"):
                client.get("k")
            assert hedged.get_prefix("map/") == ({}, 3)
        finally:
            client.close()
            hedged.close()


def test_only_etcds_error_object_is_read_as_etcds_answer() -> None:
    assert is_etcd_error('{"error":"etcdserver: mvcc: required revision has been compacted"}')
    assert is_etcd_error('{"code":5,"message":"etcdserver: requested lease not found"}')
    for junk in ("404 page not found", "<html>502</html>", "[]", '{"code":5}', '{"error":""}'):
        assert not is_etcd_error(junk), junk


def test_closing_a_client_leaves_another_threads_request_in_flight_to_end() -> None:
    # Review AE 6: close() cuts the asks a hedged request abandoned, not every connection in
    # use: a plain read another thread has in flight (a keeper's, a write of unknown fate) is
    # answered as it would have been, not failed as if its member were down.
    with Gateway(200, RANGE) as slow:
        slow.stall = threading.Event()
        client = Etcd(slow.address, prefix="/j/", timeout_s=30.0)
        outcome: queue.SimpleQueue = queue.SimpleQueue()

        def read() -> None:
            try:
                outcome.put(client.get("k"))
            except Exception as err:  # noqa: BLE001 - the test reads it
                outcome.put(err)

        reader = threading.Thread(target=read)
        reader.start()
        try:
            assert _until(lambda: slow.posts == 1)  # the read is on the wire, unanswered
            client.close()
        finally:
            slow.stall.set()
            reader.join(30.0)
        assert outcome.get(timeout=1.0) == (None, 0)
