"""One driver per job on a shared etcd (plugins/ps/controller.py), against a real etcd: a second
driver with the same job name is refused (it would clear the running job's bucket map), another
job name is not, and a driver's key is given back when it closes. With several server groups,
each group's keys live in a namespace of its own under the job's: the driver ends a lease in
the group it names, and clears every group's keys when it closes. A server whose lease the
driver ended stops on its next read of the map, whatever lease it holds by then."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
import uuid
from types import SimpleNamespace

import hogwild_plugins.ps.controller as controller_module
import pytest
from hogwild_plugins.ps.controller import DRIVER_KEY, EtcdController, revoke_marked
from hogwild_plugins.ps.etcd import Etcd
from hogwild_plugins.ps.replication import map_reads
from hogwild_plugins.ps.replication.map_reads import EtcdMap
from hogwild_plugins.ps.replication.marks import BucketMarks
from hogwild_plugins.ps.routes import etcd_prefix

from hogwild.cluster.servers import JobServers
from hogwild.errors import HogwildError

pytestmark = pytest.mark.ps_kernels


def test_a_second_driver_of_a_job_is_refused_and_its_keys_kept(etcd_server):
    job = f"job-{uuid.uuid4().hex[:8]}"
    first = EtcdController(etcd_server.address, job, print)
    try:
        with Etcd(etcd_server.address, prefix=etcd_prefix(job)) as etcd:
            etcd.put("sync/0", {"epoch": 3})  # the running job's map
            with pytest.raises(HogwildError, match=f"job '{job}': another driver holds"):
                EtcdController(etcd_server.address, job, print)
            assert etcd.get("sync/0")[0] == {"epoch": 3}  # not cleared by the refused one
            other = EtcdController(etcd_server.address, job + "-b", print)  # another name
            other.close()
    finally:
        first.close()
    with Etcd(etcd_server.address, prefix=etcd_prefix(job)) as etcd:
        assert etcd.get(DRIVER_KEY)[0] is None and etcd.get("sync/0")[0] is None
    EtcdController(etcd_server.address, job, print).close()  # free again


def test_each_server_group_keeps_its_keys_in_its_own_namespace(etcd_server):
    """Several server groups each number their servers from 0: ``members/0`` of group 0 and of
    group 1 are two keys. The driver ends the lease of the server it names in the group it
    names only, and closing clears every group's keys."""
    job = f"job-{uuid.uuid4().hex[:8]}"
    prefixes = [etcd_prefix(job, g) for g in (0, 1, 10)]
    assert not any(a != b and b.startswith(a) for a in prefixes for b in prefixes)  # apart
    assert all(p.startswith(etcd_prefix(job)) for p in prefixes)  # below the job's own keys
    controller = EtcdController(etcd_server.address, job, print)
    servers = JobServers(job)  # the driver's side: job-wide indices, group after group
    servers.controller, servers.per_group = controller, 2
    groups = [Etcd(etcd_server.address, prefix=p) for p in prefixes[:2]]
    leases = []
    try:
        for g, etcd in enumerate(groups):
            for i in range(2):
                leases.append((etcd, etcd.grant(30)))
                address = f"127.0.0.1:{7000 + 2 * g + i}"
                record = {"address": address, "lease": leases[-1][1], "lease_s": 30}
                etcd.put(f"members/{i}", record, leases[-1][1])
            etcd.put("sync/0", {"epoch": g + 1, "primary": 0})
        servers.forget_server(3)  # the job's server 3 died: group 1's server 1
        assert groups[1].get("members/1")[0] is None  # its lease ended
        # (lost by default: its end is marked first, in its group, for takeovers to wait)
        lease = leases[3][1]
        marker = {"lease": lease, "leases": [lease], "lease_s": 30}
        assert groups[1].get("revoked/1")[0] == marker
        alive = {(g, i) for g in (0, 1) for i in (0, 1) if groups[g].get(f"members/{i}")[0]}
        assert alive == {(0, 0), (0, 1), (1, 0)}  # no other group's, no other index's
        # and by group and index, as the driver calls it; seen to exit: no marker
        controller.forget_server(0, group=1, lost=False)
        assert groups[1].get("members/0")[0] is None and groups[1].get("revoked/0")[0] is None
        assert groups[0].get("members/0")[0]["address"] == "127.0.0.1:7000"  # not group 0's
        assert [etcd.get("sync/0")[0]["epoch"] for etcd in groups] == [1, 2]
    finally:
        for etcd, lease in leases:  # the shared etcd keeps no lease of this test's
            with contextlib.suppress(HogwildError):
                etcd.revoke(lease)
        controller.close()
    try:
        for etcd in groups:  # the job's keys, every group's, deleted with its driver
            assert etcd.get_prefix("")[0] == {}
    finally:
        for etcd in groups:
            etcd.close()
    with pytest.raises(HogwildError, match="server group -1: expected an integer >= 0"):
        etcd_prefix(job, -1)


class SlowRevoke(Etcd):
    """A real etcd client whose revoke is slow to come back, as in an fsync stall: etcd applies
    it at once, the answer arrives ``delay_s`` later."""

    delay_s = 0.0

    def revoke(self, lease: int) -> None:
        super().revoke(lease)
        time.sleep(self.delay_s)


def test_a_revoked_marker_outlives_a_slow_revoke_and_a_late_revoke_is_skipped(
    etcd_server, monkeypatch
):
    """Review I1: the ``revoked/<i>`` marker must cover the revoked holder's last answer,
    which comes up to a TTL after etcd applied the revoke, however long the revoke took. A
    marker timed from its grant (``REVOKED_TTLS`` TTLs) is gone when a successor reads it
    just after a revoke that took longer than that. And a revoke the driver could no longer
    send within the marker's cover is not sent: the lease lapses by itself."""
    with SlowRevoke(etcd_server.address, prefix=f"/hogwild/test-{uuid.uuid4().hex[:8]}/") as etcd:
        holder = etcd.grant(1)
        etcd.put("members/0", {"lease": holder, "lease_s": 1}, holder)
        etcd.delay_s = 2.2  # past the holder's 2 TTLs from the marker's grant
        granted = time.monotonic()
        revoke_marked(etcd, 0, holder, 1)
        assert time.monotonic() - granted >= 2.2
        assert etcd.get("members/0")[0] is None  # revoked, and the marker still there
        assert etcd.get("revoked/0")[0] == {"lease": holder, "leases": [holder], "lease_s": 1}

        etcd.delay_s = 0.0
        holder = etcd.grant(5)
        etcd.put("members/1", {"lease": holder, "lease_s": 5}, holder)
        clock = iter([0.0, 10.1])  # the grant and put took past 2 TTLs of the holder's
        monkeypatch.setattr(controller_module, "time", SimpleNamespace(monotonic=clock.__next__))
        revoke_marked(etcd, 1, holder, 5)
        monkeypatch.undo()
        assert etcd.get("members/1")[0] is not None  # not revoked: left to lapse
        etcd.revoke(holder)
        with pytest.raises(HogwildError, match="server 2's member record has lease_s None"):
            revoke_marked(etcd, 2, holder, None)


def test_a_real_map_read_waits_the_longest_marker_and_no_marker_is_shortened(etcd, caplog):
    """Review M's M2, M5 and M1 on the real server's path, against a real etcd: markers the
    driver writes (``revoke_marked``) reach a server's read of the map (``EtcdMap.read``) as
    the longest TTL they name; a second revoke of an index whose new incarnation runs a
    shorter TTL keeps the longer one (the first holder may still answer on it); a marker
    naming no TTL gives an unbounded wait, logged once naming its key, instead of failing
    every read of the map, and the driver revokes nothing over it."""
    n_servers, n_buckets = 4, 2
    view_of = EtcdMap(n_servers, n_buckets, {}, threading.Lock(), BucketMarks(None, n_buckets))
    view_of.start(etcd)
    assert view_of.read(etcd)[0].revoked_ttl == 0.0
    revoke_marked(etcd, 1, etcd.grant(2), 2)
    first = etcd.grant(9)
    revoke_marked(etcd, 2, first, 9)
    assert view_of.read(etcd)[0].revoked_ttl == 9.0
    revoke_marked(etcd, 2, etcd.grant(2), 2)  # server 2 again, restarted with --lease-s 2
    assert etcd.get("revoked/2")[0]["lease_s"] == 9
    assert view_of.read(etcd)[0].revoked_ttl == 9.0
    # both incarnations of server 2 are replaced (each stops): the second revoke's marker names
    # the first's lease too (review S, risk 1: the first, back from a cut, must still find it);
    # a process holding neither (a third incarnation) is not, nor server 1 holding either
    second = etcd.get("revoked/2")[0]["lease"]
    assert etcd.get("revoked/2")[0]["leases"] == [first, second]
    assert view_of.read(etcd, 2, [second])[0].replaced == second
    assert view_of.read(etcd, 2, [first])[0].replaced == first
    assert view_of.read(etcd, 2, [etcd.grant(2)])[0].replaced is None
    assert view_of.read(etcd, 1, [first, second])[0].replaced is None

    etcd.put("revoked/3", {"lease": 1})  # an older driver's marker, or one written by hand
    etcd.put("revoked/7", {"lease": 1})  # no server of this job: not counted
    with caplog.at_level(logging.WARNING, logger=map_reads.__name__):
        views = [view_of.read(etcd)[0] for _ in range(2)]
    assert [v.revoked_ttl for v in views] == [math.inf, math.inf]
    logged = [r.getMessage() for r in caplog.records if r.name == map_reads.__name__]
    assert len(logged) == 1 and "etcd key revoked/3" in logged[0]
    holder = etcd.grant(2)
    with pytest.raises(HogwildError, match="revoked/3 holds a revoked marker naming no TTL"):
        revoke_marked(etcd, 3, holder, 2)
    assert etcd.get("revoked/3")[0] == {"lease": 1}
    etcd.delete("revoked/3")
    assert view_of.read(etcd)[0].revoked_ttl == 9.0


def test_a_server_whose_lease_the_driver_ended_stops_even_after_registering_again(etcd_server):
    """Review S, risk 2: the wiring, real parts on a real etcd. A replicated server (the real
    adapter on an unstarted real server) registers (``Membership.register``, as its start
    does); the driver counts it lost and ends that lease (``forget_server``, marker first);
    the process, paused meanwhile, finds its lease gone and registers again under a new one
    (as its heartbeat does). Its next read of the map (``Replication._observe``) must still
    stop it: the membership kept the first lease and the adapter hands those to the read."""
    from hogwild_plugins.ps.layout import ModelGeometry
    from hogwild_plugins.ps.replication import Replication
    from hogwild_plugins.ps.replication.membership import HELD_LEASES, Membership
    from hogwild_plugins.ps.serving.options import ServerOptions
    from hogwild_plugins.ps.serving.server import ParameterServer

    job = f"job-{uuid.uuid4().hex[:8]}"
    options = ServerOptions(
        job=job, servers=("127.0.0.1:1", "127.0.0.1:2"), index=0, copies=2,
        etcd=etcd_server.address, lease_s=2,
    )  # fmt: skip
    replication = Replication(ParameterServer(ModelGeometry(600), options), options.etcd, 2, 2)
    driver = EtcdController(etcd_server.address, job, print)
    etcd = Etcd(etcd_server.address, prefix=etcd_prefix(job))
    try:
        replication._etcd = etcd
        replication.map.start(etcd)
        replication.membership = Membership(etcd, 0, "127.0.0.1:1", 2, lambda: None, list)
        replication.membership.register()
        first = replication.membership.clock.lease
        driver.forget_server(0)  # lost: revoked/0 names the lease, which is revoked
        assert etcd.get("members/0")[0] is None
        replication.membership.register()  # back from the pause: a new lease, registered
        assert replication.membership.clock.lease != first
        assert etcd.get("members/0")[0]["lease"] == replication.membership.clock.lease
        replication._observe()
        assert replication.failure is not None
        assert f"lease {first:#x} early (etcd key revoked/0)" in replication.failure
        for _ in range(HELD_LEASES):  # review S, nit 7: the last leases only, the current one too
            replication.membership.register()
        held = replication.membership.held
        assert len(held) == HELD_LEASES and first not in held
        assert held[-1] == replication.membership.clock.lease
    finally:
        replication.membership.revoke()
        etcd.close()
        driver.close()


def test_the_etcd_election_timeout_of_the_config_reaches_every_member_hogwild_starts():
    """``cluster.etcd_election_ms`` from the job's config through the driver's controller to
    the etcd it starts (its flags: the election timeout and a tenth of it as the heartbeat,
    leases of 1.5 of it the shortest, what an auto ``ps.lease_s`` becomes), and to the
    launcher's way of starting the job's members, as a keyword given only when set."""
    import psutil
    from hogwild_plugins.ps.etcd_process import ELECTION_MS

    from hogwild.config import config_from_dict
    from hogwild.config.checks import DEFAULT_ELECTION_MS
    from tests.config_cases import small

    assert DEFAULT_ELECTION_MS == ELECTION_MS  # the engine's copy of the plugin's default
    cluster = {"copies": 2, "ps": 2, "etcd_election_ms": 700}
    config = config_from_dict(small(cluster=cluster))  # ps.lease_s auto: etcd's shortest
    servers = JobServers(f"job-{uuid.uuid4().hex[:8]}")
    try:
        started = servers.with_controller(config, lambda said: None)
        flags = psutil.Process(servers.controller.process.process.pid).cmdline()
        assert "--election-timeout=700" in flags and "--heartbeat-interval=70" in flags
        assert started.ps.lease_s == 2  # 1.5 election timeouts: 1.05 s, whole seconds
    finally:
        if servers.controller is not None:
            servers.controller.close()
    asked = []

    def start_members(count, tls, **timers):  # the launcher's, refusing to start here
        asked.append(timers)
        raise HogwildError("the test's launcher starts nothing")

    for election_ms, given in ((300, {"election_ms": 300}), (0, {})):
        with pytest.raises(HogwildError, match="starts nothing"):
            EtcdController("job", "timers", print, start_members=start_members,
                           election_ms=election_ms)  # fmt: skip
        assert asked.pop() == given  # none where unset: a launcher without the keyword works


@pytest.mark.parametrize(("election_ms", "first_timeout_s"), [(0, 0.4), (300, 0.6), (1000, 2 / 3)])
def test_a_replicated_servers_map_writes_first_timeout_follows_the_jobs_election_timeout(
    etcd_server, election_ms, first_timeout_s
):
    """A map write forwarded to a lost leader is read back after two election timeouts
    (``etcd_cas.write_retry_s``), at most a third of the map clients' 2 s (the read-back's two
    asks must fit): the job's ``cluster.etcd_election_ms`` where it set one (through
    ``ServerOptions.from_config``, as ``hogwild ps serve --config`` builds them), else
    hogwild's own 200 ms. A started replicated server's map clients, on a real etcd."""
    from hogwild_plugins.ps.layout import ModelGeometry
    from hogwild_plugins.ps.serving.launch import local_server
    from hogwild_plugins.ps.serving.options import ServerOptions

    from hogwild.config import load_config

    config = load_config(overrides={"cluster.etcd_election_ms": election_ms})
    options = ServerOptions.from_config(
        config, job=f"job-{uuid.uuid4().hex[:8]}", servers=("127.0.0.1:0", "127.0.0.1:1"),
        copies=2, etcd=etcd_server.address, lease_s=2,
    )  # fmt: skip
    assert options.etcd_election_ms == election_ms
    fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(ServerOptions)}
    del fields["job"]
    with local_server(ModelGeometry(600), job=options.job, **fields) as server:
        replication = server.replication
        for client in (replication._etcd, replication._net_etcd):
            assert client.write_retry_s == pytest.approx(first_timeout_s)
            assert client.timeout_s == 2.0


def test_server_options_refuse_an_election_timeout_etcd_cannot_run_with():
    from hogwild_plugins.ps.serving.options import ServerOptions

    for wrong in (5, 5_001, -1, 200.0, True):
        options = ServerOptions(job="j", servers=("127.0.0.1:1",), etcd_election_ms=wrong)
        with pytest.raises(HogwildError, match=r"cluster\.etcd_election_ms.*got"):
            options.check()
