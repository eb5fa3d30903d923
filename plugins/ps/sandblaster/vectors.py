"""The shard operations a Sandblaster coordinator issues, and an in-memory stand-in for tests.

DistBelief's appendix: L-BFGS decomposes into scalar-vector products and inner products of
vectors as long as the parameters; if every shard always holds the same slice of every vector,
each operation runs on each shard's slice with no vector crossing the network, and only the
scalar results (partial dot products and norms, combined by the caller) travel. Besides ``dot``,
the reductions ``asum`` (an L1 norm) and ``amax`` (max-abs) give ``torch.optim.LBFGS``'s first
step and stopping tests. :class:`ShardVectors` is that
set of operations as :class:`~hogwild_plugins.ps.client.PSClient` offers them on the parameter
servers' named vectors (``"params"`` is the parameters); a coordinator written against it moves
only scalars.

:class:`LocalVectors` keeps the named vectors in this process with the shards' arithmetic
(float32 vectors, the scalar rounded to float32 before it multiplies, dot products and ``asum``
summed in float64), so the L-BFGS logic is testable without a server, and a test can predict
the servers' results bit for bit.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

__all__ = ["LocalVectors", "ShardVectors"]


class ShardVectors(Protocol):
    """Operations on named vectors that every shard runs on its own slice."""

    def dot(self, x: str, y: str) -> float:
        """``x . y`` (the sum of the shards' partial dot products)."""

    def asum(self, x: str) -> float:
        """``sum |x_i|`` (the sum of the shards' partial sums)."""

    def amax(self, x: str) -> float:
        """``max |x_i|`` (the largest of the shards' maxima)."""

    def axpy(self, alpha: float, x: str, y: str) -> None:
        """``y += alpha * x``."""

    def scale(self, alpha: float, x: str) -> None:
        """``x *= alpha``."""

    def copy(self, x: str, y: str) -> None:
        """``y = x``."""

    def fill(self, x: str, alpha: float) -> None:
        """``x = alpha`` (every element)."""


class LocalVectors:
    """Named float32 vectors in this process, with the shard kernels' arithmetic.

    Args:
        params: The initial parameters (copied, as float32); every other name starts as zeros
            the first time it is used, as on the servers.
    """

    def __init__(self, params: np.ndarray) -> None:
        self.vectors = {"params": np.array(params, dtype=np.float32)}
        self.n = self.vectors["params"].size
        self.ops = 0

    def __getitem__(self, name: str) -> np.ndarray:
        vector = self.vectors.get(name)
        if vector is None:
            vector = self.vectors[name] = np.zeros(self.n, np.float32)
        return vector

    def dot(self, x: str, y: str) -> float:
        self.ops += 1
        return float(np.dot(self[x].astype(np.float64), self[y].astype(np.float64)))

    def asum(self, x: str) -> float:
        self.ops += 1
        return float(np.abs(self[x].astype(np.float64)).sum())

    def amax(self, x: str) -> float:
        self.ops += 1
        return float(np.abs(self[x]).max(initial=0.0))

    def axpy(self, alpha: float, x: str, y: str) -> None:
        self.ops += 1
        target = self[y]
        target += np.float32(alpha) * self[x]

    def scale(self, alpha: float, x: str) -> None:
        self.ops += 1
        target = self[x]
        target *= np.float32(alpha)

    def copy(self, x: str, y: str) -> None:
        self.ops += 1
        self[y][:] = self[x]

    def fill(self, x: str, alpha: float) -> None:
        self.ops += 1
        self[x][:] = np.float32(alpha)
