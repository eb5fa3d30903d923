"""Adam's parameter server (OSDI 2014, section 3.3), importable as ``hogwild_plugins.ps``.

Its packages import one another in one direction, from the top:

- ``serving/``: one server process: ``server`` (the parameter server on the :mod:`hogwild.net`
  transport), ``requests`` (the admission of a client's request), ``receive_pool``, ``options``
  (a server's settings, from the job config), ``cli`` (``hogwild ps serve | status | keys``) and
  ``launch`` (starting servers for tests and benchmarks);
- ``replication/``: the copies of every bucket (membership, the bucket role, the primary's commit
  round and the copy's side, each an I/O-free state machine, and the adapters that carry out
  their actions);
- ``sandblaster/``: DistBelief's Sandblaster L-BFGS (a coordinator that runs L-BFGS through the
  servers' vector operations, the scheduler of a batch's portions, and the replicas that compute
  them), over the client;
- this package's own modules, below them all: ``layout`` (shards, buckets, the bucket map),
  ``shard`` (versions and staleness: an I/O-free state machine), ``shard_log`` (a shard's
  committed and prepared updates), ``failover`` (bucket records, placement, the lease clock),
  ``kernels`` (numba update rules and vector operations), ``work`` (shards and the kinds of work
  on them), ``appliers`` (one per kind), ``engine`` (update threads and their lock-free queues),
  ``storage`` (LMDB write-back persistence), ``stops`` (buckets a server stopped because a write
  failed to apply after its acknowledgement), ``checks`` (a request's fields against the layout),
  ``client`` (:class:`~hogwild_plugins.ps.client.PSClient`) over ``connection`` (handshake,
  routing, exchange) and ``routing`` (the re-routing decisions, no I/O), ``etcd`` (the client of
  the controller holding the bucket map and primary leases), ``etcd_process`` (an etcd server,
  or a cluster of members, on loopback), ``etcd_tls`` (a directory of etcd certificates),
  ``etcd_ca`` (the job's own CA, signing requests made on the nodes), ``routes`` (the bucket map
  read from etcd), ``groups`` (several server groups kept in step), ``controller`` (what a
  cluster job asks of the controller) and ``store`` (the ``ps`` parameter store a model replica
  trains through).

What ``hogwild cluster`` takes from this plugin it finds through entry points (the protocols are
the core's, :mod:`hogwild.cluster.services`): ``controller`` (``hogwild.controllers``: the etcd
a replicated job's driver holds), ``groups`` (``hogwild.server_groups``: the synchronisation of
server groups) and ``sandblaster.group`` (``hogwild.worker_groups``: the worker-group roles).
"""
