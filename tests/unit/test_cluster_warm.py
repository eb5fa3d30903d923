"""When the cluster driver loads its evaluation's kernels: once half of the first epoch this run
trains is trained, once only, and never for an epoch that ended already (its evaluation loads
them itself); a job stopped before then never loads them.

The epoch loop (:class:`hogwild.cluster.epochs.EpochLoop`) is driven through its real
coordinator's events, without roles or sockets; its records are a recorder of ``warm()`` calls,
the one thing the rule decides.
"""

from __future__ import annotations

from hogwild.cluster.coordinator import EpochEnd, Joined, PortionDone, Progress, StartPortion
from hogwild.cluster.epochs import EpochLoop
from hogwild.config import load_config
from hogwild.config.topology import resolve_topology

N_TRAIN = 1_000


class WarmCalls:
    """Stands for the driver's :class:`~hogwild.cluster.records.EpochRecords`: counts ``warm()``."""

    def __init__(self) -> None:
        self.calls = 0

    def warm(self) -> None:
        self.calls += 1


def _loop(records: WarmCalls) -> EpochLoop:
    config = load_config(None)
    return EpochLoop(
        config, resolve_topology(config.cluster), replicas=1, n_train=N_TRAIN, start_epoch=0,
        connections=1, records=records, servers=None, call=lambda *a, **k: {},
        recover=lambda: None,
    )  # fmt: skip


def _trained(loop: EpochLoop, examples: int) -> None:
    """Replica 0 reports ``examples`` trained of the first portion it was handed."""
    coordinator = loop.coordinator
    part = coordinator.parts[0]
    start = part.held[0]
    loop.pending.extend(coordinator.handle(Progress(0, coordinator.epoch, start, examples)))


def test_the_kernels_load_once_half_of_the_first_epoch_is_trained():
    records = WarmCalls()
    loop = _loop(records)
    loop.pending.extend(loop.coordinator.handle(Joined(0)))
    assert loop.coordinator.parts[0].held  # replica 0 holds its first portion
    _trained(loop, N_TRAIN // 2 - 1)
    loop._warm_when_half_trained()
    assert records.calls == 0  # a job stopped now never loads them
    _trained(loop, N_TRAIN // 2)
    loop._warm_when_half_trained()
    loop._warm_when_half_trained()
    assert records.calls == 1  # once, however often the loop asks


def test_an_epoch_that_ended_before_its_half_was_seen_loads_nothing_beside_its_evaluation():
    records = WarmCalls()
    loop = _loop(records)
    coordinator = loop.coordinator
    instructions = coordinator.handle(Joined(0))
    for _ in range(1_000):  # each portion handed out finished whole, with no progress seen
        starts = [i for i in instructions if isinstance(i, StartPortion)]
        if any(isinstance(i, EpochEnd) for i in instructions) or not starts:
            break
        (portion,) = starts
        size = portion.stop - portion.start
        done = PortionDone(0, portion.epoch, portion.start, size, loss=0.1, correct=size)
        instructions = coordinator.handle(done)
    assert coordinator.ended  # the epoch ended within one poll: its evaluation loads them
    loop._warm_when_half_trained()
    assert records.calls == 0
