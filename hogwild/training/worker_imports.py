"""What every worker imports before its first command, imported once by the process it is forked
from, so that every worker it forks starts past it.

Importing this module does the part of a worker's start that is the same for every worker of
every job: it imports numba and numpy, runs numba's one-time initialisation of its CPU target
(the registries it otherwise loads at the first compiled function a process loads) and imports
the modules a worker imports before its first command. A fresh forkserver imports it through
:mod:`hogwild.training.preload`; the job's role server (:mod:`hogwild.cluster.role_server`) and a
``hogwild train`` that forks its workers' forkserver from itself
(:func:`hogwild.training.zygote.fork_server`) import it before they fork.

What differs between jobs is left to the worker itself: it pins itself, attaches its job's
arena and loads the kernels its network calls from numba's cache (which kernels, and with what
types, depends on the job's configuration).

No thread is started, no signal disposition changed and no file or socket opened here: the
processes that import it fork afterwards, and a fork copies only the thread that forks.
"""

import numba  # noqa: F401 - imported for the forked workers
import numpy  # noqa: F401

import hogwild.config  # noqa: F401
import hogwild.data.plan  # noqa: F401
import hogwild.model.compile  # noqa: F401
import hogwild.model.context  # noqa: F401
import hogwild.model.network  # noqa: F401
import hogwild.numa.pinning  # noqa: F401
import hogwild.optim.interval  # noqa: F401
import hogwild.shm.arena  # noqa: F401
import hogwild.store.protocol  # noqa: F401
import hogwild.training.messages  # noqa: F401
import hogwild.training.placement  # noqa: F401
import hogwild.training.worker  # noqa: F401

# numba initialises its target at the first compiled function a process loads or compiles: this
# import does it (after the imports above, whose extensions it loads), once here instead of once
# in every worker
from hogwild import numba_target  # noqa: F401
