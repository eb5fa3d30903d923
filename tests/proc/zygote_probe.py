"""What the forkserver's children run in tests/proc/test_zygote.py, apart from the test module.

A child unpickles its target by importing the target's module. Kept here, with nothing heavier
than what the server has already imported, a child that only reports its environment or stands
in for a pinned worker does not import pytest, the test module and what that imports (a spawned
child would import them into a fresh interpreter) before doing its few lines.
"""

from __future__ import annotations

import os
import time

PROBE = "HOGWILD_ZYGOTE_PROBE"
REPLY_TIMEOUT_S = 60.0


def report_environment(replies, hold) -> None:
    """A forked child's answer: the probe variable, its parent, its BLAS limit; then, if asked,
    wait until ``hold`` is set (a child the server still has)."""
    replies.put((os.environ.get(PROBE), os.getppid(), os.environ.get("OMP_NUM_THREADS")))
    if hold is not None:
        hold.wait(REPLY_TIMEOUT_S)


def pinned_then_sleeping(worker, commands, results) -> None:
    """A worker that says it is pinned and then runs on (one forked, not yet in its main)."""
    from hogwild.training.messages import Pinned  # here: report_environment needs no numpy

    results.put(Pinned(worker))
    time.sleep(REPLY_TIMEOUT_S)
