"""The leader's side of a partitioned replica whose partitions span hosts.

With ``model.partition_hosts`` a partitioned replica's parent
(:class:`~hogwild.partition.runtime.PartitionedTrainer`) is the *leader*: it runs the partitions
of its own host and, through :class:`LeaderLink` (a part of that trainer), binds the link's
receiver (:mod:`hogwild.partition.link`), sends each follower host
(:mod:`hogwild.partition.follower`) the job and the model, waits for their partitions to start,
takes their rows back at every epoch's end (before it evaluates and checkpoints), checks that no
follower failed or fell silent (``model.partition_silence_s``), and tells them to stop when the
job ends. The partitions themselves send the blocks other hosts read as ZeroMQ frames.

The invariant it keeps: once the link is opened, :meth:`LeaderLink._close_link` (which the
trainer's shutdown calls on every exit path) sends every follower ``STOP`` and closes the
outbox and the receiver, and every wait on a follower is bounded (``START_TIMEOUT_S``), raising
:class:`~hogwild.errors.PartitionDiedError` naming the hosts. ``hogwild train``'s one key pair
gives every host the same roster; a cluster replica
(:class:`~hogwild.cluster.partitioned.PartitionedReplica`) overrides :meth:`LeaderLink.link_roles`,
:meth:`LeaderLink.link_senders` and :meth:`LeaderLink.follower_home`.
"""

from __future__ import annotations

import time

import numpy as np

from hogwild.errors import PartitionDiedError
from hogwild.partition.hosts import LEADER
from hogwild.partition.process import START_TIMEOUT_S

__all__ = ["LeaderLink"]


class LeaderLink:
    """The leader's link to its follower hosts (see the module docstring).

    It owns ``receiver``, ``outbox`` and ``rows_asked`` (declared by the trainer, None and 0
    without follower hosts), and expects of the trainer: ``config``, ``plan``, ``groups``,
    ``followers``, ``keys``, ``arena``, ``mean``, ``std``, ``n_classes`` and ``_check_alive``.
    """

    def link_setup(self) -> dict:
        """What a partition process needs to reach the other hosts."""
        return {
            "addresses": list(self.groups.addresses),
            "group_of": list(self.groups.group_of),
            "keys": self.keys or "",
            "roles": list(self.link_roles()),
        }

    def link_roles(self) -> tuple[str, ...]:
        """Per host group, the role whose key its receiver holds where the job's roster does
        not list the receiver's address (:class:`~hogwild.partition.sending.Outbox`); none with
        ``hogwild train``'s one key pair."""
        return ()

    def link_senders(self) -> tuple[str, ...]:
        """Per host group, the roster role that sends its messages (the link's receivers refuse
        any other under the job's roster); none with ``hogwild train``'s one key pair."""
        return ()

    def follower_home(self) -> dict | None:
        """Where a follower host's partitions exchange their rows (as :meth:`homes`' entries,
        the same for every partition); None: nowhere, the leader gathers their rows."""
        return None

    def _open_link(self, params: np.ndarray, velocity: np.ndarray) -> None:
        """Bind the leader's receiver and send every follower host the job and the model."""
        from hogwild.partition import frames as fr
        from hogwild.partition.link import Receiver, bind_receiver, setup_frames
        from hogwild.partition.sending import Outbox

        groups, roles, senders = self.groups, self.link_roles(), self.link_senders()
        sock, security = bind_receiver(groups.addresses[LEADER], self.keys)
        self.receiver = Receiver(
            sock, security, self.plan, groups, LEADER, self.arena,
            self.config.train.in_flight, self.mean, self.std, self.keys, roles, senders,
        )  # fmt: skip
        self.outbox = Outbox(groups.addresses, self.followers, self.keys, roles)
        home = self.follower_home()
        for g in self.followers:
            job = {
                "config": self.config.to_dict(),
                "group": g,
                "n_classes": self.n_classes,
                "leader": groups.addresses[LEADER],
                "roles": list(roles),
                "senders": list(senders),
            }
            if home is not None:
                job["home"] = home
            self.outbox.send(g, fr.encode(fr.SETUP, 0), *setup_frames(job, params, velocity))

    def _wait_followers(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.receiver is not None and len(self.receiver.ready) < len(self.followers):
            self._check_alive("starting on their hosts")
            if time.monotonic() > deadline:
                missing = [self.groups.addresses[g] for g in self.followers
                           if g not in self.receiver.ready]  # fmt: skip
                raise PartitionDiedError(
                    f"the partition hosts {', '.join(missing)} did not start their partitions "
                    f"within {START_TIMEOUT_S:.0f} s (is `hogwild partition-host` running there?)"
                )
            time.sleep(0.01)

    def _gather_rows(self, doing: str) -> None:
        """The followers' parameter and velocity rows into this arena (every partition idle:
        all examples handed out are complete), for the evaluation and the checkpoint."""
        from hogwild.partition import frames as fr

        if not self.followers:
            return
        self.rows_asked += 1
        for g in self.followers:
            self.outbox.send(g, fr.encode(fr.ROWS_ASK, 0, a=self.rows_asked))
        deadline = time.monotonic() + START_TIMEOUT_S
        while any(self.receiver.rows.get(g, 0) < self.rows_asked for g in self.followers):
            self._check_alive(doing)
            if time.monotonic() > deadline:
                raise PartitionDiedError(f"the partition hosts sent no rows while {doing}")
            time.sleep(0.005)

    def _check_link(self, doing: str) -> None:
        """Raise if a follower failed or fell silent (the receiver's thread beats to them)."""
        receiver = self.receiver
        if receiver is None:
            return
        if receiver.failed or receiver.broken:
            why = receiver.failed or receiver.broken
            raise PartitionDiedError(f"{why} while {doing}; the replica stops")
        silence_s = self.config.model.partition_silence_s
        for g in receiver.ready:  # before it is ready, the start's own deadline applies
            if receiver.silent(g) > silence_s:
                raise PartitionDiedError(
                    f"partition host {self.groups.addresses[g]} (partitions "
                    f"{', '.join(map(str, self.groups.members(g)))}) was silent for "
                    f"{silence_s:g} s (model.partition_silence_s) while {doing}; the replica "
                    "stops"
                )

    def _close_link(self) -> None:
        from hogwild.partition import frames as fr

        if self.outbox is not None:
            for g in self.followers:
                self.outbox.send(g, fr.encode(fr.STOP, 0))
            self.outbox.close()
            self.outbox = None
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None
