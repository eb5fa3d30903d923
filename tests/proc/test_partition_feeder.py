"""The feeder's running total, its close and the partitions' flush, on real partition processes.

A cluster replica (:mod:`hogwild.cluster.partitioned`) hands its partitions portions as a running
total (``COUNT``) over a ring of example indices, may close a portion mid-way, and asks for a
flush at a portion's end. Here two partitions with four examples in flight take two portions in
a row (the second wraps around the ring), every example of each is completely processed once;
a close mid-portion is answered (``CLOSED``), cuts ``COUNT`` to what was fed, and the examples in
flight still complete; nothing is left behind.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from bench.support.paper_job import PAPER_OVERRIDES
from hogwild.config import load_config
from hogwild.data.mnist import load_mnist
from hogwild.partition import process as proc
from hogwild.partition.runtime import PartitionedTrainer, warm_kernels
from hogwild.shm.atomics import atomic_load, atomic_store
from hogwild.training.resume import starting_point

pytestmark = pytest.mark.slow

SUBSET = 200
WITHIN_S = 120.0


def _completed(arena) -> int:
    return int(arena.array("stats")[:, proc.STAT_EXAMPLES].sum())


def _until(what: str, check, trainer) -> None:
    deadline = time.monotonic() + WITHIN_S
    while not check():
        trainer._check_alive(what)
        assert time.monotonic() < deadline, f"no {what} within {WITHIN_S:g} s"
        time.sleep(0.005)


def test_portions_as_a_running_total_and_a_close_mid_portion(mnist_dir):
    overrides = {
        **PAPER_OVERRIDES,
        "model.partitions": 2,
        "train.in_flight": 4,
        "train.subset": SUBSET,
    }
    config = load_config(None, {**overrides, "output.progress": False})
    trainer = PartitionedTrainer(config, load_mnist(mnist_dir))
    try:
        params, velocity, _, _ = starting_point(config, trainer.network, 10, False, print)
        warm_kernels(trainer.plan, config.train.in_flight)
        trainer._start(params, velocity)
        arena = trainer.arena
        control, order = arena.array("control"), arena.array("order")
        arena.array("floats")[proc.LR] = 0.001
        ring = len(order)
        assert ring == SUBSET

        order[:] = np.arange(ring)  # the first portion: 150 examples
        atomic_store(control, proc.COUNT, 150)
        _until("first portion", lambda: _completed(arena) == 150, trainer)
        # the second: 150 more, written where the ring goes on (150..199, then 0..99)
        order[(150 + np.arange(150)) % ring] = np.arange(150)
        atomic_store(control, proc.COUNT, 300)
        _until("second portion", lambda: _completed(arena) == 300, trainer)
        assert atomic_load(control, proc.FED) == 300

        atomic_store(control, proc.COUNT, 300 + 10_000 // 2)  # a long portion, closed mid-way
        _until("examples of the third", lambda: _completed(arena) > 310, trainer)
        atomic_store(control, proc.CLOSE, 1)
        _until("the close", lambda: atomic_load(control, proc.CLOSED) == 1, trainer)
        fed = atomic_load(control, proc.FED)
        assert atomic_load(control, proc.COUNT) == fed < 300 + 10_000 // 2
        _until("the examples in flight", lambda: _completed(arena) == fed, trainer)
        time.sleep(0.2)  # nothing more is fed
        assert atomic_load(control, proc.FED) == fed == _completed(arena)
        stats = arena.array("stats")
        assert np.isfinite(stats[:, proc.STAT_LOSS]).all()
    finally:
        trainer._shutdown()
    assert trainer.arena is None and trainer.processes == []
