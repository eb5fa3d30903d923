"""What the replicated parameter-server tests share: a client streaming acknowledged steps on a
thread while the test kills, pauses or restarts servers, and a wait for the bucket map.

:class:`Stream` calls ``step(rng)`` over and over on its own thread until the ``with`` block
ends (then it is stopped and joined, bounded); ``step`` returns only once its update was
acknowledged, and the caller's ledger is updated inside it, so ``steps`` counts acknowledged
steps. An exception ends the stream and is kept in ``problems`` for the test to report.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

JOIN_S = 120.0
PROGRESS_S = 60.0


class Stream:
    """Acknowledged steps on a thread (see the module docstring)."""

    def __init__(self, step: Callable[[np.random.Generator], None], seed: int) -> None:
        self.step, self.seed = step, seed
        self.steps = 0
        self.problems: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        rng = np.random.default_rng(self.seed)
        try:
            while not self._stop.is_set():
                self.step(rng)
                self.steps += 1
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.problems.append(exc)

    def __enter__(self) -> Stream:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(JOIN_S)

    def progress(self, more: int, what: str, deadline: float | None = None) -> None:
        """Wait for ``more`` acknowledged steps (or a problem), until ``deadline`` (monotonic;
        default: PROGRESS_S from now); past it, the test fails saying ``what``."""
        floor = self.steps + more
        deadline = time.monotonic() + PROGRESS_S if deadline is None else deadline
        while self.steps < floor and not self.problems:
            assert time.monotonic() < deadline, what
            time.sleep(0.02)


def placed(routes, expected: list, what: str, timeout: float = 60.0) -> float:
    """Seconds until the map names ``expected`` as every bucket's primary."""
    start = time.monotonic()
    while True:
        routes.read()
        if routes.primaries == expected:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"{what}: {routes.primaries} != {expected}"
        time.sleep(0.02)
