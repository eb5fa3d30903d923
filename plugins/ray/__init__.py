"""The ``ray`` launcher: a cluster job's roles placed on a Ray cluster (``cluster.launcher``).

:mod:`~hogwild_plugins.ray.launcher` holds the policy (where each role goes, in what order it is
stopped, what the driver is told); :mod:`~hogwild_plugins.ray.role_actor` the mechanics on the
node (the role's process, its log, its ready line). Needs the ``cluster`` extra (``ray[default]``).
"""
