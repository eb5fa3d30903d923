"""The job's own etcd on Ray as the launcher starts it: its members and its certificates.

``cluster.etcd = "job"``: :class:`JobEtcd` (a part of
:class:`~hogwild_plugins.ray.launcher.RayLauncher`) starts the members
(:class:`~hogwild_plugins.ray.etcd_members.RayEtcdCluster`, one per node) and, unless
``cluster.etcd_tls`` names the user's certificates, makes the job's etcd CA
(:class:`~hogwild_plugins.ps.etcd_ca.JobCA`, its key in the driver's memory alone) and signs
each etcd client role's request, made by the role's actor on its node (no private key travels).
"""

from __future__ import annotations

import os
from pathlib import Path

from hogwild_plugins.ps.etcd_ca import JobCA
from hogwild_plugins.ps.etcd_tls import JOB, drop_etcd_tls, use_etcd_tls

from hogwild.cluster.identities import PRIVATE  # the driver's own keys in the run directory

__all__ = ["JobEtcd"]


class JobEtcd:
    """The job's etcd members and CA (``etcd_members``, ``etcd_ca``; see the module docstring)."""

    def start_etcd_cluster(self, count: int, tls: str | None, election_ms: int = 0):
        """The job's own etcd cluster (``cluster.etcd = "job"``): ``count`` members, one per
        node (:mod:`~hogwild_plugins.ray.etcd_members`), started; stopped by :meth:`stop_all`
        (or by its ``stop``). It has ``address``, ``min_ttl_s`` and ``stop``. ``tls``:
        ``"job"``, certificates the job makes (the module docstring), or the user's directory.
        ``election_ms``: the members' election timeout (``cluster.etcd_election_ms``; 0:
        :data:`~hogwild_plugins.ps.etcd_process.ELECTION_MS`).
        """
        from hogwild_plugins.ray.etcd_members import RayEtcdCluster

        try:
            if tls == JOB:
                self.etcd_ca = JobCA.make()
                driver = Path(self.run_dir) / PRIVATE / "etcd-driver"
                use_etcd_tls(self.etcd_ca.client_directory(driver, "driver").directory)
            members = RayEtcdCluster(count, tls=tls, timeout_s=self.cluster.start_timeout_s,
                                     prefix=f"hogwild-{os.getpid()}", ca=self.etcd_ca,
                                     election_ms=election_ms)  # fmt: skip
            self.etcd_members = members
            members.start()
        except BaseException:
            # no controller is made, so none closes: the driver's key goes here, and a later
            # "job" in this process finds none rather than a dead CA's
            if tls == JOB:
                drop_etcd_tls()
            raise
        return members

    def _certify(self, roles: list) -> None:
        """Each role's etcd client key made by its actor on its node, the request signed here
        for the role's name, the certificate sent back (the roles side by side)."""
        requests = self._get(
            [r.actor.etcd_request.remote(self.run_dir) for r in roles], [r.spec for r in roles]
        )
        signed = [
            r.actor.etcd_install.remote(self.etcd_ca.sign_client(q, r.spec.name), self.etcd_ca.pem)
            for r, q in zip(roles, requests, strict=True)
        ]
        self._get(signed, [r.spec for r in roles])
