"""Versions and admission of a server's shards: the state machine, with no I/O and no threads.

Every change to a shard (a pushed delta, a layer's vectors, an assignment, a vector operation on
the parameters) gets the shard's next version when it is admitted, in arrival order; the update
thread that owns the shard applies changes in that same order, so a change admitted as version
``v`` is exactly the ``v``-th change applied (versions grow by one per applied update).

Admission of a push computes its staleness ``j - i`` from the shard's version ``j`` when it will
be applied and the basis ``i`` it was computed against (Chan & Lane section 3.6), adds it to the
histogram, refuses it when ``max_staleness > 0`` and it is staler (counted), and gives the
coefficient the rule scales it by: ``decay ** (j - i)`` for the staleness rule, 1 otherwise. A
basis ahead of the shard (a server restarted from an older flush than the client last saw)
counts as staleness 0 and is counted apart.

The network thread owns a :class:`ShardBook` and feeds it events (:meth:`admit`, :meth:`bump`);
replication wraps the same book: a primary admits, secondaries replay the versions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["Admission", "ShardBook", "staleness_bin", "STALENESS_BINS"]

STALENESS_BINS = 16
"""Histogram bins: staleness 0, 1, 2-3, 4-7, ..., and 2^14 or more in the last."""


def staleness_bin(staleness: int) -> int:
    """The histogram bin of a staleness (0 -> 0, 1 -> 1, 2..3 -> 2, 4..7 -> 3, ...)."""
    return min(STALENESS_BINS - 1, staleness.bit_length())


def bin_label(index: int) -> str:
    if index == 0:
        return "0"
    lo, hi = 1 << (index - 1), (1 << index) - 1
    if index == STALENESS_BINS - 1:
        return f"{lo}+"
    return str(lo) if lo == hi else f"{lo}-{hi}"


@dataclass(frozen=True)
class Admission:
    """What the book decided about one push.

    Attributes:
        accepted: False when refused as too stale.
        version: The version the update produces (accepted), else the shard's current one.
        staleness: ``j - i`` (0 without a basis or with a basis ahead of the shard).
        coef: The factor the rule applies to the delta.
    """

    accepted: bool
    version: int
    staleness: int
    coef: float


class ShardBook:
    """Versions, staleness histogram and refusals of the shards one server holds.

    Args:
        versions: ``{shard: version}`` of every shard held (0 for new ones).
        staleness_rule: True when the rule decays stale deltas (``ps.rule = "staleness"``).
        decay: ``ps.staleness_decay`` (beta).
        max_staleness: Refuse pushes staler than this (0: never).
    """

    def __init__(
        self,
        versions: Mapping[int, int],
        *,
        staleness_rule: bool = False,
        decay: float = 1.0,
        max_staleness: int = 0,
    ) -> None:
        self._versions = dict(versions)
        self.staleness_rule, self.decay, self.max_staleness = staleness_rule, decay, max_staleness
        self.histogram = [0] * STALENESS_BINS
        self.refused = 0
        self.ahead = 0
        self.admitted = 0

    @property
    def shards(self) -> Iterable[int]:
        return self._versions.keys()

    def holds(self, shard: int) -> bool:
        return shard in self._versions

    def version(self, shard: int) -> int:
        return self._versions[shard]

    def versions(self) -> dict[int, int]:
        return dict(self._versions)

    def admit(self, shard: int, basis: int | None) -> Admission:
        """A push to ``shard`` computed against version ``basis`` (None: unknown)."""
        current = self._versions[shard]
        if basis is None:
            staleness = 0
        elif basis > current:
            staleness = 0
            self.ahead += 1
        else:
            staleness = current - basis
        self.histogram[staleness_bin(staleness)] += 1
        if self.max_staleness and staleness > self.max_staleness:
            self.refused += 1
            return Admission(False, current, staleness, 0.0)
        coef = self.decay**staleness if self.staleness_rule else 1.0
        self._versions[shard] = current + 1
        self.admitted += 1
        return Admission(True, current + 1, staleness, coef)

    def bump(self, shard: int) -> int:
        """A change without staleness (an assignment, an operation on the parameters)."""
        self._versions[shard] += 1
        self.admitted += 1
        return self._versions[shard]

    def set_version(self, shard: int, version: int) -> None:
        """A copy committed (or restored) ``shard`` at ``version`` (replication)."""
        self._versions[shard] = version

    def histogram_labels(self) -> dict[str, int]:
        """The staleness histogram with readable bin labels (empty bins left out)."""
        return {bin_label(i): n for i, n in enumerate(self.histogram) if n}
