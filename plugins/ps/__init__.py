"""Adam's parameter server (OSDI 2014, section 3.3), importable as ``hogwild_plugins.ps``.

``layout`` (shards, buckets, the bucket map), ``shard`` (versions and staleness: the I/O-free
state machine), ``kernels`` (numba update rules and vector operations), ``engine`` (update
threads and their lock-free queues), ``storage`` (LMDB write-back persistence), ``checks`` and
``server`` (the parameter server on the :mod:`hogwild.net` transport), ``client``
(:class:`~hogwild_plugins.ps.client.PSClient`), ``launch`` (starting servers), ``cli``
(``hogwild ps serve | status | keys``).
"""
