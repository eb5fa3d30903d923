"""The shard operations a Sandblaster coordinator issues, on the servers and in memory for tests.

DistBelief's appendix: L-BFGS decomposes into scalar-vector products and inner products of
vectors as long as the parameters; if every shard always holds the same slice of every vector,
each operation runs on each shard's slice with no vector crossing the network, and only the
scalar results (partial dot products and norms, combined by the caller) travel. Besides ``dot``,
the reductions ``asum`` (an L1 norm) and ``amax`` (max-abs) give ``torch.optim.LBFGS``'s first
step and stopping tests.

:class:`VectorOps` is that set of operations; a coordinator written against it moves only
scalars. :class:`ShardVectors` runs them on the parameter servers' named vectors (``"params"``
is the parameters) through a client's one generic request
(:meth:`~hogwild_plugins.ps.client.PSClient.vector_op`), combining the shards' partial results
here: sums for ``dot`` and ``asum``, the maximum for ``amax``.

:class:`LocalVectors` keeps the named vectors in this process with the shards' arithmetic
(float32 vectors, the scalar rounded to float32 before it multiplies, dot products and ``asum``
summed in float64), so the L-BFGS logic is testable without a server, and a test can predict
the servers' results bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from hogwild_plugins.ps.client import PSClient

__all__ = ["LocalVectors", "ShardVectors", "VectorOps"]


class VectorOps(Protocol):
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


class ShardVectors:
    """:class:`VectorOps` on the parameter servers, through ``client`` (which it does not own:
    closing the client is its owner's business).

    Each call is one ``VECTOR_OP`` request per shard, all at once; a vector is created (zeros)
    on each shard the first time it is named.
    """

    def __init__(self, client: PSClient) -> None:
        self.client = client

    def dot(self, x: str, y: str) -> float:
        return float(self.client.vector_op("dot", x, y).sum())

    def asum(self, x: str) -> float:
        return float(self.client.vector_op("asum", x).sum())

    def amax(self, x: str) -> float:
        """The largest of the shards' maxima (NaN if any shard holds a NaN)."""
        return float(self.client.vector_op("amax", x).max())

    def axpy(self, alpha: float, x: str, y: str) -> None:
        self.client.vector_op("axpy", x, y, alpha=alpha)

    def scale(self, alpha: float, x: str) -> None:
        self.client.vector_op("scale", x, alpha=alpha)

    def copy(self, x: str, y: str) -> None:
        self.client.vector_op("copy", x, y)

    def mul(self, x: str, y: str, z: str) -> None:
        """``z = x * y`` (element by element)."""
        self.client.vector_op("mul", x, y, z)

    def fill(self, x: str, alpha: float) -> None:
        self.client.vector_op("fill", x, alpha=alpha)


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
