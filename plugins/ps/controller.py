"""A replicated job's controller as the cluster driver holds it: an etcd, given or started.

Registered as the ``etcd`` controller (entry point ``hogwild.controllers``;
:class:`hogwild.cluster.services.Controller`). With ``cluster.copies > 1`` the parameter servers
keep their bucket map and leases in etcd (:mod:`hogwild_plugins.ps.failover`); the driver needs
only three things of it: where it is, the shortest lease it honours, and, when a server dies, that
server's lease ended at once so that its buckets fail over without waiting for it to lapse.

What it starts: ``cluster.etcd`` empty, one etcd on loopback; ``cluster.etcd = "job"``, the job's
own etcd cluster of three members on loopback (:class:`~.etcd_process.EtcdCluster`), which goes
on serving when one member is lost (the roles' clients fail over between the members), or, where
the launcher starts them on its nodes (``start_members``), one member per node: their traffic
then leaves the node, and unless ``cluster.etcd_tls`` names the user's certificates it is TLS
with certificates the job makes (``tls`` = ``"job"``, :mod:`~hogwild_plugins.ps.etcd_ca`), which
:attr:`EtcdController.tls` says for the roles' config.

Ownership: an etcd started here (its data in a directory of its own) is stopped by
:meth:`EtcdController.close`, data and all, and dies with the driver if the driver is killed
(a SIGKILLed driver's data directories are swept by the next start); an etcd the job was given is
someone else's, so :meth:`~EtcdController.close` deletes every key of the job instead. Either way
an earlier run's keys are deleted when the controller opens: they would name primaries that are
gone.

One driver per job: the controller first claims the job's ``driver`` key under a lease of its
own, kept alive by a thread until :meth:`~EtcdController.close`. A second driver of the same job
name on a shared etcd finds the key held and is refused (clearing the map under a running job
would make its servers stop every bucket); a driver that died leaves the key for one lease.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

from hogwild_plugins.ps.etcd import Etcd, parse_endpoints
from hogwild_plugins.ps.etcd_process import ELECTION_MS, EtcdCluster, EtcdProcess
from hogwild_plugins.ps.etcd_tls import JOB as JOB_TLS
from hogwild_plugins.ps.etcd_tls import drop_etcd_tls
from hogwild_plugins.ps.failover import (
    REVOKED_PREFIX,
    REVOKED_TTLS,
    marker_lease_s,
    marker_life,
    merged_leases,
)
from hogwild_plugins.ps.routes import etcd_prefix

from hogwild.config.checks import MAX_LEASE_S
from hogwild.errors import ConfigError, HogwildError
from hogwild.net.address import is_loopback, parse_address

__all__ = ["GIVEN_ETCD_LEASE_S", "JOB_ETCD", "JOB_ETCD_MEMBERS", "EtcdController"]

GIVEN_ETCD_LEASE_S = 2  # seconds: the auto lease with an etcd whose timers are not ours
DRIVER_KEY = "driver"  # held, under the driver's lease, while a driver runs the job
JOB_ETCD = "job"  # cluster.etcd: start the job's own etcd cluster
JOB_ETCD_MEMBERS = 3  # the fewest that survive losing one


def revoke_marked(etcd: Etcd, index: int, lease: int, lease_s: object) -> None:
    """End server ``index``'s ``lease`` early, as :meth:`JobEtcd.forget_server` does for a server
    whose process may still run, with a ``revoked/<index>`` marker that lives from before the
    revoke until at least ``REVOKED_TTLS`` of the holder's TTLs (``lease_s``) after it,
    however long etcd takes to apply it.

    The argument (``docs/guarantees.md``, "reads after a revoke"), clocks at equal rates: the
    marker's lease is granted for ``REVOKED_TTLS * ttl + 2 * timeout`` seconds, counted by etcd
    from after ``sent`` (the driver's clock just before the grant), and the marker is put.

    * The revoke is sent only while ``now - sent <= REVOKED_TTLS * ttl``: its answer and the
      renewal after it each come within ``timeout`` of their sending, so both are applied
      while the marker lives. Later than that, no revoke: the lease lapses by itself (its
      holder's clock gave up before etcd's TTL), which needs no marker.
    * Once the revoke is answered, etcd applied it (at some V before the answer). The marker's
      lease is then renewed: applied after V, and answered with time left only while the
      lease still lived, so the marker is there without a gap from before the revoke until
      ``REVOKED_TTLS * ttl`` and more after V. The holder's last renewal came before V, so it
      answers reads until at most V + 3/4 TTL by its clock.
    * A live marker of an earlier revoke of ``index`` (an incarnation before, which may still
      answer on its own TTL) is replaced only by a transaction on its revision, naming the
      longer of the two TTLs and under a lease granted now for it: never a shorter TTL, never
      an earlier end. It names the earlier marker's leases too (``leases``,
      :func:`~.failover.merged_leases`): a process that held one of them must still find it.
      Over a marker that names no TTL nothing is revoked (lapsing is safe).
    * A renewal that finds the marker gone, or a revoke whose answer was lost (etcd may apply
      it later), raises: the first cannot happen while each request keeps its ``timeout``;
      for the second the marker is renewed first, so that it covers a revoke applied up to its
      full life after the driver gave up.

    Raises:
        HogwildError: ``lease_s``, or a live marker's of ``index``, is not a whole number of
            seconds from 1 to ``MAX_LEASE_S`` (the lease is left to lapse by itself, which is
            safe), etcd failed, or the marker ran out.
    """
    if marker_lease_s({"lease_s": lease_s}) is None:
        raise HogwildError(
            f"server {index}'s member record has lease_s {lease_s!r}: expected whole seconds "
            f"from 1 to {MAX_LEASE_S} to size its revoked marker; its lease is left to lapse by "
            "itself"
        )
    key = f"{REVOKED_PREFIX}{index}"
    # a live marker of an earlier revoke of this index (an earlier incarnation, which may still
    # answer on its own TTL): never put a shorter TTL over it, nor an earlier end
    earlier, revision = etcd.get(key)
    cover = lease_s
    if earlier is not None:
        earlier_s = marker_lease_s(earlier)
        if earlier_s is None:  # none, or past MAX_LEASE_S: no driver's, and no lease to grant
            raise HogwildError(
                f"etcd key {key} holds a revoked marker naming no TTL of whole seconds from 1 "
                f"to {MAX_LEASE_S} ({earlier!r}): server {index}'s lease is left to lapse by "
                "itself rather than shorten its cover"
            )
        cover = max(cover, earlier_s)
    # granted from now for the longer TTL: it ends after the earlier marker's lease (granted
    # before, for at most as long with the same request timeout)
    life = marker_life(cover, etcd.timeout_s)
    value = {"lease": lease, "leases": merged_leases(earlier, lease), "lease_s": cover}
    sent = time.monotonic()  # the marker's cover counts from its grant: nothing slow after it
    marker = etcd.grant(life)
    if not etcd.replace(key, value, revision, lease=marker):
        etcd.revoke(marker)
        raise HogwildError(
            f"etcd key {key} changed while server {index}'s lease was being revoked (another "
            "driver of the job?): its lease is left to lapse by itself"
        )
    if time.monotonic() - sent > REVOKED_TTLS * lease_s:
        return  # too late to revoke within the marker's cover: the lease lapses by itself
    try:
        etcd.revoke(lease)
    except HogwildError:
        etcd.keepalive(marker)  # cover a revoke that etcd applies after all, from now on
        raise
    if etcd.keepalive(marker) == 0:
        raise HogwildError(
            f"server {index}'s revoked marker ran out before its lease's revoke was confirmed "
            f"(etcd at {etcd.address} slower than {etcd.timeout_s} s a request): a takeover "
            "may have answered reads while the revoked server still did"
        )


class EtcdController:
    """The controller of job ``job`` (see the module docstring); an ``OpenController``.

    Args:
        address: ``cluster.etcd``: ``HOST:PORT`` of an etcd (or ``HOST:PORT,...`` of an etcd
            cluster's members), empty to start one etcd, ``"job"`` to start an etcd cluster.
        job: The job's name (its keys live under :func:`~.routes.etcd_prefix`).
        say: Where to tell the user about an etcd started for the job.
        tls: ``cluster.etcd_tls``: a directory of etcd certificates; HTTPS to the etcd given,
            and an etcd started here serves HTTPS with the directory's server certificate.
            ``"job"`` (the default where the launcher starts the members): certificates the
            job makes, only for the members the launcher starts.
        start_members: With ``"job"``: the launcher's way to start the members on its nodes
            (``start_members(count, tls)``: started, with ``address``, ``min_ttl_s`` and
            ``stop``; ``election_ms=`` too where one is given); None: on this host's loopback.
        election_ms: The election timeout of every etcd member started here or by
            ``start_members`` (``cluster.etcd_election_ms``); 0: :data:`ELECTION_MS`. Their
            shortest lease, 1.5 of it (1 s at least), is what they must honour.
    """

    def __init__(
        self, address: str, job: str, say: Callable[[str], None], tls: str | None = None,
        start_members: Callable | None = None, election_ms: int = 0,
    ) -> None:  # fmt: skip
        self.prefix, self.tls = etcd_prefix(job), tls or None
        timers = {"election_ms": election_ms or ELECTION_MS}  # the members' started here
        timers["lease_floor_s"] = max(1.0, timers["election_ms"] * 1.5 / 1000)
        chosen = {"election_ms": election_ms} if election_ms else {}  # the launcher's members
        self.process: EtcdProcess | EtcdCluster | None = None
        on_nodes = address.strip() == JOB_ETCD and start_members is not None
        if self.tls == JOB_TLS and not on_nodes:
            raise ConfigError(
                'cluster.etcd_tls = "job": the job makes certificates only for the etcd cluster '
                'it starts on the launcher\'s nodes (cluster.etcd = "job" with cluster.launcher '
                f'= "ray"), not for cluster.etcd = {address!r}; give cluster.etcd_tls = DIR of '
                "certificates that etcd trusts, or leave it empty"
            )
        if on_nodes:  # beyond this node: TLS, with the job's certificates unless given some
            self.tls = self.tls or JOB_TLS
            self.process = start_members(JOB_ETCD_MEMBERS, self.tls, **chosen)
            address = self.process.address
            how = "certificates made by the job" if self.tls == JOB_TLS else self.tls
            say(
                f"hogwild cluster: an etcd cluster of {JOB_ETCD_MEMBERS} members, one per node, "
                f"for the servers' copies on {address} (TLS with client certificates: {how})"
            )
        elif address.strip() == JOB_ETCD:
            # each member's data its own, removed with it
            self.process = EtcdCluster(JOB_ETCD_MEMBERS, tls=self.tls, **timers)
            address = self.process.start()
            say(
                f"hogwild cluster: an etcd cluster of {JOB_ETCD_MEMBERS} members for the "
                f"servers' copies on {address}"
            )
        elif not address:
            # its data in a directory of its own, removed with it
            self.process = EtcdProcess(tls=self.tls, **timers)
            address = self.process.start()
            say(f"hogwild cluster: etcd for the servers' copies on {address}")
        beyond = [m for m in parse_endpoints(address) if not is_loopback(parse_address(m))]
        if beyond and not self.tls:
            say(
                f"hogwild cluster: etcd {address} is beyond loopback and cluster.etcd_tls is not "
                "set: its traffic (bucket map, leases) is plain HTTP; keep it on a private network"
            )
        self.address, self.job = address, job
        self.min_lease_s = self.process.min_ttl_s if self.process else GIVEN_ETCD_LEASE_S
        self._etcd: Etcd | None = None
        self._lease = 0
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        try:
            self._claim()
            self._clear()  # an earlier run's map would name primaries that are gone
        except BaseException:
            if self.process is not None:  # ours: nobody else would stop it
                self.close()
            else:
                self._release()
            raise

    def forget_server(self, index: int, group: int | None = None, lost: bool = True) -> None:
        """End server ``index``'s lease now (its buckets fail over at once); with ``group``, the
        server ``index`` of that server group (a job of several, each in its own namespace).

        ``lost``: its process may still run (a node or actor lost, with no exit seen): it may
        answer reads by its own lease clock for up to a TTL after the revoke, so
        ``revoked/<index>`` is written first and kept past the revoke (see
        :func:`revoke_marked`), and the takeovers that read it wait the revoked holder's TTL
        (its ``lease_s``, which the marker names) before they answer reads. A process seen to
        exit answers nothing: its lease ends with no marker, and no takeover waits."""
        prefix = self.prefix if group is None else etcd_prefix(self.job, group)
        with Etcd(self.address, prefix=prefix, tls=self.tls) as etcd:
            value, _ = etcd.get(f"members/{index}")
            if value is not None and isinstance(value.get("lease"), int):
                if lost:
                    revoke_marked(etcd, index, value["lease"], value.get("lease_s"))
                else:
                    etcd.revoke(value["lease"])

    def close(self) -> None:
        """Stop the etcd (or etcd cluster) started for the job, or delete the job's keys from
        the one given; either way give the job's ``driver`` key back. With the job's own
        certificates (``tls`` = ``"job"``), the driver's is removed and forgotten last: its
        key served the job alone."""
        try:
            if self.process is None and self._etcd is not None:
                self._clear()
        finally:
            try:
                self._release()  # while the etcd started here still runs
                if self.process is not None:
                    process, self.process = self.process, None
                    process.stop()
            finally:
                if self.tls == JOB_TLS:
                    drop_etcd_tls()

    def _claim(self) -> None:
        """Hold the job's ``driver`` key under a lease of this controller's (see the module
        docstring); wait one lease for a driver that died to lose it.

        Raises:
            HogwildError: Another driver of this job holds it.
        """
        ttl = max(GIVEN_ETCD_LEASE_S, int(-(-self.min_lease_s // 1)))
        self._etcd = Etcd(self.address, prefix=self.prefix, tls=self.tls)
        self._lease = self._etcd.grant(ttl)
        me = {"host": socket.gethostname(), "pid": os.getpid()}
        deadline = time.monotonic() + ttl + 1
        while not self._etcd.create(DRIVER_KEY, me, lease=self._lease):
            holder, _ = self._etcd.get(DRIVER_KEY)
            if time.monotonic() > deadline:
                raise HogwildError(
                    f"job {self.job!r}: another driver holds its keys on etcd {self.address} "
                    f"({holder}); two drivers of one job would clear each other's bucket map: "
                    "give this one another job name"
                )
            time.sleep(0.2)
        self._keeper = threading.Thread(
            target=self._keep, args=(ttl,), name="hogwild-driver-lease", daemon=True
        )
        self._keeper.start()

    def _keep(self, ttl: int) -> None:
        while not self._stop.wait(ttl / 4):
            try:
                self._etcd.keepalive(self._lease)
            except HogwildError:
                pass  # etcd away: the key lapses, a second driver could take it; retried

    def _release(self) -> None:
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout=10)
            self._keeper = None
        if self._etcd is not None:
            etcd, self._etcd = self._etcd, None
            try:
                if self._lease:
                    etcd.revoke(self._lease)
            except HogwildError:
                pass  # etcd gone with the process started here: nothing left to give back
            etcd.close()

    def _clear(self) -> None:
        """Delete every etcd key of this job (its bucket map and members), but the driver's."""
        with Etcd(self.address, prefix=self.prefix, tls=self.tls) as etcd:
            for key in etcd.get_prefix("")[0]:
                if key != DRIVER_KEY:
                    etcd.delete(key)
