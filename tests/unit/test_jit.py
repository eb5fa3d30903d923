"""hogwild.jit: kernels compiled once per argument types, never once per constant."""

from __future__ import annotations

import pytest
from numba import njit, types

from hogwild.jit import compiled_per_type, kernel


@kernel(cache=False)
def _shift(x, by, flag):
    return x + by + (10 if flag else 0)


@njit
def _with_zero(x):
    return _shift(x, 0, True)


@njit
def _with_one(x):
    return _shift(x, 1, False)


def _literal_signatures(dispatcher) -> list:
    return [sig for sig in dispatcher.signatures if any(isinstance(t, types.Literal) for t in sig)]


def test_constants_from_two_callers_share_one_compilation():
    assert _with_zero(5) == 15 and _with_one(5) == 6
    assert _shift.signatures == [(types.int64, types.int64, types.boolean)]
    # numba's own njit would have compiled the callee once per constant
    plain = njit(_shift.py_func)
    njit(lambda x: plain(x, 0, True))(5)
    njit(lambda x: plain(x, 1, False))(5)
    assert len(_literal_signatures(plain)) == 2


def test_an_inlined_function_is_refused():
    with pytest.raises(ValueError, match="inline"):
        kernel(inline="always")


def test_the_engine_passes_are_kernels():
    """The functions the layer passes are called through with constants (offsets of 0,
    ``training``, a first layer of 0) are kernels; the mechanism is the test above's (a cached
    kernel's callees are not compiled again, so this checks the decorators, not the cache)."""
    from hogwild.model import batch_kernels, gemm, loops, passes

    made = compiled_per_type()
    for function in (
        loops.train_chunk,
        loops.evaluate_range,
        passes.forward_batch,
        passes.backward_batch,
        batch_kernels.conv_forward_batch,
        batch_kernels.conv_backward_batch,
        gemm.gemm,
    ):
        assert function in made, function.py_func.__name__
    assert gemm._loops not in made  # its loop nest is compiled per epilogue, on purpose
    # the levels between a pass and the layers' kernels are inlined into the pass, not kernels:
    # each kernel of their own re-optimised every layer kernel below it (a whole compile more)
    for helper in (passes._forward_layers, passes._backward_layers):
        assert helper.targetoptions.get("inline") == "always", helper.py_func.__name__
