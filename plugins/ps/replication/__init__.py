"""A parameter server's part in keeping three copies of every bucket (Adam 3.3.3), with etcd.

With ``copies > 1`` a :class:`~hogwild_plugins.ps.server.ParameterServer` owns a
:class:`Replication` (:mod:`.adapter`): the threads and sockets around the I/O-free state machines
of :mod:`~hogwild_plugins.ps.failover` (the bucket roles; read that module's docstring for the
protocol). One concept per module:

* :mod:`.membership`: the server's etcd lease, ``members/<index>`` and the heartbeat;
* :mod:`.frames`: what a snapshot carries on the wire, made and checked;
* :mod:`.adapter`: the threads that carry out what the machines decide.
"""

from hogwild_plugins.ps.replication.adapter import PEER_SENDER, Replication

__all__ = ["PEER_SENDER", "Replication"]
