"""The sizes of the batched kernels' working memory: plain arithmetic, no compiled code.

A network's plan (:mod:`hogwild.model.network`) and a partition's (:mod:`hogwild.partition.plan`)
lay out each convolution's packed weights and the worker's scratch vector. Those sizes follow
from how :mod:`hogwild.model.gemm` packs a matrix (panels of :data:`MR` rows) and how
:mod:`hogwild.model.batch_kernels` gathers its operands; they live here, beside no kernel, so
that a process that only plans a network (the cluster's driver, ``hogwild info``) loads neither
numba nor the kernels. The kernels import their blocking from here: one source for both.
"""

from __future__ import annotations

# numba freezes MR into the gemm kernels it caches, and a cached kernel is invalidated only when
# its own file changes: with NUMBA_CACHE_DIR set, clear that cache after changing MR
MR = 5  # rows of A per panel of the matrix product (and of a register block of C)


def packed_size(m, k):
    """Floats :func:`hogwild.model.gemm.pack_a` writes for an ``m x k`` matrix (also compiled,
    as :func:`hogwild.model.gemm.packed_size`, for the kernels)."""
    return (m + MR - 1) // MR * MR * k


def packed_conv_weights_size(maps: int, taps: int) -> int:
    """Floats of a convolution's packed weights: ``W`` for the forward product, ``W^T`` for the
    backward one (see :func:`hogwild.model.batch_kernels.pack_conv_weights`)."""
    return int(packed_size(maps, taps) + packed_size(taps, maps))


def batch_scratch_size(layers_dims, batch: int) -> int:
    """Floats of scratch the batched kernels need for ``batch`` examples.

    Args:
        layers_dims: per weighted layer, ``("conv", C, O, Ho*Wo, K)`` or ``("fc", n_in, n_out)``.
        batch: the largest minibatch.
    """
    size = 1
    for dims in layers_dims:
        if dims[0] == "conv":  # one example's unfolded input and its packed output gradient
            _, c, o, plane, k = dims
            size = max(size, c * k * k * plane + packed_size(o, plane))
        else:
            _, n_in, n_out = dims
            size = max(
                size,
                batch * (n_in + n_out),
                packed_size(n_out, batch),
                packed_size(batch, n_out),
            )
    return size
