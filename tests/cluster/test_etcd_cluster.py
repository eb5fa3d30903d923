"""The etcd client against a real three-member etcd cluster on loopback: ``HOST:PORT,...``, failover
between members, a lost member told from a lost cluster, and a write of unknown fate never
repeated on another member. The job's own cluster (:class:`EtcdCluster`, ``cluster.etcd = "job"``)
survives a lost member, leaves nothing when stopped, and dies with a killed owner, whose data the
next start sweeps."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
import requests
from hogwild_plugins.ps.etcd import (
    Etcd,
    EtcdClusterLost,
    EtcdUnavailable,
    etcd_binary,
    parse_endpoints,
)
from hogwild_plugins.ps.etcd_poll import RangePoller
from hogwild_plugins.ps.etcd_process import (
    ELECTION_MS,
    PRE_VOTE,
    EtcdCluster,
    heartbeat_ms,
    sweep_stale_work,
)

from hogwild.errors import HogwildError
from hogwild.net.ports import free_ports

pytestmark = pytest.mark.kernel_free

READY_WITHIN_S = 30.0
REQUEST_S = 1.0
ELECTION_REQUEST_S = 5.0  # far longer than an election at 200 ms: a request that waited one out


class Members:
    """Three etcd processes forming one cluster on loopback; killed and reaped by :meth:`close`."""

    def __init__(self, work) -> None:
        ports = free_ports(6)
        self.clients = [f"127.0.0.1:{p}" for p in ports[:3]]
        peers = [f"http://127.0.0.1:{p}" for p in ports[3:]]
        initial = ",".join(f"m{i}={peer}" for i, peer in enumerate(peers))
        self.processes: list[subprocess.Popen] = []
        for i, (client, peer) in enumerate(zip(self.clients, peers, strict=True)):
            url = f"http://{client}"
            self.processes.append(subprocess.Popen([
                etcd_binary(), f"--name=m{i}", f"--data-dir={work / f'm{i}'}",
                f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster={initial}", "--initial-cluster-state=new",
                f"--heartbeat-interval={heartbeat_ms(ELECTION_MS)}",
                f"--election-timeout={ELECTION_MS}", PRE_VOTE, "--log-level=error",
            ], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip

    def kill(self, i: int) -> None:
        self.processes[i].kill()
        self.processes[i].wait()

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()


def _answers(member: str) -> bool:
    with Etcd(member, prefix="/ready/", timeout_s=REQUEST_S) as one:
        return one.get("k")[1] > 0


@pytest.fixture
def members(tmp_path) -> Iterator[Members]:
    started = Members(tmp_path)
    try:
        client = Etcd(",".join(started.clients), prefix="/ready/", timeout_s=REQUEST_S)
        deadline = time.monotonic() + READY_WITHIN_S
        while True:  # every member up and the cluster with a leader
            try:
                client.put("k", {})
                if all(_answers(member) for member in started.clients):
                    break
            except EtcdUnavailable:
                pass
            assert time.monotonic() < deadline, "the etcd cluster did not form"
            time.sleep(0.1)
        client.close()
        yield started
    finally:
        started.close()


def test_endpoints_are_parsed_and_checked():
    assert parse_endpoints(" 127.0.0.1:1, 127.0.0.2:2") == ["127.0.0.1:1", "127.0.0.2:2"]
    for bad, said in (("", "HOST:PORT"), ("a:1,,b:2", "HOST:PORT"), ("a:1,a:1", "twice")):
        with pytest.raises(HogwildError, match=said):
            parse_endpoints(bad)


def test_requests_go_first_to_the_member_on_the_clients_own_host():
    members = "10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379"
    for near, first in (("10.0.0.2", 1), ("10.0.0.3", 2), ("10.0.0.9", 0), (None, 0)):
        with Etcd(members, prefix="/job/", near=near) as client:
            assert client.members[client._current] == members.split(",")[first]


def test_a_lost_member_is_failed_over_and_a_lost_cluster_told_apart(members):
    client = Etcd(",".join(members.clients), prefix="/job/", timeout_s=REQUEST_S)
    try:
        client.put("a", {"n": 1})
        assert client.lost_members == set()
        members.kill(0)  # the member the client was talking to
        assert client.get("a")[0] == {"n": 1}  # a read goes on to the next member
        # (a member asked while the two left elect a leader fails too: lost until it answers)
        assert members.clients[0] in client.lost_members
        assert client.lost_members != set(members.clients)
        client.put("a", {"n": 2})  # and so do writes, now sent there
        lease = client.grant(2)
        assert client.keepalive(lease) > 0
        assert client.get("a")[0] == {"n": 2}

        members.kill(1)  # one member of three left: no quorum, the cluster is lost
        with pytest.raises(EtcdClusterLost, match="no member of the etcd cluster"):
            client.get("a")
        assert client.lost_members == set(members.clients)
    finally:
        client.close()


def test_a_write_of_unknown_fate_is_not_repeated_on_another_member(members):
    client = Etcd(",".join(members.clients), prefix="/job/", timeout_s=REQUEST_S)
    try:
        client.put("a", {"n": 1})
        members.processes[0].send_signal(19)  # SIGSTOP: it takes the request, never answers
        try:
            with pytest.raises(EtcdUnavailable, match="not repeated") as raised:
                client.put("a", {"n": 2})
            assert not isinstance(raised.value, EtcdClusterLost)  # one member lost, not all
            assert client.lost_members == {members.clients[0]}
            client.put("b", {"n": 3})  # the next request went to the next member
            assert client.lost_members == {members.clients[0]}
        finally:
            members.processes[0].send_signal(18)  # SIGCONT
    finally:
        client.close()


def _leader(members: Members) -> int:
    """The index of the member that leads (as the members' statuses say)."""
    ids = {}
    leader = None
    for i, member in enumerate(members.clients):
        reply = requests.post(f"http://{member}/v3/maintenance/status", json={}, timeout=REQUEST_S)
        status = reply.json()
        ids[int(status["header"]["member_id"])] = i
        leader = int(status["leader"])
    return ids[leader]


def test_a_member_that_saw_a_new_leader_is_asked_again_not_the_old_leader(members):
    # The leader stopped (a cut host): a follower's read waits out the election, then fails
    # "leader changed". The follower follows the new leader by then: the read (and the watch's
    # poll) is asked of it again, and the old leader, next in the list, is never waited on.
    leader = _leader(members)
    follower, other = (i for i in range(3) if i != leader)
    order = [members.clients[i] for i in (follower, leader, other)]
    # A long request timeout, so that the election always ends within it: the old leader, had
    # it been asked, would have held the read the whole timeout and become a lost member.
    client = Etcd(",".join(order), prefix="/job/", timeout_s=ELECTION_REQUEST_S)
    key = base64.b64encode(b"/job/a").decode()
    poller = RangePoller(order, lambda i: "/v3/", ELECTION_REQUEST_S)
    found: dict = {}

    def poll() -> None:
        try:
            found["poll"] = poller.post("/kv/range", {"key": key})
        except Exception as err:  # noqa: BLE001 - the test's thread: reported below
            found["error"] = err

    try:
        client.put("a", {"n": 1})
        members.processes[leader].send_signal(19)  # SIGSTOP
        polled = threading.Thread(target=poll)
        polled.start()
        try:
            start = time.monotonic()
            assert client.get("a")[0] == {"n": 1}
            assert time.monotonic() - start < ELECTION_REQUEST_S  # no timeout waited out
            polled.join(READY_WITHIN_S)
        finally:
            members.processes[leader].send_signal(18)  # SIGCONT
        assert members.clients[leader] not in client.lost_members
        assert client.lost_members == set()
        assert client._current == 0  # the follower first asked
        assert "error" not in found, found.get("error")
        assert poller._current == 0 and found["poll"]["count"] == "1"
    finally:
        poller.close()
        client.close()


WRITE_RETRY_S = 0.4  # write_retry_s(ELECTION_MS, 2.0): two election timeouts


def test_a_swap_forwarded_to_a_stopped_leader_is_read_back_and_applied_exactly_once(members):
    # The leader stopped (its host cut, the followers not aware yet): each follower forwards a
    # compare-and-swap's proposal to it, where it is lost without an answer. Both swaps, from the
    # same revision, are read back once the followers elected a new leader and asked again only
    # if they did not apply: they answer within the client's timeout (no EtcdUnavailable), one
    # wins and one loses, and the key was written exactly once.
    leader = _leader(members)
    followers = [i for i in range(3) if i != leader]
    clients = [
        Etcd(",".join(members.clients[j] for j in (i, leader, *set(followers) - {i})),
             prefix="/job/", timeout_s=2.0, write_retry_s=WRITE_RETRY_S)
        for i in followers
    ]  # fmt: skip
    won: dict[int, object] = {}

    def swap(n: int, expected: int) -> None:
        try:
            won[n] = clients[n].replace("a", {"by": n}, expected, also=[(f"b{n}", {"by": n})])
        except Exception as err:  # noqa: BLE001 - the test's thread: asserted below
            won[n] = err

    try:
        clients[0].put("a", {"n": 1})
        value, expected = clients[0].get("a")
        members.processes[leader].send_signal(19)  # SIGSTOP
        try:
            threads = [threading.Thread(target=swap, args=(n, expected)) for n in (0, 1)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(READY_WITHIN_S)
        finally:
            members.processes[leader].send_signal(18)  # SIGCONT
        assert sorted(won.values(), key=str) == [False, True], won
        winner = next(n for n, ok in won.items() if ok)
        reader = clients[1 - winner]
        found, _ = reader.get_prefix("")
        assert found["a"][0] == {"by": winner}
        assert found[f"b{winner}"][1] == found["a"][1]  # one transaction, applied once
        assert f"b{1 - winner}" not in found
        reply = reader._post("/kv/range", {"key": base64.b64encode(b"/job/a").decode()})
        assert reply["kvs"][0]["version"] == "2"  # created, then swapped once: never twice
    finally:
        for client in clients:
            client.close()


def test_a_single_member_is_still_named_as_before(members):
    members.kill(2)
    client = Etcd(members.clients[2], prefix="/job/", timeout_s=REQUEST_S)
    with pytest.raises(EtcdUnavailable, match=f"etcd at {members.clients[2]} cannot be reached"):
        client.get("a")
    client.close()


def _members_alive(cluster: EtcdCluster) -> list[int]:
    return [m.process.pid for m in cluster.members if m.process and m.process.poll() is None]


def test_the_jobs_own_cluster_survives_a_lost_member_and_stops_leaving_nothing(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the members' data goes
    cluster = EtcdCluster(3)
    try:
        address = cluster.start()
        assert parse_endpoints(address) == [m.address for m in cluster.members]
        assert len(_members_alive(cluster)) == 3 and cluster.min_ttl_s >= 1
        assert len(list(tmp_path.glob("hogwild-etcd-*"))) == 3
        client = Etcd(address, prefix="/job/", timeout_s=REQUEST_S)
        try:
            client.put("a", {"n": 1})
            cluster.members[0].process.kill()  # the member the client talks to
            cluster.members[0].process.wait()
            deadline = time.monotonic() + READY_WITHIN_S
            while True:  # a write of unknown fate is the caller's to retry (see above)
                try:
                    client.put("a", {"n": 2})
                    break
                except EtcdUnavailable as exc:
                    assert not isinstance(exc, EtcdClusterLost)
                    assert time.monotonic() < deadline, "two members of three stopped serving"
            assert client.get("a")[0] == {"n": 2}
            assert cluster.members[0].address in client.lost_members
        finally:
            client.close()
    finally:
        cluster.stop()
    assert _members_alive(cluster) == []
    assert list(tmp_path.iterdir()) == []  # every member's data and log removed


OWNER = """
import sys, tempfile, time
tempfile.tempdir = sys.argv[1]
from hogwild_plugins.ps.etcd_process import EtcdCluster
cluster = EtcdCluster(3)
cluster.start()
print(" ".join(str(m.process.pid) for m in cluster.members), flush=True)
time.sleep(600)
"""


def test_a_killed_owner_takes_its_members_along_and_the_next_start_sweeps_their_data(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE,
                             text=True)  # fmt: skip
    try:
        pids = [int(pid) for pid in owner.stdout.readline().split()]
        assert len(pids) == 3, "the owner did not start its cluster"
        owner.kill()  # no stop(), no finally: a crashed driver
        owner.wait()
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in pids):  # Linux's parent-death signal killed them
        assert time.monotonic() < deadline, "an etcd member outlived its owner"
        time.sleep(0.05)
    left = sorted(tmp_path.glob(f"hogwild-etcd-{owner.pid}-*"))
    assert len(left) == 3  # nobody ran stop(): the data is still there ...
    (tmp_path / f"hogwild-etcd-{os.getpid()}-mine").mkdir()  # a live owner's: not touched
    assert sorted(sweep_stale_work(tmp_path)) == left  # ... until the next start sweeps it
    assert [p.name for p in tmp_path.iterdir()] == [f"hogwild-etcd-{os.getpid()}-mine"]


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
