"""What moves between the simulated servers, clients and engines: plain records, no decision.

A client's update as a server's engine holds it (:class:`SimWork`), a primary's message to a copy
with the header fields the copy's gate reads (:class:`Peer`), a primary's requests out to its
copies and their answers (:class:`Exchange`), and a primary's message a copy's network thread
let through the gate and is still reading (:class:`Reading`).
:class:`~hogwild_plugins.ps.simulation.server.SimServer` makes and takes them;
:class:`~hogwild_plugins.ps.simulation.world.World` carries them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = ["Exchange", "Peer", "Reading", "SimWork"]


@dataclass(slots=True)
class SimWork:
    """A client's update as a server's engine holds it: who sent it, its version once given."""

    sender: int
    seq: int
    shard: int
    version: int = 0


@dataclass(slots=True)
class Peer:
    """A primary's message to a copy (``kind``: ``PREPARE``, ``COMMIT``, ``SNAPSHOT``,
    ``CATCHUP``) and the header fields the copy's gate reads."""

    kind: str
    bucket: int
    shard: int
    epoch: int
    lease: int
    sender: int
    version: int
    item: tuple = ()  # PREPARE: (sender, seq, work); SNAPSHOT: (values, table)
    log_epoch: int = 0  # CATCHUP: the epoch of the primary's committed state


@dataclass
class Exchange:
    """Requests out to the copies, waiting: ``ok[i]`` once acknowledged, ``done[i]`` once
    answered or given up on (the copy did not answer in time)."""

    requests: list[tuple[int, Peer]]
    ok: list[bool] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)
    codes: list[str | None] = field(default_factory=list)  # each answer's code (None: none)

    def __post_init__(self) -> None:
        self.ok = [False] * len(self.requests)
        self.done = [False] * len(self.requests)
        self.codes = [None] * len(self.requests)

    @property
    def complete(self) -> bool:
        return all(self.done)

    def waiting_on(self) -> list[int]:
        return sorted({dst for (dst, _), d in zip(self.requests, self.done, strict=True) if not d})

    def give_up(self, server: int) -> None:
        """``server`` did not answer in time: every request to it still out fails."""
        for i, (dst, _) in enumerate(self.requests):
            if dst == server:
                self.done[i] = True


@dataclass
class Reading:
    """A primary's message past the copy's gate, its frames being read outside the lock: the
    rest of its flow, where its answer goes, and how many of the replication thread's steps
    come before its content's step."""

    flow: Iterator[str]
    reply: Callable[[tuple[str, int]], None]
    steps: int
