"""What a worker forkserver imports once, so that every worker it forks starts past it.

Importing this module does the part of a worker's start that is the same for every worker of
every job: it imports numba and numpy, runs numba's one-time initialisation of its CPU target
(the registries it otherwise loads at the first compiled function a process loads) and imports
the modules a worker imports before its first command. :mod:`hogwild.training.zygote` names it
as the forkserver's preload, and :mod:`hogwild.cluster.role_server` imports it before it forks
cluster roles; nothing else should import it.

What differs between jobs is left to the worker itself: it pins itself, attaches its job's
arena and loads the kernels its network calls from numba's cache (which kernels, and with what
types, depends on the job's configuration).

No thread is started and no file or socket is opened here: the forkserver forks after this ran,
and a fork copies only the thread that forks.
"""

# ruff: noqa: E402 - the imports come after Ctrl-C is ignored
import signal

# First: a Ctrl-C to the process group while the server imports would print a traceback from
# here; the server ignores it afterwards anyway (its children's owner stops them).
signal.signal(signal.SIGINT, signal.SIG_IGN)

import numba  # noqa: F401 - imported for the forked workers
import numpy  # noqa: F401
from numba.core.registry import cpu_target

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

# numba initialises its target at the first compiled function a process loads or compiles;
# refreshing the contexts now does that once here instead of once in every worker.
cpu_target.typing_context.refresh()
cpu_target.target_context.refresh()
