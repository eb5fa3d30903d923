"""A worker's training context: every buffer one training step touches, allocated once.

Adam section 3.2.1: each thread allocates its context (activations, their gradients, scratch)
up front so the steady state never allocates. Here a context holds, for each of ``batch`` slots,
one row of activations, one of activation gradients and one int32 row of per-unit scratch
(max-pool arg-max, dropout masks), plus the private gradient vector that accumulates a minibatch
before it is applied to the shared weights. Allocate it after the worker is pinned to its core, so
first touch places the pages on that core's NUMA node.
"""

from dataclasses import dataclass

import numpy as np

from hogwild.model.loops import NO_PROBABILITIES, evaluate_range, train_chunk
from hogwild.model.network import Network
from hogwild.model.passes import stored_rows
from hogwild.optim.rules import moments_size


@dataclass
class TrainingContext:
    act: np.ndarray  # float32 [batch, act_size]
    dact: np.ndarray  # float32 [batch, act_size]
    aux: np.ndarray  # int32 [batch, act_size]
    grad: np.ndarray  # float32 [n_params]
    scratch: np.ndarray  # float32, operands of the batched matrix products (one layer at a time)
    targets: np.ndarray  # int64 [batch], the labels of the minibatch in flight
    moments: np.ndarray  # float32, Adam's m, v and step count (hogwild.optim.rules)

    @classmethod
    def allocate(
        cls,
        network: Network,
        batch: int,
        update_every: int = 1,
        moments: np.ndarray | None = None,
    ) -> "TrainingContext":
        """Allocate and touch every buffer (zeros are written, so the pages are resident).

        One activation row per example of a minibatch, or of a group of examples whose fully
        connected updates are applied together (``update_every``). ``moments``, if given, is
        where Adam's moments live (the worker's row of the job's arena, which the checkpoints
        keep: :mod:`hogwild.training.moments`) instead of a private vector.
        """
        batch = max(batch, update_every)
        size = moments_size(network.n_params)
        if moments is None:
            moments = np.zeros(size, dtype=np.float32)
        elif moments.shape != (size,) or moments.dtype != np.float32:
            raise ValueError(
                f"moments must be float32 of shape ({size},) for this model, got "
                f"{moments.dtype} {moments.shape}"
            )
        return cls(
            act=np.zeros((batch, network.act_size), dtype=np.float32),
            dact=np.zeros((batch, network.act_size), dtype=np.float32),
            aux=np.zeros((batch, network.act_size), dtype=np.int32),
            grad=np.zeros(network.n_params, dtype=np.float32),
            scratch=np.zeros(network.scratch_floats(batch), dtype=np.float32),
            targets=np.zeros(batch, dtype=np.int64),
            moments=moments,
        )

    def train_chunk(
        self,
        ops,
        params,
        velocity,
        images,
        labels,
        order,
        start,
        stop,
        *,
        batch,
        lr,
        mu,
        wd,
        rule,
        mean,
        std,
        update_every,
        beta2=0.999,
        eps=1e-8,
    ) -> tuple[float, int]:
        """:func:`hogwild.model.loops.train_chunk` with this context's buffers.

        Every argument is passed explicitly, ``update_every`` included, so every caller compiles
        (and finds in numba's cache) the same signature. ``beta2`` and ``eps`` are Adam's (with
        ``mu`` its beta1); the other rules ignore them. ``images``: uint8 or float32 rows, passed
        to the kernel as bytes (:func:`hogwild.model.passes.stored_rows`).
        """
        rows, floats = stored_rows(images)
        return train_chunk(
            ops,
            params,
            velocity,
            self.grad,
            self.act,
            self.dact,
            self.aux,
            self.scratch,
            self.targets,
            rows,
            floats,
            labels,
            order,
            start,
            stop,
            batch,
            lr,
            mu,
            wd,
            rule,
            mean,
            std,
            update_every,
            self.moments,
            float(beta2),
            float(eps),
        )

    def evaluate_range(self, ops, params, images, labels, start, stop, mean, std):
        """:func:`hogwild.model.loops.evaluate_range` with this context's buffers: (summed
        loss, number classified correctly) over ``images[start:stop]`` (uint8 or float32 rows)."""
        rows, floats = stored_rows(images)
        return evaluate_range(
            ops,
            params,
            self.act,
            self.aux,
            self.scratch,
            rows,
            floats,
            labels,
            start,
            stop,
            mean,
            std,
            NO_PROBABILITIES,
        )

    @property
    def nbytes(self) -> int:
        buffers = (self.act, self.dact, self.aux, self.grad, self.scratch, self.targets)
        return sum(a.nbytes for a in buffers) + self.moments.nbytes
