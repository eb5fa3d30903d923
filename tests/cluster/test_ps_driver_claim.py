"""One driver per job on a shared etcd (plugins/ps/controller.py), against a real etcd: a second
driver with the same job name is refused (it would clear the running job's bucket map), another
job name is not, and a driver's key is given back when it closes."""

from __future__ import annotations

import uuid

import pytest
from hogwild_plugins.ps.controller import DRIVER_KEY, EtcdController
from hogwild_plugins.ps.etcd import Etcd
from hogwild_plugins.ps.routes import etcd_prefix

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
