"""A parameter server's part in keeping three copies of every bucket (Adam 3.3.3), with etcd.

With ``copies > 1`` a :class:`~hogwild_plugins.ps.serving.server.ParameterServer` owns a
:class:`Replication` (:mod:`.adapter`). What must be right is decided by I/O-free state machines,
each with one ``handle(stimulus) -> actions`` entry, a ``story()`` of its transitions and a
``validate_state()``; the threads only carry their actions out and feed back what came of them:

* :mod:`.bucket_role`: one server's part in one bucket (campaigns, ``in_sync`` writes,
  snapshots, hand-backs; :mod:`~hogwild_plugins.ps.failover`'s docstring tells the protocol),
  with what it knows of the bucket's history in etcd (:mod:`.known_history`) and its wait for
  reads after a takeover (:mod:`.reads_gate`: when a primary may answer pulls); its transitions
  on a map read and a campaign (:mod:`.bucket_role_map_read`), on a primary's copies
  (:mod:`.bucket_role_in_sync`) and on a hand-over (:mod:`.bucket_role_hand_over`) are parts of
  the one machine (mixins, with no state, entry or story of their own);
* :mod:`.commit_round`: the primary's round for a batch of client updates (which are admitted,
  prepared and committed where, which copies are dropped, which updates are acknowledged);
* :mod:`.copy_side`: a copy's acceptance of its primary's ``PREPARE``, ``COMMIT`` and
  ``SNAPSHOT`` (epoch fencing, gap detection, outdated snapshots).

Each machine's stimuli and actions, the records it shares with the threads that feed it and
carry its actions out, are in a module of their own beside it: :mod:`.bucket_role_events`,
:mod:`.commit_round_events`, :mod:`.copy_side_events`.

Around them: :mod:`.membership` (the server's etcd lease, ``members/<index>``, the heartbeat),
:mod:`.map_reads` (the reads of the job's map and records in etcd, and the ``MapRead`` each role
is told of one),
:mod:`.marks` (the newest epoch of each bucket's record the server saw, kept in its store),
:mod:`.frames` (what a snapshot carries on the wire, made and checked), :mod:`.peer_link` (a
primary's messages to its copies), :mod:`.local` (work queued on this server's update engine),
:mod:`.copy_adapter` (the network thread's side as a copy, and its refresher thread, which reads
etcd for it), :mod:`.executor` (the one loop that carries the roles', the rounds' and the copy
side's actions out through a host's effects: the real server's, and the simulator's in
:mod:`hogwild_plugins.ps.simulation`), :mod:`.adapter` (the lifecycle and the replication thread:
the bucket roles' effects), :mod:`.sync_parcels` (a role's ``Sync``: its parcel
taken, sent by the snapshot thread of :mod:`.snapshot_sender`, its outcome told to the role) and
:mod:`.primary_round` (one commit round's effects on the server: admission, local application,
prepares, commits, replies).
"""

from hogwild_plugins.ps.replication.adapter import PEER_SENDER, Replication

__all__ = ["PEER_SENDER", "Replication"]
