"""How a replica's layers split over K partitions, and what crosses between them (no I/O).

Adam section 3.2 partitions a model vertically: every layer is cut across the K machines of a
replica, convolutions by output feature maps, fully connected layers by output units. Here each
weighted layer's output units are split into K contiguous ranges (the first ``units % K`` ranges
one unit larger when K does not divide); pooling, activations and dropout follow the maps or units
of the layer they act on; the softmax is done where its inputs meet, by one partition (the
*owner*, partition 0).

A layer that reads its whole input (a weighted layer after the first, and the softmax) is a
**boundary**: forward, each partition needs the slices of the input the others computed (an
all-gather of activations); backward, each partition's slice of the weights gives a *partial*
error for the whole input, and the partition that owns a slice of the input sums everyone's
partials over it (a reduce-scatter of errors). Exactly those values cross, nothing else. The
first weighted layer reads the input image, which every partition has.

Parameters stay in PyTorch layout in one flat vector (``[out, in, kh, kw]``, ``[out, in]``,
``[out]``), so a partition's output rows of a tensor are one contiguous range of it: each partition
gets its own op table (:mod:`hogwild.model.network`'s) whose weight, bias and activation offsets
point at its slices of the whole model's vector and activation blocks, and the existing kernels
run on it unchanged (a partition's slice of a convolution is a convolution with fewer output
maps over the whole input). Checkpoints are therefore the whole model, whatever K.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hogwild.errors import ConfigError
from hogwild.model.network import (
    ALIGN_FLOATS,
    COL_B,
    COL_C,
    COL_FUSED_RELU,
    COL_H,
    COL_HO,
    COL_IN,
    COL_K,
    COL_NEED_DIN,
    COL_O,
    COL_OP,
    COL_OUT,
    COL_PACKED,
    COL_W,
    COL_W_IN,
    COL_WO,
    COL_WORK,
    OP_CONV,
    OP_DROPOUT,
    OP_FC,
    OP_MAXPOOL,
    OP_RELU,
    OP_SIGMOID,
    OP_SOFTMAX,
    OP_TANH,
    Network,
)
from hogwild.model.scratch_sizes import batch_scratch_size, packed_conv_weights_size

SOFTMAX_OWNER = 0
ELEMENT_WISE = (OP_RELU, OP_TANH, OP_SIGMOID, OP_DROPOUT)  # act on the units they follow
FLOAT_BYTES = 4


def split_units(n: int, k: int) -> tuple[tuple[int, int], ...]:
    """``n`` units in ``k`` contiguous ranges, the first ``n % k`` one unit larger."""
    base, extra = divmod(n, k)
    ranges, lo = [], 0
    for p in range(k):
        hi = lo + base + (1 if p < extra else 0)
        ranges.append((lo, hi))
        lo = hi
    return tuple(ranges)


@dataclass(frozen=True)
class LayerSplit:
    """One layer's share per partition.

    Attributes:
        layer: Index in the network.
        name: ``conv1``, ``maxpool``, ``fc2``...
        units: Per partition, the range of output units (maps, or fc units) it computes; the
            softmax's is the whole vector for its owner and empty for the others.
        unit_floats: Floats of the output block per unit (a map's height x width; 1 for fc).
        boundary: The layer reads its whole input, which other partitions computed.
    """

    layer: int
    name: str
    units: tuple[tuple[int, int], ...]
    unit_floats: int
    boundary: bool


@dataclass(frozen=True)
class Boundary:
    """A layer boundary where partitions exchange values.

    Attributes:
        layer: The layer that reads its whole input.
        block: Offset of that input block (floats, within one example's activations).
        slices: Per partition, the float range of the input block it computed (forward) and
            sums the errors of (backward).
        producers: Partitions that compute a slice of the input block (forward all-gather).
        contributors: Partitions whose backward writes a partial error over the whole block.
        forward_bytes: Activation bytes crossing per example.
        backward_bytes: Error bytes crossing per example (0 where no input error is needed).
    """

    layer: int
    block: int
    slices: tuple[tuple[int, int], ...]
    producers: tuple[int, ...]
    contributors: tuple[int, ...]
    forward_bytes: int
    backward_bytes: int


@dataclass(frozen=True)
class PartitionPlan:
    """The whole plan: splits, boundaries, segments and one op table per partition.

    A *segment* is the run of layers between two boundaries, ``segments[i] = (first, last)``;
    boundary ``i`` (``boundaries[i - 1]``) comes before segment ``i``.
    """

    network: Network
    k: int
    layers: tuple[LayerSplit, ...]
    boundaries: tuple[Boundary, ...]
    segments: tuple[tuple[int, int], ...]
    ops: tuple[np.ndarray, ...]  # per partition, int64 [n_layers, N_COLS]
    scratch_floats: tuple[int, ...]  # per partition, for one example

    @property
    def bytes_per_example(self) -> int:
        """Bytes crossing between partitions for one example, forward and backward."""
        return sum(b.forward_bytes + b.backward_bytes for b in self.boundaries)

    def runs_layer(self, partition: int, layer: int) -> bool:
        """Whether ``partition`` has any of ``layer``'s work."""
        lo, hi = self.layers[layer].units[partition]
        return hi > lo

    def param_rows(self, partition: int) -> list[tuple[int, int]]:
        """The ranges of the flat parameter vector ``partition`` owns (updates)."""
        rows = []
        for layer in self.layers:
            r = self.ops[partition][layer.layer]
            if r[COL_W] < 0 or not self.runs_layer(partition, layer.layer):
                continue
            n_w = int(r[COL_O] * r[COL_C] * (r[COL_K] ** 2 if r[COL_OP] == OP_CONV else 1))
            rows += [
                (int(r[COL_W]), int(r[COL_W]) + n_w),
                (int(r[COL_B]), int(r[COL_B] + r[COL_O])),
            ]
        return rows

    def working_sets(self) -> list[list[int]]:
        """Per partition, per layer: bytes of its weights slice, the input it reads and the
        output it writes (one example's forward working set, Adam section 3.2.4)."""
        sets = []
        for p in range(self.k):
            row_sets = []
            for split in self.layers:
                r = self.ops[p][split.layer]
                fused = r[COL_FUSED_RELU] and r[COL_OP] != OP_MAXPOOL  # the pool does its work
                if fused or not self.runs_layer(p, split.layer):
                    row_sets.append(0)
                    continue
                layer = self.network.layers[split.layer]
                lo, hi = split.units[p]
                out_floats = (hi - lo) * split.unit_floats
                in_floats = (
                    int(np.prod(layer.in_shape))
                    if split.boundary or r[COL_W] >= 0
                    else out_floats * int(np.prod(layer.in_shape)) // int(np.prod(layer.out_shape))
                )
                weights = 0
                if r[COL_W] >= 0:
                    taps = r[COL_C] * (r[COL_K] ** 2 if r[COL_OP] == OP_CONV else 1)
                    weights = int(r[COL_O] * taps + r[COL_O])
                row_sets.append(FLOAT_BYTES * (weights + in_floats + out_floats))
            sets.append(row_sets)
        return sets

    def describe(self, caches=()) -> str:
        """The plan as a table: which partition holds what, what crosses, working sets against
        the cache sizes (``caches``: :class:`hogwild.numa.caches.CacheLevel`)."""
        sets = self.working_sets()
        head = f"{'layer':<14} {'units per partition':<28} " + " ".join(
            f"{'ws p' + str(p):>10}" for p in range(self.k)
        )
        lines = [f"Model partitioned over {self.k} partitions", head]
        for split in self.layers:
            units = ",".join(f"{lo}:{hi}" for lo, hi in split.units)
            mark = "| " if split.boundary else "  "
            ws = " ".join(f"{_kib(sets[p][split.layer]):>10}" for p in range(self.k))
            lines.append(f"{mark}{split.name:<12} {units:<28} {ws}")
        lines.append("('|': a boundary, the layer reads the whole input; ws: working set, KiB)")
        for b in self.boundaries:
            name = self.layers[b.layer].name
            lines.append(
                f"boundary before {name}: forward {b.forward_bytes:,} B (activations), "
                f"backward {b.backward_bytes:,} B (errors) per example"
            )
        lines.append(f"bytes crossing per example: {self.bytes_per_example:,}")
        largest = max((max(s) for s in sets), default=0)
        for cache in caches:
            share = cache.size // max(1, min(cache.shared_by, self.k))
            verdict = "fits" if largest <= share else "does not fit"
            lines.append(
                f"largest working set {_kib(largest)} KiB {verdict} in L{cache.level} "
                f"({_kib(cache.size)} KiB, shared by {cache.shared_by} CPUs: "
                f"{_kib(share)} KiB per partition)"
            )
        return "\n".join(lines)


def _kib(n: int) -> str:
    return f"{n / 1024:,.1f}"


def _align(n: int) -> int:
    return (n + ALIGN_FLOATS - 1) // ALIGN_FLOATS * ALIGN_FLOATS


def plan_partitions(network: Network, k: int) -> PartitionPlan:
    """Split ``network`` over ``k`` partitions.

    Raises:
        ConfigError: ``k`` is not positive, a weighted layer has fewer output units than ``k``
            (the message names it), or a layer other than conv / fc comes before the first
            weighted layer (it would act on the input, which no partition owns).
    """
    if not isinstance(k, int) or k < 1:
        raise ConfigError(f"model.partitions must be a positive integer, got {k!r}")
    ops = [network.ops.copy() for _ in range(k)]
    splits: list[LayerSplit] = []
    boundaries: list[Boundary] = []
    current: tuple[tuple[int, int], ...] | None = None  # units of the block being passed on
    unit_floats = 0
    seen_weighted = False
    for layer in network.layers:
        i, op = layer.index, int(network.ops[layer.index, COL_OP])
        base = network.ops[i]
        boundary = False
        if op in (OP_CONV, OP_FC):
            units = int(base[COL_O])
            if units < k:
                raise ConfigError(
                    f"model.partitions = {k} exceeds the {units} output "
                    f"{'maps' if op == OP_CONV else 'units'} of {layer.name} "
                    f"(model.layers[{i}]): every partition needs at least one"
                )
            boundary = seen_weighted
            if boundary:
                boundaries.append(_boundary(network, i, current, unit_floats, k, tuple(range(k))))
            seen_weighted = True
            current = split_units(units, k)
            unit_floats = int(base[COL_HO] * base[COL_WO]) if op == OP_CONV else 1
            for p, (lo, hi) in enumerate(current):
                r = ops[p][i]
                taps = int(base[COL_C] * (base[COL_K] ** 2 if op == OP_CONV else 1))
                r[COL_W] += lo * taps
                r[COL_B] += lo
                r[COL_O] = hi - lo
                r[COL_OUT] += lo * unit_floats
            splits.append(LayerSplit(i, layer.name, current, unit_floats, boundary))
            continue
        if current is None:
            raise ConfigError(
                f"model.partitions = {k} needs a conv or fc layer first; model.layers[{i}] "
                f"({layer.config.type}) acts on the input, which no partition owns"
            )
        if op == OP_SOFTMAX:
            owner = SOFTMAX_OWNER
            boundaries.append(_boundary(network, i, current, unit_floats, k, (owner,)))
            whole = int(base[COL_C])
            units = tuple((0, whole) if p == owner else (0, 0) for p in range(k))
            splits.append(LayerSplit(i, "softmax", units, 1, True))
            current, unit_floats = units, 1
            continue
        if op == OP_MAXPOOL:
            in_plane = int(base[COL_H] * base[COL_W_IN])
            out_plane = int(base[COL_HO] * base[COL_WO])
            for p, (lo, hi) in enumerate(current):
                r = ops[p][i]
                r[COL_C] = r[COL_O] = hi - lo
                r[COL_IN] += lo * in_plane
                r[COL_OUT] += lo * out_plane
            unit_floats = out_plane
        elif op in ELEMENT_WISE:
            for p, (lo, hi) in enumerate(current):
                r = ops[p][i]
                r[COL_C] = r[COL_O] = (hi - lo) * unit_floats
                r[COL_IN] += lo * unit_floats
                r[COL_OUT] += lo * unit_floats
        else:  # a layer kind this plan does not know how to split: refused, not guessed
            raise ConfigError(
                f"model.partitions = {k} cannot split model.layers[{i}] ({layer.config.type}) "
                "yet: partitioned models use conv, fc, maxpool, relu, tanh, sigmoid, dropout "
                "and softmax"
            )
        name = layer.config.type + ("(fused)" if base[COL_FUSED_RELU] and op != OP_MAXPOOL else "")
        splits.append(LayerSplit(i, name, current, unit_floats, False))
    scratch = [_relayout_scratch(network, table) for table in ops]
    edges = [b.layer for b in boundaries]
    firsts = [0, *edges]
    segments = tuple(zip(firsts, [*edges, len(network.layers)], strict=True))
    return PartitionPlan(
        network, k, tuple(splits), tuple(boundaries), segments, tuple(ops), tuple(scratch)
    )


def _boundary(network, layer, units, unit_floats, k, contributors) -> Boundary:
    """The exchange before ``layer``, whose input block the partitions computed in ``units``."""
    block = int(network.ops[layer, COL_IN])
    slices = tuple((lo * unit_floats, hi * unit_floats) for lo, hi in units)
    total = slices[-1][1]
    producers = tuple(p for p in range(k) if slices[p][1] > slices[p][0])
    # forward: each reader fetches what it did not compute (the softmax's owner alone reads)
    readers = contributors
    forward = sum(total - (slices[p][1] - slices[p][0]) for p in readers)
    # backward: each slice's owner reads the partials of every other contributor over it
    backward = sum(
        (slices[q][1] - slices[q][0]) * len([p for p in contributors if p != q]) for q in range(k)
    )
    need_din = bool(network.ops[layer, COL_NEED_DIN])
    return Boundary(
        layer,
        block,
        slices,
        producers,
        contributors,
        FLOAT_BYTES * forward,
        FLOAT_BYTES * backward if need_din else 0,
    )


def _relayout_scratch(network: Network, table: np.ndarray) -> int:
    """Give a partition's convolutions packed-weight room for their own output maps (in place,
    as :func:`hogwild.model.network.build_network` does for the whole model); its scratch
    floats for one example."""
    cursor = 0
    dims = []
    for r in table:
        if r[COL_OP] == OP_CONV:
            r[COL_PACKED] = cursor
            taps = int(r[COL_C] * r[COL_K] * r[COL_K])
            cursor = _align(cursor + packed_conv_weights_size(int(r[COL_O]), taps))
            dims.append(
                ("conv", int(r[COL_C]), int(r[COL_O]), int(r[COL_HO] * r[COL_WO]), int(r[COL_K]))
            )
        elif r[COL_OP] == OP_FC:
            dims.append(("fc", int(r[COL_C]), int(r[COL_O])))
    table[:, COL_WORK] = cursor
    return cursor + batch_scratch_size(tuple(dims), 1)
