"""A worker group's member: one replica of a synchronous group as a process of its own.

``hogwild cluster member --index M --coordinator HOST:PORT`` (started by the launcher, on any
node, after its group's role) is replica ``M % workers_per_group`` of worker group
``M // workers_per_group``. It holds the job's training examples (as the group does), the model
and a parameter-server client of its own, and runs the
:class:`~.replica.SandblasterReplica` loop against its coordinator's board, reached as messages
over the group role's control channel (:class:`~.board_service.RemoteBoard`): it fetches the
parameters at the start of a batch, computes portion gradients with the engine's kernels and
pushes them into its own vector on the shards (:func:`~.batch.replica_vector` of ``M``), which
the coordinator folds. Which examples make the batch comes from the coordinator with the batch.

It serves a control server of its own (``status``, ``describe``, ``stop``); its ready line,
``hogwild member: serving ... on HOST:PORT``, says where. It leaves when told to stop (by that
server, or by its coordinator closing the board for good), on SIGTERM, or with an error (its
coordinator unreachable, a server refusing it): the exit status says which (0, 143, 1).
"""

from __future__ import annotations

import os
import secrets
import sys
import threading

import numpy as np
from hogwild_plugins.ps.sandblaster.board_service import RemoteBoard
from hogwild_plugins.ps.sandblaster.replica import Examples, PortionGradient, SandblasterReplica

from hogwild.config.topology import etcd_group
from hogwild.errors import EXIT_STOPPED, StoppedError, cause_of
from hogwild.net.control import ControlClient, ControlRefused, ControlServer
from hogwild.signals import deferred_signals, interrupts_not_lost, terminate_as_interrupt

__all__ = ["group_client", "serve_member", "training_arrays"]


def training_arrays(config, data) -> tuple[np.ndarray, np.ndarray]:
    """The job's training images (flattened, uint8) and labels, ``train.subset`` chosen as
    every replica of the job chooses it: a group and its members index the same examples.
    The labels are :data:`~hogwild.model.loops.LABEL_DTYPE`, the type the jobs' kernels are
    compiled for: the portion gradient then shares their compiled step instead of compiling
    its own for another label type."""
    from hogwild.data.plan import plan_data
    from hogwild.model.loops import LABEL_DTYPE
    from hogwild.training.job import subset_indices

    _, n_total, _ = plan_data(config, data, 1)
    chosen = subset_indices(config.train.seed, n_total, config.train.subset)
    images = data.train_images if chosen is None else data.train_images[chosen]
    labels = data.train_labels if chosen is None else data.train_labels[chosen]
    images = np.ascontiguousarray(images.reshape(len(images), -1))
    return images, np.ascontiguousarray(labels, dtype=LABEL_DTYPE)


def group_client(config):
    """A parameter-server client of its own (a coordinator's, or a member's)."""
    from hogwild_plugins.ps.client import PSClient

    ps, cluster = config.ps, config.cluster
    etcd = (cluster.etcd or None) if cluster.copies > 1 else None  # replicated: by the map
    return PSClient(list(ps.servers), ps.job, client_id=secrets.randbits(31),
                    timeout_s=ps.timeout_s, retries=ps.retries, keys=ps.keys or None,
                    etcd=etcd, etcd_tls=cluster.etcd_tls or None, token=ps.token,
                    etcd_group=etcd_group(config))  # fmt: skip


class GroupMember:
    """Member ``index`` of its group (see the module docstring).

    Args:
        config: The job's resolved config.
        data: :class:`~hogwild.data.mnist.MnistData`.
        index: The member's number across the job (``group * workers_per_group + i``).
    """

    def __init__(self, config, data, index: int) -> None:
        from hogwild.data.plan import plan_data
        from hogwild.model.network import build_network

        self.workers = config.cluster.workers_per_replica  # the topology's workers_per_group
        self.index, self.group = index, index // self.workers
        self.config = config  # ``ps.token``: its group's incarnation's (the caller's)
        plan, _, _ = plan_data(config, data, 1)
        self.network = build_network(config.model, plan.n_classes)
        self.images, self.labels = training_arrays(config, data)
        self.gradient = PortionGradient(self.network, self._examples(np.zeros(1, np.int64), 1))
        self.stopping = threading.Event()
        self.replica: SandblasterReplica | None = None

    def _examples(self, order: np.ndarray, portion: int) -> Examples:
        c = self.config.data
        if len(order) and not (0 <= order.min() and order.max() < len(self.labels)):
            raise ControlRefused(
                f"the coordinator's batch names examples outside this member's {len(self.labels)}"
            )
        return Examples(self.images, self.labels, order, portion, c.mean, c.std)

    def use_examples(self, order: np.ndarray, portion: int) -> None:
        """The coordinator's next batch: compute on ``order`` in portions of ``portion``."""
        self.gradient.examples = self._examples(order, portion)

    def warm(self) -> None:
        """Compile (or load) the gradient kernel before saying ready (a SIGTERM during numba's
        compiler callbacks is not lost)."""
        with interrupts_not_lost():
            self.gradient(np.zeros(self.network.n_params, np.float32), 0)

    def act(self, op: str, body: dict) -> dict:
        """Its control server's requests (on the network thread)."""
        if op in ("status", "describe"):
            r = self.replica
            counters = {"computed": r.computed, "kept": r.kept, "pushes": r.pushes,
                        "pushed": r.pushed} if r is not None else {}  # fmt: skip
            return {"member": self.index, "group": self.group, "pid": os.getpid(), **counters}
        if op == "stop":
            self.stopping.set()
            return {"ok": True}
        raise ControlRefused(f"unknown op {op!r} (status, describe, stop)")

    def run(self, client, board: RemoteBoard) -> int:
        """The replica loop until it is told to stop; the exit status."""
        self.replica = SandblasterReplica(self.index, client, board, self.gradient)
        self.replica.run(self.stopping)
        error = self.replica.error
        if error is not None:
            stopped = cause_of(error, StoppedError)
            if stopped is not None:  # its parameter server stopped a bucket: no restart helps
                print(f"hogwild: error: member {self.index}: {stopped}", file=sys.stderr)
                return EXIT_STOPPED
            say(self.index, f"left: {type(error).__name__}: {error}")
            return 1
        return 0


def say(index: int, text: str) -> None:
    print(f"hogwild member {index}: {text}", file=sys.stderr, flush=True)


def serve_member(config, data, index: int, coordinator: str, bind: str, keys: str | None) -> int:
    """``hogwild cluster member``: member ``index`` of the job's groups, whose coordinator
    serves at ``coordinator``; the exit status."""
    with terminate_as_interrupt():
        member = GroupMember(config, data, index)
        resources: list = []
        try:
            member.warm()
            ps = member.config.ps
            control = ControlClient(coordinator, ps.job, timeout_s=ps.timeout_s,
                                    retries=ps.retries, keys=keys)  # fmt: skip
            resources.append(control)
            client = group_client(member.config)
            resources.append(client)
            server = ControlServer(f"{bind}:0", ps.job, member.act, keys)
            address = server.start()
            resources.append(server)
            board = RemoteBoard(control.call, member.use_examples)
            print(
                f"hogwild member: serving group {member.group}'s portions as member {index} "
                f"(coordinator {coordinator}, parameter server(s) {', '.join(ps.servers)}) on "
                f"{address}",
                file=sys.stderr, flush=True,
            )  # fmt: skip
            return member.run(client, board)
        finally:
            with deferred_signals():
                for resource in reversed(resources):
                    (resource.stop if isinstance(resource, ControlServer) else resource.close)()
