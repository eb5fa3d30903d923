"""One partition's share of a training step, stage by stage, on the existing kernels.

A partition runs its op table (:class:`hogwild.partition.plan.PartitionPlan`) one *segment* at a
time (the layers between two boundaries) with :func:`hogwild.model.passes.forward_batch` and
:func:`~hogwild.model.passes.backward_batch` on one example. The activations of an example are
one row that every partition reads and writes in place (each writes only its slices), so the
forward boundary needs no copy: once every producer has written its slice, the next segment
reads the whole block. Backward, each partition writes its partial error over a boundary's whole
input block into its own error row; :func:`reduce_errors` then sums, into a partition's own row,
the contributors' partials over the slice it owns (the reduce-scatter). Nothing else crosses.

:class:`SequentialReplica` runs all K partitions in one process in a valid order: the reference
the tests compare with the unpartitioned model and PyTorch, and the way to reason about the
runtime (:mod:`hogwild.partition.runtime`), which runs the same stages in K processes.
"""

from __future__ import annotations

import numpy as np

from hogwild.jit import kernel
from hogwild.model.passes import FC_ACCUMULATE, FC_SGD_IN_PLACE, backward_batch, forward_batch
from hogwild.partition.plan import PartitionPlan


@kernel(cache=True, nogil=True)
def reduce_errors(dact, q, lo, hi, contributors):
    """``dact[q, lo:hi] = sum of dact[p, lo:hi]`` over ``contributors`` (``q`` among them or
    not): the errors of partition ``q``'s slice of a boundary's input block."""
    for i in range(lo, hi):
        total = np.float32(0.0)
        for j in range(contributors.shape[0]):
            total += dact[contributors[j], i]
        dact[q, i] = total


def fc_update_mode(rule: str) -> tuple[int, bool]:
    """How a partition updates its fully connected weights under ``optim.rule``: the backward
    pass's ``fc_mode``, and whether :func:`~hogwild.model.update.apply_update` updates them after
    the pass. Per-example ``"sgd"`` updates each row as the pass streams it (one pass over the
    rows instead of a gradient buffer written, then read again with the weights: what made two
    partitions of a wide model run at half the speed of one process); the other rules (momentum)
    take the gradient, then the update."""
    if rule == "sgd":
        return FC_SGD_IN_PLACE, False
    return FC_ACCUMULATE, True


class PartitionStages:
    """Partition ``p``'s op-table segments, ready to run (contiguous copies, made once)."""

    def __init__(self, plan: PartitionPlan, p: int):
        self.plan, self.p = plan, p
        self.segments = [np.ascontiguousarray(plan.ops[p][a:b]) for a, b in plan.segments]
        self.runs = [
            any(plan.runs_layer(p, layer) for layer in range(a, b)) for a, b in plan.segments
        ]
        self.contributors = [
            np.asarray(boundary.contributors, dtype=np.int64) for boundary in plan.boundaries
        ]
        self.target = np.zeros(1, dtype=np.int64)

    def forward(self, s: int, params, act, aux, scratch, training: bool) -> None:
        """Segment ``s`` forward on the example in ``act`` (shape ``[1, act_size]``)."""
        if self.runs[s]:
            forward_batch(self.segments[s], params, act, aux, scratch, 1, training)

    def backward(
        self,
        s: int,
        params,
        act,
        dact,
        aux,
        scratch,
        grad,
        label: int,
        fc_mode: int = FC_ACCUMULATE,
        lr: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        """Segment ``s`` backward; parameter gradients into ``grad`` (only this partition's
        rows), the partial error of the segment's input block into ``dact``.

        ``fc_mode`` is :func:`~hogwild.model.passes.backward_batch`'s: ``FC_ACCUMULATE`` (the
        reference) adds the fully connected weights' gradient to ``grad`` too;
        ``FC_SGD_IN_PLACE`` applies per-example SGD (``lr``, ``weight_decay``) to each of this
        partition's rows as the pass streams it, as the unpartitioned engine does at batch 1.
        """
        if self.runs[s]:
            self.target[0] = label
            backward_batch(
                self.segments[s],
                params,
                act,
                dact,
                aux,
                scratch,
                grad,
                self.target,
                1,
                fc_mode,
                lr,
                1.0 - lr * weight_decay,  # the kernel's decay factor of each row
            )

    def reduce(self, s: int, dact_all) -> None:
        """Sum the partials crossing boundary ``s`` (before segment ``s``, ``s >= 1``) over this
        partition's slice, into its own row of ``dact_all`` (``[K, act_size]``)."""
        boundary = self.plan.boundaries[s - 1]
        lo, hi = boundary.slices[self.p]
        if hi > lo:
            reduce_errors(
                dact_all, self.p, boundary.block + lo, boundary.block + hi, self.contributors[s - 1]
            )


class SequentialReplica:
    """K partitions run one after the other in this process, with the runtime's buffers: one
    shared activation row, one error row per partition."""

    def __init__(self, plan: PartitionPlan):
        size = plan.network.act_size
        self.plan = plan
        self.stages = [PartitionStages(plan, p) for p in range(plan.k)]
        self.act = np.zeros((1, size), dtype=np.float32)
        self.dact = np.zeros((plan.k, size), dtype=np.float32)
        self.aux = np.zeros((plan.k, size), dtype=np.int32)
        self.scratch = [np.zeros(n, dtype=np.float32) for n in plan.scratch_floats]

    def step(self, params, example: np.ndarray, label: int, grads, training=False, sgd=None):
        """Forward and backward one (normalised) example; each partition's parameter gradients
        are added to ``grads[p]``. Returns the activation row.

        ``sgd``: None, or ``(lr, weight_decay)`` to apply per-example SGD to the fully connected
        weights as the backward pass streams them, as the partition processes do with
        ``optim.rule = "sgd"`` (their gradients are then not added to ``grads``).

        ``params`` is the model, or a list of K copies of it, partition ``p`` reading only
        ``params[p]``: a replica spread over hosts, each host's arena holding its own copy.
        """
        plan, k = self.plan, self.plan.k
        copies = params if isinstance(params, list) else [params] * k
        if len(copies) != k:
            raise ValueError(f"params: {len(copies)} copies of the model, expected one or {k}")
        fc_update = (FC_ACCUMULATE,) if sgd is None else (FC_SGD_IN_PLACE, *sgd)
        self.act[0, : example.size] = example
        n_seg = len(plan.segments)
        for s in range(n_seg):
            for p in range(k):
                self.stages[p].forward(
                    s, copies[p], self.act, self.aux[p : p + 1], self.scratch[p], training
                )
        for s in range(n_seg - 1, -1, -1):
            for p in range(k):
                if s < n_seg - 1:
                    self.stages[p].reduce(s + 1, self.dact)
            for p in range(k):
                self.stages[p].backward(
                    s,
                    copies[p],
                    self.act,
                    self.dact[p : p + 1],
                    self.aux[p : p + 1],
                    self.scratch[p],
                    grads[p],
                    label,
                    *fc_update,
                )
        return self.act[0]
