"""Pools of spawned helper processes (image decoders, augmentation renderers) that die with us.

Helpers are started with spawn -- never fork: the parent may hold LMDB environments, numba's
threading layer or live threads, none of which survive fork. Each helper ignores Ctrl-C (its
parent owns shutdown and stops the pool) and asks Linux for SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``), so a parent killed with SIGKILL leaves no helper behind.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from concurrent.futures import ProcessPoolExecutor

from hogwild.signals import die_with_parent


def helper_init() -> None:
    """Run first in every helper: die with the parent, leave Ctrl-C to it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(signal.SIGKILL)  # not Linux: helpers still end when the pool is shut down


def spawn_pool(processes: int) -> ProcessPoolExecutor:
    """A process pool of ``processes`` spawned helpers (see the module docstring)."""
    return ProcessPoolExecutor(
        max(1, processes), mp_context=mp.get_context("spawn"), initializer=helper_init
    )
