"""The ``ray`` launcher: a cluster job's roles placed on a Ray cluster (``cluster.launcher``).

:mod:`~hogwild_plugins.ray.launcher` holds the policy (where each role goes, what the driver is
told), with its parts: :mod:`~hogwild_plugins.ray.placing`, :mod:`~hogwild_plugins.ray.starting`
(side by side, each failure its own), :mod:`~hogwild_plugins.ray.stopping` (in what order, and
what is released), :mod:`~hogwild_plugins.ray.followers`, :mod:`~hogwild_plugins.ray.etcd_job`;
:mod:`~hogwild_plugins.ray.joining` which Ray cluster the
driver joins (or starts) and whether it has room for the job; :mod:`~hogwild_plugins.ray.mirrors`
the run directory's files on the nodes that cannot see it; :mod:`~hogwild_plugins.ray.role_actor`
the mechanics on the node (the role's process, its log, its ready line, its key pair);
:mod:`~hogwild_plugins.ray.etcd_members` the job's own etcd members. Needs the ``cluster`` extra
(``ray[default]``).
"""
