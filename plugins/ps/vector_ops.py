"""The parameter server's vector operations (Sandblaster's, on named vectors): their codes on the
wire, their names and how many named vectors each takes.

Clients, the request checks and the driver need this vocabulary without the kernels that carry
the operations out (:func:`hogwild_plugins.ps.kernels.vector_op`): it lives here, beside no
numba, so that a process that only sends or checks a request loads none.
"""

from __future__ import annotations

OP_DOT, OP_AXPY, OP_SCALE, OP_COPY, OP_MUL, OP_FILL, OP_ASUM, OP_AMAX = 1, 2, 3, 4, 5, 6, 7, 8
VECTOR_OPS = {
    "dot": OP_DOT,
    "axpy": OP_AXPY,
    "scale": OP_SCALE,
    "copy": OP_COPY,
    "mul": OP_MUL,
    "fill": OP_FILL,
    "asum": OP_ASUM,
    "amax": OP_AMAX,
}
OP_OPERANDS = {
    OP_DOT: 2,
    OP_AXPY: 2,
    OP_SCALE: 1,
    OP_COPY: 2,
    OP_MUL: 3,
    OP_FILL: 1,
    OP_ASUM: 1,
    OP_AMAX: 1,
}
"""Named vectors each operation takes (see :func:`hogwild_plugins.ps.kernels.vector_op`)."""
