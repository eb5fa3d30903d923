"""The parameter server's code and kernels, loaded by importing this module.

For a forkserver that starts parameter servers (:func:`bench.support.child_server.warm_forkserver`
in ``bench/figures/adam_fig9_ps.py``): imported there once, it loads the server's modules and its
kernels from numba's cache, so that every server forked from it starts with them, where a spawned
one spent about 2 CPU-seconds on them. The kernels are not parallel: loading and running them once
leaves no thread behind, so the forkserver may fork.
"""

from __future__ import annotations

from hogwild_plugins.ps.kernels import compile_kernels
from hogwild_plugins.ps.serving.server import ParameterServer

__all__ = ["ParameterServer"]

compile_kernels()
