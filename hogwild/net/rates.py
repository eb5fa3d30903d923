"""How fast a serving role's running counters grow, for its status.

A long-lived role (a parameter server, a data server) counts what it did since it started
(requests, updates, records, bytes). Its network thread ticks a :class:`RateMeter` now and then;
at most every ``every_s`` seconds the meter reads the counters and keeps, per counter, the rate
per second between that reading and the one before. ``status()`` reads :attr:`RateMeter.rates`
from any thread: the meter replaces its reading as one tuple, so a reader never sees half of
one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["RateMeter"]


class RateMeter:
    """The rates per second of ``counters`` running counts (see the module docstring).

    Args:
        counters: How many counts each reading holds.
        started_at: When the counts were all zero (``time.monotonic()``).
        every_s: The least time between two readings.

    Raises:
        ValueError: ``counters`` below 1 or ``every_s`` not positive.
    """

    def __init__(self, counters: int, started_at: float, every_s: float = 1.0) -> None:
        if counters < 1:
            raise ValueError(f"a rate meter needs at least one counter, not {counters}")
        if not every_s > 0:
            raise ValueError(f"a rate meter's every_s must be > 0 seconds, not {every_s}")
        self.counters, self.every_s = counters, every_s
        # (when, the counts then, the rates up to then): replaced whole, read from any thread
        self._reading = (started_at, (0,) * counters, (0.0,) * counters)

    def tick(self, now: float, read: Callable[[], Sequence[float]]) -> None:
        """At ``now``: if ``every_s`` has passed since the last reading, take the counts from
        ``read()`` and measure each counter's rate since then (else ``read`` is not called).

        Raises:
            ValueError: ``read()`` returned another number of counts than ``counters``.
        """
        then, before, _ = self._reading
        if now - then < self.every_s:
            return
        counts = tuple(read())
        if len(counts) != self.counters:
            raise ValueError(
                f"a rate meter of {self.counters} counters read {len(counts)} counts: {counts}"
            )
        elapsed = now - then
        rates = tuple((count - old) / elapsed for count, old in zip(counts, before, strict=True))
        self._reading = (now, counts, rates)

    @property
    def rates(self) -> tuple[float, ...]:
        """Each counter's growth per second between the last two readings (zeros before the
        first)."""
        return self._reading[2]
