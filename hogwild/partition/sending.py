"""What one partition sends to the host groups of its replica on other hosts: ZeroMQ frames
straight out of its arena rows (the receiving end is :mod:`hogwild.partition.link`).

A partition holds one PUSH socket per other host group (:class:`Outbox`), CURVE clients of the
job's key directory beyond loopback, and sends its slices straight from its arena row
(``copy=False``: ZeroMQ reads the shared memory itself; the row is not written again before
every reader is done with the example, so it cannot change under the send).
"""

from __future__ import annotations

import numpy as np
import zmq

from hogwild.net.address import check_connect, parse_address
from hogwild.partition import frames as fr
from hogwild.partition.hosts import LEADER, HostGroups
from hogwild.partition.plan import PartitionPlan

LINGER_MS = 2000  # what is queued when a socket closes still goes (a STOP, the last rows)


def zmq_context() -> zmq.Context:
    return zmq.Context.instance()


class Outbox:
    """PUSH sockets to the other host groups' receivers (one per group).

    ``roles``: in a cluster job whose roles have a key pair each (a roster in ``keys``), per
    group the role whose key its receiver holds where the roster does not list the receiver's
    address (the leader's link, beside its replica's address), else ``""``."""

    def __init__(self, addresses: tuple[str, ...], targets, keys: str | None, roles=()):
        from hogwild.net.auth import secure_client

        self.sockets: dict[int, zmq.Socket] = {}
        try:
            for g in targets:
                address = parse_address(addresses[g])
                check_connect(address, keys)
                sock = zmq_context().socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, LINGER_MS)
                if keys:
                    role = roles[g] if g < len(roles) else ""
                    secure_client(sock, keys, address.endpoint, role)
                sock.connect(address.endpoint)
                self.sockets[g] = sock
        except BaseException:
            self.close()
            raise

    def send(self, group: int, header: bytes, *payload) -> None:
        if payload:
            self.sockets[group].send_multipart([header, *payload], copy=False)
        else:
            self.sockets[group].send(header)

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(LINGER_MS)
        self.sockets = {}


class PartitionLink:
    """What partition ``p`` sends to the other hosts (used by its dataflow loop)."""

    def __init__(self, plan: PartitionPlan, groups: HostGroups, p: int, keys: str | None, roles=()):
        self.plan, self.groups, self.p = plan, groups, p
        self.group = groups.group_of[p]
        others = [g for g in range(groups.n_groups) if g != self.group]
        self.outbox = Outbox(groups.addresses, others, keys, roles)
        n_b = len(plan.boundaries)
        # per boundary (1-based index - 1): the groups to send to and what
        self.forward_to = [groups.forward_targets(plan, b, p) for b in range(n_b)]
        self.backward_to = [groups.backward_targets(plan, b, p) for b in range(n_b)]
        self.followers = others if self.group == LEADER else []

    def forward(self, s: int, gen: int, boundary: int, act_row: np.ndarray) -> None:
        """This partition's slice of boundary ``boundary``'s block of slot ``s``, to its readers."""
        targets = self.forward_to[boundary - 1]
        if not targets:
            return
        b = self.plan.boundaries[boundary - 1]
        lo, hi = b.slices[self.p]
        block = act_row[b.block + lo : b.block + hi]
        header = fr.encode(fr.FORWARD, self.p, s, boundary, gen)
        for g in targets:
            self.outbox.send(g, header, block)

    def backward(self, s: int, gen: int, boundary: int, dact_row: np.ndarray) -> None:
        """This partition's partial error over each remote owner's slice, one message a group."""
        b = self.plan.boundaries[boundary - 1]
        header = fr.encode(fr.BACKWARD, self.p, s, boundary, gen)
        for g, owners in self.backward_to[boundary - 1]:
            blocks = [dact_row[b.block + b.slices[q][0] : b.block + b.slices[q][1]] for q in owners]
            self.outbox.send(g, header, *blocks)

    def load(self, s: int, gen: int, image: np.ndarray, label: int, lr: float) -> None:
        """The feeder loaded example ``gen`` into slot ``s``: tell every follower."""
        header = fr.encode(fr.LOAD, self.p, s, 0, gen, int(label), float(lr))
        for g in self.followers:
            self.outbox.send(g, header, image)

    def done(self, s: int, gen: int) -> None:
        """This partition completed slot ``s``'s example (a follower's, to the leader)."""
        if self.group != LEADER:
            self.outbox.send(LEADER, fr.encode(fr.DONE, self.p, s, 0, gen))

    def close(self) -> None:
        self.outbox.close()
