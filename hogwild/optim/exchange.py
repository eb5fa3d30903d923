"""Exchange of progress between a per-node copy of the parameters and the home copy.

With ``train.parameters = "replicate"`` every NUMA node the workers use (or, with
``train.replicas = "worker"``, every worker) has its own copy of the parameters, and its workers
train Hogwild-style on it, so their writes stay in the node's memory (or the core's cache). Each
copy keeps a *base*: the home copy's values when the two last agreed. Every so often one worker
of the copy (its leader) calls :func:`exchange_deltas`, which, element by
element, pushes the copy's progress since then (``copy - base``) into the home copy and pulls
the other nodes' progress (``home - base`` before the push) into the copy. This is the
push-deltas, pull-parameters loop of a DistBelief/Adam model replica (Adam section 3.3,
DistBelief section 4.1), between nodes of one machine instead of between machines.

The copy is updated with ``+=`` rather than overwritten, so updates the node's other workers
write into it during an exchange are kept, and nothing is locked: like every other write in
Hogwild, two leaders adding into the same home element at the same instant may lose one of
the two additions.
"""

import numba as nb
import numpy as np


@nb.njit(cache=True, nogil=True)
def exchange_deltas(home: np.ndarray, copy: np.ndarray, base: np.ndarray) -> None:
    """Push ``copy - base`` into ``home``, pull ``home``'s other progress into ``copy``.

    Args:
        home: The home copy, float32 (shared by every node).
        copy: This node's copy, float32, same length.
        base: ``home``'s values at this copy's last exchange (updated here).

    Afterwards ``base`` equals ``home``, and ``copy`` equals it too unless the node's workers
    wrote into ``copy`` meanwhile.
    """
    for i in range(home.shape[0]):
        local = copy[i] - base[i]
        others = home[i] - base[i]
        merged = home[i] + local
        home[i] = merged
        copy[i] += others
        base[i] = merged
