"""Fault injection, a few trials of ``bench/figures/chaos_train.py`` in the suite (the bench runs
200).

``hogwild train`` is sent SIGKILL, SIGTERM or SIGINT, to the parent or a worker, at random
moments from its first second on (start-up included, where SIGTERM used to leave the arena in
``/dev/shm``): nothing may be left behind, no segment and no process, and the exit status must
be the one a user is promised.
"""

from __future__ import annotations

import json

import pytest

from bench.figures.chaos_train import run_trials


@pytest.mark.slow
def test_random_signals_at_random_moments_leave_nothing_behind(mnist_dir):
    summary = run_trials(trials=5, data=mnist_dir, seed=20261123, max_delay=4.0)
    assert summary["failing"] == [], json.dumps(summary["failing"])  # whole, status included
    assert summary["leaked_segments"] == 0 and summary["leftover_processes"] == 0
