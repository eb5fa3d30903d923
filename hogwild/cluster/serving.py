"""A replica role's service to the driver: its control requests, the driver's silence, its loop.

Every replica role of a cluster job, whatever it trains with (the single-node engine of
:mod:`hogwild.cluster.replica`, or a synchronous worker group a plugin registers through
:mod:`hogwild.cluster.services`), answers the driver the same way, so the driver's epochs,
evaluation, checkpoints and restarts work unchanged for every framework. :class:`ReplicaServer`
is that one way; a role is a :class:`ServedRole` and keeps only what it trains:

- ``train`` (epoch, lr, start, stop, seed): a portion ``order[start:stop]`` of the epoch's
  permutation, checked against the role's examples, queued on :attr:`ServedRole.commands` after
  the ones it holds (a request the driver resent, the same as the last one taken, is not queued
  twice);
- ``close`` (epoch): stop what it holds of the epoch at the next chance (Adam's epoch rule);
- ``status`` and ``describe``: what the role says of itself;
- ``stop``: leave;
- any other op goes to the role's own ``answer(op, body)`` where it has one (a synchronous worker
  group's members reach their coordinator's board this way), else it is refused; it is not the
  driver's word, so it does not count against the driver's silence.

The network thread only answers and records; the main thread runs :meth:`ServedRole.step` until
``stop``, or until the driver has asked nothing for :attr:`ServedRole.silence_s` seconds (it is
taken for dead: the role leaves, releasing everything). The role's ready line,
``hogwild replica: serving ... on HOST:PORT``, is how its launcher learns where it listens.
"""

from __future__ import annotations

import queue
import sys
import time
from typing import Protocol

from hogwild.logs import role_logger
from hogwild.net.control import ControlRefused, ControlServer, field
from hogwild.signals import deferred_signals, terminate_as_interrupt
from hogwild.training.messages import Train

__all__ = [
    "DRIVER_SILENCE_S",
    "MAX_EPOCH",
    "MAX_QUEUED_PORTIONS",
    "MAX_SEED",
    "POLL_S",
    "ReplicaServer",
    "ServedRole",
]

DRIVER_SILENCE_S = 120.0  # the least silence after which a role takes its driver for dead
POLL_S = 0.05  # the main thread's longest wait for work or for its workers
MAX_EPOCH = 2**31 - 1
"""The largest epoch a ``train`` or ``close`` may name (a data server's batch carries the epoch
in 32 bits; no job runs this many)."""
MAX_SEED = 2**63 - 1
"""The largest job seed a ``train`` may carry (a signed 64-bit integer)."""
MAX_QUEUED_PORTIONS = 64
"""Portions a role holds queued at most (the driver hands out one ahead of the one under way);
a ``train`` beyond them is refused, naming the limit."""


DRIVER_OPS = ("status", "describe", "train", "close", "stop")
_LR_ULP = 1 + 1e-12  # the driver's rate, computed as the role computes its peak, may differ by this


class ServedRole(Protocol):
    """What a replica role does for :class:`ReplicaServer`.

    Attributes:
        index: The role's replica index.
        job: The job's name on the wire (the control server checks it).
        n_train: Its training examples (a portion must lie within them).
        silence_s: How long the driver may be silent before the role leaves.
        max_lr: The largest rate the job's schedule gives (a ``train`` above it is refused).
        commands: Where ``train`` requests are queued, for :meth:`step` to take: a queue of
            at most :data:`MAX_QUEUED_PORTIONS`.
    """

    index: int
    job: str
    n_train: int
    silence_s: float
    max_lr: float
    commands: queue.Queue

    def start(self) -> str:
        """Set up (processes, clients, kernels) before serving; what the ready line says the
        role is (``replica 0 (2 worker(s) ...)``)."""

    def started(self, address: str) -> None:
        """The control server listens on ``address``; the ready line is next."""

    def describe(self) -> dict:
        """``describe``: the role's fixed facts (its index, workers, pid, examples)."""

    def status(self) -> dict:
        """``status``: its portions (finished, under way) and figures (see
        :func:`hogwild.cluster.coordinator.status_events`)."""

    def check_train(self, command: Train) -> None:
        """Refuse (:class:`~hogwild.net.control.ControlRefused`) a portion it cannot train."""

    def queued(self) -> None:
        """A ``train`` was queued (on the network thread: wake the main thread)."""

    def close(self, epoch: int) -> None:
        """``close`` (on the network thread): stop what it holds of ``epoch`` soon."""

    def stop(self) -> None:
        """``stop`` (on the network thread): the main thread's next :meth:`step` is its last."""

    def step(self) -> None:
        """One turn of the main thread: take and train work, for at most about ``POLL_S``
        seconds when there is none."""

    def release(self) -> None:
        """Release everything it holds (on every way out)."""


class ReplicaServer:
    """Serves a :class:`ServedRole` to the driver (see the module docstring).

    Args:
        role: The role.
        bind: The address its control server binds (any port).
        keys: CURVE keys (beyond loopback).
    """

    def __init__(self, role: ServedRole, bind: str, keys: str | None = None) -> None:
        self.role, self.bind, self.keys = role, bind, keys
        self.stopping = False
        self.last_contact = time.monotonic()
        self.last_train: tuple[int, int, int] | None = None  # a resent `train` is not run twice

    def act(self, op: str, body: dict) -> dict:
        """A driver's request (on the network thread: record, answer), or one for the role's
        own ``answer``."""
        role = self.role
        if op not in DRIVER_OPS:
            answer = getattr(role, "answer", None)
            if answer is None:
                raise ControlRefused(f"unknown op {op!r} ({', '.join(DRIVER_OPS)})")
            return answer(op, body)
        self.last_contact = time.monotonic()
        if op == "status":
            return role.status()
        if op == "describe":
            return role.describe()
        if op == "train":
            command = Train(
                field(body, "epoch", int, minimum=0, maximum=MAX_EPOCH),
                float(field(body, "lr", (int, float), minimum=0, maximum=role.max_lr * _LR_ULP)),
                field(body, "start", int, minimum=0),  # and both within n_train: check_train
                field(body, "stop", int, minimum=0),
                field(body, "seed", int, minimum=0, maximum=MAX_SEED),
            )
            role.check_train(command)
            key = (command.epoch, command.start, command.stop)
            if key != self.last_train:  # else: the driver resent a request already taken
                try:
                    role.commands.put_nowait(command)
                except queue.Full:
                    raise ControlRefused(
                        f"{MAX_QUEUED_PORTIONS} portions queued already (the most a role holds); "
                        "retry once one began"
                    ) from None
                self.last_train = key
                role.queued()
            return {"ok": True}
        if op == "close":
            role.close(field(body, "epoch", int, minimum=0, maximum=MAX_EPOCH))
            return {"ok": True}
        if op == "stop":
            self.stopping = True
            role.stop()
            return {"ok": True}
        raise AssertionError(op)  # every one of DRIVER_OPS is answered above

    def serve(self) -> int:
        """Start the role, serve the driver until it says stop (or is gone), release
        everything; the exit status."""
        role = self.role
        with terminate_as_interrupt():
            server = None
            try:
                what = role.start()
                server = ControlServer(f"{self.bind}:0", role.job, self.act, self.keys)
                address = server.start()
                self.last_contact = time.monotonic()  # start-up is not the driver's silence
                role.started(address)
                print(f"hogwild replica: serving {what} on {address}", file=sys.stderr, flush=True)
                self._loop()
                return 0
            finally:
                with deferred_signals():
                    if server is not None:
                        server.stop()
                    role.release()

    def _loop(self) -> None:
        role = self.role
        while not self.stopping:
            if time.monotonic() - self.last_contact > role.silence_s:
                role_logger(f"replica {role.index}").warning(
                    "no word from the driver for %.0f s; leaving", role.silence_s
                )
                return
            role.step()
