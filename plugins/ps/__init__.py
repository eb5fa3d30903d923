"""Adam's parameter server (OSDI 2014, section 3.3), importable as ``hogwild_plugins.ps``.

``layout`` (shards, buckets, the bucket map), ``shard`` (versions and staleness: the I/O-free
state machine), ``kernels`` (numba update rules and vector operations), ``engine`` (update
threads and their lock-free queues), ``storage`` (LMDB write-back persistence), ``checks`` and
``server`` (the parameter server on the :mod:`hogwild.net` transport), ``client``
(:class:`~hogwild_plugins.ps.client.PSClient`), ``launch`` (starting servers), ``etcd`` (the
client of the controller holding the bucket map and primary leases) and ``etcd_process`` (an etcd
server on loopback), ``cli`` (``hogwild ps serve | status | keys``), and ``sandblaster``
(DistBelief's Sandblaster L-BFGS: a coordinator that runs L-BFGS through the servers' vector
operations, the scheduler of a batch's portions, and the replicas that compute them).

What ``hogwild cluster`` takes from this plugin it finds through entry points (the protocols are
the core's, :mod:`hogwild.cluster.services`): ``controller`` (``hogwild.controllers``: the etcd
a replicated job's driver holds), ``groups`` (``hogwild.server_groups``: the synchronisation of
server groups) and ``sandblaster.group`` (``hogwild.worker_groups``: the worker-group roles).
"""
