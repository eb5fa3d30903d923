"""The parameter server's code and kernels, loaded by importing this module.

For a forkserver that starts parameter servers (:func:`bench.support.child_server.warm_forkserver`
in ``bench/figures/adam_fig9_ps.py``): imported there once, it loads the server's modules and its
kernels from numba's cache, so that every server forked from it starts with them, where a spawned
one spent about 2 CPU-seconds on them. They are compiled (or loaded) under the parameter server's
own compile lock, so that concurrent jobs never write one numba cache together. The kernels are not
parallel: numba starts no thread; numpy's OpenBLAS pool is ended by its own atfork handler at each
fork, so the forkserver may fork.
"""

from __future__ import annotations

from hogwild_plugins.ps.kernels import compile_kernels
from hogwild_plugins.ps.serving.server import ParameterServer

from hogwild.locks import compile_lock

__all__ = ["ParameterServer"]

with compile_lock(kernels="ps-kernels"):  # as the server compiles them (server.py)
    compile_kernels()
