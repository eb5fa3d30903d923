"""The parameter servers' link to etcd, against a real etcd on loopback (no mocks): the server's
life cycle, leases, the compare-and-swap transactions, the watch, and the typed failures."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time

import etcd3gw
import psutil
import pytest
from hogwild_plugins.ps.etcd import (
    Etcd,
    EtcdProcess,
    EtcdUnavailable,
    LeaseExpired,
    etcd_binary,
)
from hogwild_plugins.ps.etcd_process import PRE_VOTE

from hogwild.errors import HogwildError
from hogwild.net.ports import free_port

pytestmark = pytest.mark.kernel_free

WAIT_S = 10.0  # the most any test waits for something that should take about a second


def wait_for(condition, timeout_s: float = WAIT_S) -> bool:
    """Poll ``condition()`` until it is true or ``timeout_s`` passed; whether it became true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return bool(condition())


def raw_put(etcd: Etcd, key: str, data: bytes) -> None:
    """Write bytes the typed client would refuse, as a foreign or broken writer might."""
    host, port = etcd.address.rsplit(":", 1)
    client = etcd3gw.client(host=host, port=int(port), timeout=2)
    try:
        client.put((etcd.prefix + key).encode(), data)
    finally:
        client.session.close()


# -- the server ---------------------------------------------------------------------------


def test_start_and_stop_leave_no_process_and_no_directory() -> None:
    server = EtcdProcess()
    address = server.start()
    pid, work = server.process.pid, server.log_path.parent
    assert psutil.pid_exists(pid) and work.is_dir()
    assert PRE_VOTE in psutil.Process(pid).cmdline()  # no member deposes a healthy leader
    assert server.min_ttl_s == 1
    with Etcd(address, prefix="/t/") as client:
        assert client.put("k", {"v": 1}) > 0
    server.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not work.exists()
    server.stop()  # idempotent
    with pytest.raises(HogwildError, match="not started"):
        _ = server.address


def test_a_given_data_dir_is_kept_and_reused(tmp_path) -> None:
    with EtcdProcess(tmp_path / "etcd") as server, Etcd(server.address, prefix="/t/") as client:
        client.put("kept", {"v": 1})
    assert (tmp_path / "etcd").is_dir()
    with EtcdProcess(tmp_path / "etcd") as server, Etcd(server.address, prefix="/t/") as client:
        assert client.get("kept")[0] == {"v": 1}


def test_etcd_dies_with_its_parent(tmp_path) -> None:
    script = (
        "import sys, time\n"
        "from hogwild_plugins.ps.etcd import EtcdProcess\n"
        "server = EtcdProcess(sys.argv[1])\n"
        "server.start()\n"
        "print(server.process.pid, server.log_path.parent, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "etcd")], stdout=subprocess.PIPE, text=True
    )
    try:
        pid, work = parent.stdout.readline().split()
        etcd_pid = int(pid)
        assert psutil.Process(etcd_pid).ppid() == parent.pid
    finally:
        parent.kill()
        parent.wait(WAIT_S)
        parent.stdout.close()
    assert wait_for(lambda: not psutil.pid_exists(etcd_pid))
    # a parent killed with SIGKILL cannot remove it; another etcd started meanwhile (by a test
    # on the other worker) may have swept it already, as a stale work directory
    shutil.rmtree(work, ignore_errors=True)


def test_a_missing_binary_says_how_to_install_etcd() -> None:
    with pytest.raises(HogwildError, match="apt-get install etcd-server.*--etcd HOST:PORT"):
        etcd_binary("no-such-etcd-binary")
    with pytest.raises(HogwildError, match="apt-get install etcd-server"):
        EtcdProcess(binary="/nonexistent/etcd").start()


def test_an_election_timeout_that_leases_cannot_honour_is_refused() -> None:
    with pytest.raises(HogwildError, match="expected a whole number of milliseconds >= 10"):
        EtcdProcess(election_ms=5)
    with pytest.raises(HogwildError, match=r"lease_floor_s=1 needs election_ms <= 666 \(got 700\)"):
        EtcdProcess(election_ms=700)  # leases of 1.05 s at least: 1 s leases not honoured
    with pytest.raises(HogwildError, match="needs election_ms <= 133 .got the default 200."):
        EtcdProcess(lease_floor_s=0.2)  # the default election timeout is named as the default
    assert EtcdProcess(lease_floor_s=3.0, election_ms=1500).election_ms == 1500


def test_a_lease_shorter_than_etcd_grants_is_refused() -> None:
    # An election timeout of 1.5 s: etcd grants leases of 3 s at least.
    with (
        EtcdProcess(lease_floor_s=3.0, election_ms=1500) as server,
        Etcd(server.address, prefix="/t/") as client,
    ):
        assert server.min_ttl_s > 1
        with pytest.raises(HogwildError, match="grants leases of at least"):
            client.grant(1)
        assert client.keepalive(client.grant(server.min_ttl_s)) > 0


# -- leases -------------------------------------------------------------------------------


def test_lease_expiry_removes_its_keys(etcd: Etcd) -> None:
    lease = etcd.grant(1)
    etcd.put("primary/0", {"server": "a"}, lease=lease)
    etcd.put("map", {"buckets": [0]})
    assert etcd.get("primary/0")[0] == {"server": "a"}
    assert wait_for(lambda: etcd.get("primary/0") == (None, 0))
    assert etcd.get("map")[0] == {"buckets": [0]}  # a key without the lease stays


def test_keepalive_keeps_the_keys_of_a_lease(etcd: Etcd) -> None:
    lease = etcd.grant(2)
    etcd.put("primary/0", {"server": "a"}, lease=lease)
    end = time.monotonic() + 5.0  # more than twice the TTL
    while time.monotonic() < end:
        assert etcd.keepalive(lease) > 0
        assert etcd.get("primary/0")[0] == {"server": "a"}
        time.sleep(0.2)
    etcd.revoke(lease)
    assert etcd.get("primary/0") == (None, 0)


def test_keepalive_after_expiry_reports_it(etcd: Etcd) -> None:
    lease = etcd.grant(1)
    etcd.put("primary/0", {"server": "a"}, lease=lease)
    assert wait_for(lambda: etcd.get("primary/0") == (None, 0))
    assert etcd.keepalive(lease) <= 0
    assert etcd.keepalive(12345) <= 0  # never granted
    with pytest.raises(LeaseExpired, match=str(lease)):
        etcd.put("primary/0", {"server": "a"}, lease=lease)
    with pytest.raises(LeaseExpired):
        etcd.create("primary/0", {"server": "a"}, lease=lease)
    etcd.revoke(lease)  # already gone: no error


# -- transactions -------------------------------------------------------------------------


def test_exactly_one_of_racing_creates_wins(etcd_server: EtcdProcess, etcd: Etcd) -> None:
    racers = 4
    clients = [Etcd(etcd_server.address, prefix=etcd.prefix) for _ in range(racers)]

    def race(i: int, key: str, start: threading.Barrier, won: list) -> None:
        start.wait()
        won[i] = clients[i].create(key, {"server": i})

    for round_ in range(5):
        key, start, won = f"primary/{round_}", threading.Barrier(racers, timeout=WAIT_S), {}
        threads = [threading.Thread(target=race, args=(i, key, start, won)) for i in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        winners = [i for i in range(racers) if won.get(i) is True]
        assert len(winners) == 1 and len(won) == racers, won
        assert etcd.get(key)[0] == {"server": winners[0]}
    for client in clients:
        client.close()


def test_replace_with_a_stale_revision_fails(etcd: Etcd) -> None:
    assert etcd.replace("map", {"version": 1}, 0)  # 0: absent, so this creates
    value, revision = etcd.get("map")
    assert etcd.replace("map", {"version": 2}, revision)
    assert not etcd.replace("map", {"version": 3}, revision)
    assert etcd.get("map")[0] == {"version": 2}
    assert not etcd.create("map", {"version": 4})
    assert not etcd.delete("map", revision)
    assert etcd.delete("map", etcd.get("map")[1])
    assert etcd.get("map") == (None, 0)
    assert not etcd.delete("map")


def test_a_refused_swap_is_false_even_when_the_key_holds_the_same_value(
    etcd_server: EtcdProcess, etcd: Etcd
) -> None:
    # The servers' map client (write_retry_s: a lost proposal is read back). A first ask that
    # etcd refused is never ours, whatever the key holds: a role deciding the record it wrote
    # before again from an older revision, or two roles building byte-identical records (a
    # hand-over and the successor's own campaign), must hear False, as without the read-back;
    # a failed guard too. Only a refusal after an ask of unknown fate may be our own first ask.
    swaps = Etcd(etcd_server.address, prefix=etcd.prefix, write_retry_s=0.4)
    try:
        assert swaps.replace("sync/1", {"epoch": 1}, 0)
        _, first = swaps.get("sync/1")
        assert swaps.replace("sync/1", {"epoch": 2}, first)
        _, second = swaps.get("sync/1")
        assert not swaps.replace("sync/1", {"epoch": 2}, first)  # the same value, stale revision
        assert not swaps.create("sync/1", {"epoch": 2})  # a create of what it holds: refused
        etcd.put("nonce", {"n": "a"})
        guard = ("nonce", {"n": "b"})
        assert not swaps.replace("sync/1", {"epoch": 2}, second, guard=guard)  # guard alone
        assert swaps.get("sync/1") == ({"epoch": 2}, second)  # nothing written by the refusals
    finally:
        swaps.close()


def test_also_writes_are_atomic_with_the_create(etcd: Etcd) -> None:
    lease = etcd.grant(5)
    also = [("map", {"primary": "a"}), ("epoch/0", {"n": 1}, lease)]
    assert etcd.create("primary/0", {"server": "a"}, lease, also=also)
    found, _ = etcd.get_prefix("")
    assert set(found) == {"primary/0", "map", "epoch/0"}
    assert len({revision for _, revision in found.values()}) == 1  # one transaction

    etcd.delete("map")
    assert not etcd.create("primary/0", {"server": "b"}, also=[("map", {"primary": "b"})])
    assert etcd.get("map") == (None, 0)  # the create failed, so nothing of it was written
    assert not etcd.replace("primary/0", {}, 1, also=[("map", {})])
    assert etcd.get("map") == (None, 0)

    etcd.revoke(lease)
    assert etcd.get("epoch/0") == (None, 0)  # an also write took its own lease
    with pytest.raises(HogwildError, match="twice"):
        etcd.create("x", {}, also=[("x", {})])


def test_keys_are_relative_to_the_job_prefix(etcd_server: EtcdProcess, etcd: Etcd) -> None:
    other = Etcd(etcd_server.address, prefix=etcd.prefix.rstrip("/") + "-other/")
    other.put("map", {"job": "other"})
    etcd.put("map", {"job": "this"})
    etcd.put("primary/1", {"server": "b"})
    etcd.put("primary/0", {"server": "a"})
    found, revision = etcd.get_prefix("primary/")
    assert {key: value for key, (value, _) in found.items()} == {
        "primary/0": {"server": "a"},
        "primary/1": {"server": "b"},
    }
    assert revision >= max(rev for _, rev in found.values())
    assert etcd.get("map")[0] == {"job": "this"} and other.get("map")[0] == {"job": "other"}
    assert etcd.get("absent") == (None, 0)
    other.close()


# -- the watch ----------------------------------------------------------------------------


def test_watch_reports_changes_and_cancels_promptly(etcd: Etcd) -> None:
    calls = []
    changed = threading.Event()

    def on_change() -> None:
        calls.append(time.monotonic())
        changed.set()

    handle = etcd.watch("primary/", on_change)
    etcd.put("map", {"outside": "the watched prefix"})
    time.sleep(0.3)
    assert not calls

    etcd.put("primary/0", {"server": "a"})
    assert changed.wait(WAIT_S)
    changed.clear()
    etcd.delete("primary/0")
    assert changed.wait(WAIT_S)

    started = time.monotonic()
    handle.cancel()
    assert time.monotonic() - started < WAIT_S and not handle.active
    count = len(calls)
    etcd.put("primary/0", {"server": "b"})
    time.sleep(0.3)
    assert len(calls) == count


def test_watch_sees_a_write_to_any_key_not_only_the_newest(etcd: Etcd) -> None:
    etcd.put("primary/1", {"server": "b"})
    etcd.put("primary/0", {"server": "a"})  # the newest, and the first in key order
    changed = threading.Event()
    handle = etcd.watch("primary/", changed.set)
    time.sleep(0.3)
    assert not changed.is_set()
    etcd.put("primary/1", {"server": "c"})
    assert changed.wait(WAIT_S)
    handle.cancel()


def test_watch_from_a_revision_sees_changes_made_before_it_started(etcd: Etcd) -> None:
    _, revision = etcd.get_prefix("primary/")
    etcd.put("primary/0", {"server": "a"})  # after the read, before the watch
    changed = threading.Event()
    handle = etcd.watch("primary/", changed.set, revision=revision)
    assert changed.wait(WAIT_S)
    handle.cancel()


def test_watch_can_be_cancelled_from_its_callback(etcd: Etcd) -> None:
    handles, done = [], threading.Event()

    def on_change() -> None:
        handles[0].cancel()
        done.set()

    handles.append(etcd.watch("", on_change))
    etcd.put("k", {})
    assert done.wait(WAIT_S)
    assert wait_for(lambda: not handles[0].active)


def test_watch_reports_a_lost_etcd(etcd_server: EtcdProcess, etcd: Etcd) -> None:
    errors = []
    handle = etcd.watch("", lambda: None, on_error=errors.append)
    etcd_server.stop()
    assert wait_for(lambda: errors)
    assert isinstance(errors[0], EtcdUnavailable) and etcd.address in str(errors[0])
    handle.cancel()


# -- typed failures -----------------------------------------------------------------------


def test_an_unreachable_address_raises_etcd_unavailable_naming_it() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    client = Etcd(address, prefix="/t/", timeout_s=1.0)
    calls = (
        lambda: client.get("k"),
        lambda: client.put("k", {}),
        lambda: client.grant(1),
        lambda: client.watch("", lambda: None),
    )
    for call in calls:
        with pytest.raises(EtcdUnavailable, match=address):
            call()
    client.close()


def test_a_value_that_is_not_a_json_object_names_its_key(etcd: Etcd) -> None:
    raw_put(etcd, "bad", b"not json {")
    with pytest.raises(HogwildError, match=f"{etcd.prefix}bad.*not JSON"):
        etcd.get("bad")
    with pytest.raises(HogwildError, match=f"{etcd.prefix}bad"):
        etcd.get_prefix("")
    raw_put(etcd, "list", b"[1, 2]")
    with pytest.raises(HogwildError, match=f"{etcd.prefix}list.*not a JSON object"):
        etcd.get("list")
    with pytest.raises(HogwildError, match=f"{etcd.prefix}put.*not a JSON object"):
        etcd.put("put", [1, 2])
    with pytest.raises(HogwildError, match=f"{etcd.prefix}nan.*not a JSON object"):
        etcd.put("nan", {"x": float("nan")})
    with pytest.raises(HogwildError, match="expected a whole number"):
        etcd.grant(0)
