"""The engine's kernels are compiled once per set of argument types, not once per constant.

Numba compiles a jitted function that another one calls with a constant (``f(x, 0)``,
``g(y, True)``) for that constant's literal type: ``Literal[int](0)`` and ``Literal[bool](True)``
are types of their own, so every combination of constants at every call site is a compilation of
the callee, and of everything it calls with those arguments. The engine's layer passes are called
with offsets of 0, ``training`` True or False and first layers of 0 from many places: the cold
compile of one training step and one evaluation of Adam's MNIST model at batch 1 compiled the
forward pass 7 times and the backward pass 6; compiled per type, once each, it takes a good deal
less (``bench/figures/cold_compile.py`` measures both). That compile is the first run of every
fresh install, and of every cluster role started with an empty cache.

:func:`kernel` is ``numba.njit`` whose calls from compiled code (any jitted caller) are typed
without literal types, so a constant argument takes the compilation its type already has; such a
function cannot ask for a literal (``numba.literally``). Functions whose speed depends on a
constant being known when they are compiled keep ``numba.njit``: the matrix product's loop nest
and epilogue, compiled per mode (:mod:`hogwild.model.gemm`); and the inlined helpers, typed in
their callers. The direct convolutions' register blocks (:mod:`hogwild.model.conv_direct`) keep
it too: their arguments are run-time values today, and they are the inner loops.
"""

from __future__ import annotations

from collections.abc import Callable

from numba import njit
from numba.core import types

__all__ = ["compiled_per_type", "kernel"]

_KERNELS: list = []  # every dispatcher kernel() made, in definition order


def kernel(**options) -> Callable:
    """``numba.njit(**options)``, compiled once per argument types when called from compiled code.

    For inlined functions (``inline="always"``) use ``numba.njit``: they are typed at each call
    site as part of their caller.
    """
    if options.get("inline", "never") != "never":
        raise ValueError("kernel: an inlined function is typed in its caller; use numba.njit")

    def decorate(function):
        dispatcher = njit(**options)(function)
        resolve = dispatcher.get_call_template

        def get_call_template(args, kws):
            # How a call from compiled code finds (compiling if needed) the callee's version for
            # its argument types; a literal type is widened to its type before that.
            args = tuple(types.unliteral(a) for a in args)
            return resolve(args, {k: types.unliteral(v) for k, v in kws.items()})

        dispatcher.get_call_template = get_call_template
        _KERNELS.append(dispatcher)
        return dispatcher

    return decorate


def compiled_per_type() -> tuple:
    """The dispatchers :func:`kernel` made so far (those of the modules imported)."""
    return tuple(_KERNELS)
