"""hogwild cluster: one job's model replicas, parameter servers, data servers and launchers.

The driver's side, policy first:

* ``driver``: ``hogwild cluster``, the orchestration of one job, on the topology its
  ``[cluster]`` section resolves to (:mod:`hogwild.config.topology`: Downpour, Sandblaster,
  AllReduce, distributed Hogwild, hybrid, and their groups);
* ``coordinator`` (no I/O): which replica trains which portion of which epoch; ``epochs``
  carries out its instructions; ``polling``: when to ask the replicas next;
* ``supervisor``: the restart policy (no I/O) and the adapter that restarts roles; ``links``:
  the driver's control clients of its replicas, and what a failed call means;
* ``servers``: the parameter servers as the driver holds them (the model given and pulled);
* ``records``: each epoch's evaluation, checkpoint and metrics line; ``status``: the live
  table and ``hogwild cluster status``; ``prometheus``: each role's metrics port;
* ``roles``: the roles as plain data and how a launcher runs one; ``launcher``: the seam,
  ``local``: processes on this host (Ray's is a plugin).

The replicas' side: ``serving``, the one serve loop every replica role answers the driver
through, and ``replica``, the single-node engine as a replica. What the cluster takes from the
parameter-server plugin is declared in ``services`` and found through entry points.
"""
