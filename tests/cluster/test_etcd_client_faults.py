"""The etcd client (:mod:`hogwild_plugins.ps.etcd`) where something other than a healthy etcd
answers, or fails under it: how many times a keepalive, a read and a write are asked of which
member (held, slow, refused, "leader changed", a dropped proposal), the return to the near
member and its back-off, closing a client (hedged asks cut, another thread's request left to
end, sessions that fail to close), a hedged read among a broken member and leaderless ones, a
proxy's error page. Against tiny real HTTP servers of the tests' own
(:class:`~tests.cluster.test_etcd_poll.Gateway`), no etcd: each case is a reply no healthy
etcd sends on cue."""

from __future__ import annotations

import collections
import itertools
import queue
import threading

import hogwild_plugins.ps.etcd_members as member_choice
import pytest
from hogwild_plugins.ps.etcd import (
    KEEPALIVE_TRIES,
    Etcd,
    EtcdClusterLost,
    EtcdUnavailable,
    keepalive_s,
)
from hogwild_plugins.ps.etcd_errors import EtcdReplyError, is_etcd_error
from hogwild_plugins.ps.etcd_poll import RangePoller
from hogwild_plugins.ps.routes import Routes

from hogwild.errors import HogwildError
from hogwild.net.ports import free_ports
from tests.cluster.test_etcd_poll import (
    KEEPALIVE,
    LEADER_CHANGED,
    RANGE,
    Gateway,
    _range,
    _until,
)

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


def _counted(client: Etcd) -> collections.Counter:
    """The asks ``client`` makes, counted by member as it sends them (a gateway counts a POST
    only once its handler thread runs)."""
    asks: collections.Counter = collections.Counter()
    lock, post_to = threading.Lock(), client._post_to

    def counted(i: int, *args, **kwargs) -> dict:
        with lock:
            asks[client.members[i]] += 1
        return post_to(i, *args, **kwargs)

    client._post_to = counted
    return asks


def test_a_keepalive_held_by_a_follower_is_asked_of_it_again_not_of_the_next_member() -> None:
    # The follower forwards the first renewal to its stopped leader and holds it; asked again
    # (after the election) it answers. The next member, the cut leader, is never waited on. The
    # renewal counts from the send time of the ask that answered: the second.
    with Gateway(200, KEEPALIVE) as follower, Gateway(200, KEEPALIVE) as leader:
        follower.hold = threading.Event()
        client = Etcd(f"{follower.address},{leader.address}", prefix="/j/", keepalive_s=0.2)
        asks = _counted(client)
        try:
            assert client.keepalive(7, clock=itertools.count().__next__) == 1
            assert client.renewal_sent == 1  # the clock read at the first ask gave 0
            assert asks == {follower.address: 2}
            assert client.lost_members == set() and client._current == 0
        finally:
            follower.hold.set()
            client.close()


def test_a_keepalive_is_asked_of_one_member_a_bounded_number_of_times() -> None:
    with Gateway(200, KEEPALIVE) as stuck, Gateway(200, KEEPALIVE) as other:
        stuck.stall = threading.Event()
        client = Etcd(f"{stuck.address},{other.address}", prefix="/j/", keepalive_s=0.1)
        asks = _counted(client)
        try:
            assert client.keepalive(7) == 1
            assert asks == {stuck.address: KEEPALIVE_TRIES, other.address: 1}
            assert client._current == 1
            with pytest.raises(HogwildError, match="keepalive timeout 0 s: expected more than 0"):
                Etcd(stuck.address, prefix="/j/", keepalive_s=0)
            # Neither answers: each is asked its tries, every ask kept open to its timeout (2 s,
            # far past the hedges' 0.1 s spacing: with 0.5 s a thread stalled 0.3 s under load
            # let the first ask time out before the third hedge, and the member was asked twice)
            other.stall = stuck.stall
            near = Etcd(
                f"{stuck.address},{other.address}", prefix="/j/", timeout_s=2.0,
                keepalive_s=0.1, near="127.0.0.1",
            )  # fmt: skip
            near_asks = _counted(near)
            with pytest.raises(EtcdClusterLost, match="/lease/keepalive"):
                near.keepalive(7)
            near.close()
            assert near_asks == {stuck.address: KEEPALIVE_TRIES, other.address: KEEPALIVE_TRIES}
        finally:
            stuck.stall.set()
            client.close()
    assert keepalive_s(1) == 0.25 and keepalive_s(0.4) == 0.2  # a quarter of the lease


def test_a_keepalive_whose_near_member_is_refused_waits_out_a_slow_member_in_its_place() -> None:
    # The near member is down (refused); the next one, mid-election, answers after 0.4 s: the
    # renewal succeeds, hedged asks of the member in its place, none abandoned.
    (refused,) = free_ports(1)
    with Gateway(200, KEEPALIVE) as slow:
        slow.delay_s = 0.4
        near = f"127.0.0.1:{refused}"
        client = Etcd(f"{near},{slow.address}", prefix="/j/", keepalive_s=0.1, near="127.0.0.1")
        asks = _counted(client)
        try:
            assert client.keepalive(7) == 1
            assert asks[near] == 1 and 1 <= asks[slow.address] <= KEEPALIVE_TRIES
            assert client.lost_members == {near} and client._current == 1
        finally:
            client.close()


def test_a_lone_slow_member_answers_a_keepalive_slower_than_its_hedges() -> None:
    # A loaded etcd answering each renewal in 0.3 s is slow, not down: asked again every 0.1 s,
    # its first answer renews the lease
    with Gateway(200, KEEPALIVE) as slow:
        slow.delay_s = 0.3
        client = Etcd(slow.address, prefix="/j/", keepalive_s=0.1)
        asks = _counted(client)
        try:
            for _ in range(2):
                assert client.keepalive(7) == 1
            assert client.lost_members == set() and asks[slow.address] <= 2 * KEEPALIVE_TRIES
        finally:
            client.close()


def test_a_read_answered_leader_changed_twice_goes_to_the_next_member() -> None:
    with Gateway(*LEADER_CHANGED) as electing, Gateway(200, RANGE) as other:
        client = Etcd(f"{electing.address},{other.address}", prefix="/j/")
        poller = RangePoller([electing.address, other.address], lambda i: "/v3/", 1.0)
        try:
            assert client.get("k") == (None, 0)
            assert electing.posts == 2 and other.posts == 1 and client._current == 1
            assert "header" in poller.post("/kv/range", _range("k"))
            assert electing.posts == 4 and other.posts == 2 and poller._current == 1
        finally:
            poller.close()
            client.close()


def test_a_map_read_held_by_a_member_is_asked_of_the_next_which_answers_it() -> None:
    # The member the client reads from is on a cut host: it holds every read (here until the
    # test ends, the client's timeout 5 s). The map read is answered by the next member while
    # the held ask is still open (not waited out, not abandoned), and the client reads there next.
    with Gateway(200, RANGE) as cut, Gateway(200, RANGE) as other:
        cut.stall = threading.Event()
        routes = Routes(f"{cut.address},{other.address}", "j", n_servers=2, n_buckets=1)
        routes.etcd.timeout_s = 5.0
        for client in routes.etcd._clients:
            client.timeout = 5.0
        asks = _counted(routes.etcd)
        try:
            routes.read()
            assert routes.primaries == [None] and routes.members == set()
            assert asks == {cut.address: 1, other.address: 1}
            assert any(
                ask.is_alive() for ask in routes.etcd._hedges.abandoned
            )  # the held ask, still open
            assert routes.etcd._current == 1 and routes.etcd.lost_members == set()
            # asked of the member that answered, first; its hedge set past any stall of the
            # gateway's thread here, so a loaded machine cannot make it ask the held member again
            routes.etcd.read_hedge_s = 5.0
            routes.read()
            assert asks == {cut.address: 1, other.address: 2}
            with pytest.raises(HogwildError, match="read hedge delay 0 s: expected more than 0"):
                Etcd(other.address, prefix="/j/", read_hedge_s=0)
        finally:
            cut.stall.set()
            routes.close()


def test_a_write_answered_leader_changed_stays_with_that_member_which_is_not_lost() -> None:
    # It follows a leader again: the next request goes to it, and it is no lost member (so
    # a lost other member does not make the cluster lost).
    with Gateway(*LEADER_CHANGED) as electing, Gateway(200, RANGE) as other:
        client = Etcd(f"{electing.address},{other.address}", prefix="/j/")
        try:
            client.lost_members.add(other.address)
            with pytest.raises(EtcdUnavailable, match="may have been applied") as raised:
                client.put("k", {"v": 1})
            assert not isinstance(raised.value, EtcdClusterLost)
            assert electing.posts == 1 and other.posts == 0
            assert client._current == 0 and client.lost_members == {other.address}
        finally:
            client.close()


def test_a_write_whose_proposal_raft_dropped_is_sent_to_the_next_member() -> None:
    # etcd 3.4 answers raft's ErrProposalDropped with HTTP 500: never appended, so safe to
    # send elsewhere (a write of unknown fate is not).
    dropped = 500, b'{"error":"etcdserver: raft proposal dropped","code":2}'
    with Gateway(*dropped) as candidate, Gateway(200, RANGE) as other:
        client = Etcd(f"{candidate.address},{other.address}", prefix="/j/")
        try:
            assert client.put("k", {"v": 1}) == 3
            assert candidate.posts == 1 and other.posts == 1 and client._current == 1
            assert client.lost_members == {candidate.address}
        finally:
            client.close()


def test_a_client_goes_back_to_its_near_member_once_it_answers_again(monkeypatch) -> None:
    no_leader = 503, b'{"error":"etcdserver: no leader","code":14}'
    with Gateway(*no_leader) as near, Gateway(200, RANGE) as other:
        client = Etcd(f"{near.address},{other.address}", prefix="/j/", near="127.0.0.1")
        try:
            assert client.get("k") == (None, 0) and client._current == 1
            near.status, near.body = 200, RANGE  # its member is back
            assert client.get("k") == (None, 0)  # within NEAR_RETURN_S: not asked yet
            assert near.posts == 1 and other.posts == 2
            monkeypatch.setattr(member_choice, "NEAR_RETURN_S", 0.0)  # the wait is over
            client.put("w", {"v": 1})  # a write is never the probe: it stays where it is
            assert near.posts == 1 and client._current == 1
            assert client.get("k") == (None, 0)
            assert near.posts == 2 and client._current == 0
        finally:
            client.close()
    with pytest.raises(HogwildError, match="near='0.0.0.0': expected this process's host"):
        Etcd("127.0.0.1:2379", prefix="/j/", near="0.0.0.0")


def test_a_return_to_a_near_member_that_does_not_answer_is_short_and_backs_off(monkeypatch):
    # The near member accepts connections but answers nothing (stopped, stalled): a return to it
    # is asked with a short timeout, and each failed return doubles the wait before the next
    with Gateway(200, RANGE) as near, Gateway(200, RANGE) as other:
        near.stall = threading.Event()
        client = Etcd(f"{near.address},{other.address}", prefix="/j/", near="127.0.0.1",
                      timeout_s=5.0)  # fmt: skip
        limits = []
        post_to = client._post_to

        def noted(i, path, payload, timeout_s=None):
            limits.append((client.members[i], timeout_s))
            return post_to(i, path, payload, timeout_s)

        client._post_to = noted
        try:
            client._current, client._away_since = 1, 0.0  # away from it since long ago
            for backoff in (2, 4, 8, 12):
                assert client.get("k") == (None, 0) and client._current == 1
                assert client._near_backoff == backoff
                client._away_since = 0.0  # the (longer) wait is over
            assert [limit for member, limit in limits if member == near.address] == [
                member_choice.NEAR_PROBE_S
            ] * 4
            near.stall.set()  # it answers again: back, and the wait reset
            assert client.get("k") == (None, 0) and client._current == 0
            assert client._near_backoff == 1
        finally:
            near.stall.set()
            client.close()


def _held_first(held: Gateway, other: Gateway, **options) -> Etcd:
    """A client of ``held``'s member first, then ``other``'s, ``held`` holding every ask it gets
    until its ``stall`` is set (a member on a cut host)."""
    held.stall = threading.Event()
    return Etcd(f"{held.address},{other.address}", prefix="/j/", **options)


def test_closing_a_client_cuts_a_hedged_ask_still_held_instead_of_waiting_for_it() -> None:
    # A map read held by a member on a cut host (here until the test ends) is answered by the
    # next member; closing the client then does not wait out the held ask (the client's whole
    # timeout, 60 s here; the gateway holds it 10 s): its connection is cut, so its thread
    # ends, having failed.
    with Gateway(200, RANGE) as cut, Gateway(200, RANGE) as other:
        client = _held_first(cut, other, timeout_s=60.0, read_hedge_s=0.1)
        ended: queue.SimpleQueue = queue.SimpleQueue()
        post_to = client._post_to

        def noted(i: int, *args, **kwargs) -> dict:
            try:
                return post_to(i, *args, **kwargs)
            except Exception as err:
                ended.put((i, err))
                raise

        client._post_to = noted
        closer = threading.Thread(target=client.close)
        try:
            assert client.get_prefix("map/") == ({}, 3)  # the next member's answer
            (held,) = [ask for ask in client._hedges.abandoned if ask.is_alive()]
            closer.start()
            closer.join(5.0)  # far past a loaded machine's stall, short of the gateway's hold
            assert not closer.is_alive(), "close() waited for the held ask"
            held.join(5.0)
            assert not held.is_alive()
            i, err = ended.get(timeout=1.0)
            assert i == 0 and isinstance(err, member_choice._MemberDown), err  # cut, not answered
        finally:
            cut.stall.set()
            closer.join(70.0)


def test_a_hedged_read_ends_on_an_error_of_the_request_not_on_a_members_own_fault() -> None:
    # Review AD 3. A member whose reply is no etcd answer (not JSON: a broken member, or not
    # etcd at all) is that member's fault: the hedged read goes on to the next member, which
    # answers. An error etcd answers about the request (a compacted revision: every member
    # would say the same) ends the read at once, not waiting for an ask still held elsewhere.
    with Gateway(200, b"<html>not etcd</html>") as broken, Gateway(200, RANGE) as other:
        client = Etcd(f"{broken.address},{other.address}", prefix="/j/", read_hedge_s=5.0)
        try:  # the hedge far off: the next member is asked because the first failed
            assert client.get_prefix("map/") == ({}, 3)
            assert broken.posts == 1 and other.posts == 1 and client._current == 1
        finally:
            client.close()
    compacted = 400, b'{"error":"etcdserver: mvcc: required revision has been compacted"}'
    with Gateway(200, RANGE) as held, Gateway(*compacted) as refusing:
        client = _held_first(held, refusing, timeout_s=60.0, read_hedge_s=0.1)
        try:
            with pytest.raises(HogwildError, match="required revision has been compacted"):
                client.get_prefix("map/")
            assert refusing.posts == 1
            assert any(
                ask.is_alive() for ask in client._hedges.abandoned
            )  # the held ask, not awaited
        finally:
            client.close()
            held.stall.set()


def test_closing_a_client_leaves_another_threads_hedged_read_to_end_and_refuses_new_ones() -> None:
    # Review AG 2. A hedged read in flight on another thread (its first member holding it) is
    # not cut by close(): it ends with that member's answer, the next member never asked on the
    # closed client's sessions; a request asked after close() is refused, naming why.
    with Gateway(200, RANGE) as held, Gateway(200, RANGE) as other:
        client = _held_first(held, other, timeout_s=20.0, read_hedge_s=15.0)
        found: queue.SimpleQueue = queue.SimpleQueue()
        reader = threading.Thread(target=lambda: found.put(client.get_prefix("map/")))
        try:
            reader.start()
            _until(lambda: held.posts > 0, 10.0)
            assert held.posts == 1
            client.close()
            held.stall.set()  # the held member answers the read in flight
            reader.join(10.0)
            assert found.get(timeout=1.0) == ({}, 3) and other.posts == 0
            with pytest.raises(HogwildError, match="asked of a client that is closed"):
                client.get("k")
            assert other.posts == 0 and held.posts == 1
        finally:
            held.stall.set()
            reader.join(20.0)
