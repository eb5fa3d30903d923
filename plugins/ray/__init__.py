"""The ``ray`` launcher: a cluster job's roles placed on a Ray cluster (``cluster.launcher``).

:mod:`~hogwild_plugins.ray.launcher` holds the policy (where each role goes, in what order it is
stopped, what the driver is told); :mod:`~hogwild_plugins.ray.joining` which Ray cluster the
driver joins (or starts) and whether it has room for the job; :mod:`~hogwild_plugins.ray.mirrors`
the run directory's files on the nodes that cannot see it; :mod:`~hogwild_plugins.ray.role_actor`
the mechanics on the node (the role's process, its log, its ready line, its key pair);
:mod:`~hogwild_plugins.ray.etcd_members` the job's own etcd members. Needs the ``cluster`` extra
(``ray[default]``).
"""
