"""Sandblaster (DistBelief section 4.2 and appendix): batch L-BFGS through parameter-server shards.

Modules, one concept each:

* :mod:`.vectors`: the shard operations a coordinator issues (``dot``, ``axpy``, ``scale``,
  ``copy``, ``fill`` on named vectors; :class:`~hogwild_plugins.ps.client.PSClient` has them)
  and an in-memory stand-in with the shards' arithmetic.
* :mod:`.lbfgs`: the coordinator's L-BFGS (two-loop recursion, history on the shards, Armijo
  backtracking), holding scalars only.
* :mod:`.portions`: the I/O-free scheduler of a batch's portions (free replicas ask; backup
  copies near the end, first result wins; data affinity; lost replicas).
* :mod:`.batch`: one batch pass (the board replicas and coordinator wait on, and the
  coordinator's ``evaluate()`` that gathers the gradient on the shards).
* :mod:`.replica`: a replica's loop (fetch once per batch, portion gradients with the engine's
  kernels, pushes every few portions).

What differs from DistBelief, and why:

* The gradient is summed in the parameters' own place (see :mod:`.batch`): the servers take
  pushes only into ``"params"``, through their rule. The smallest addition that removes the
  fetch barrier this forces: ``PUSH_DELTAS`` naming a target vector (a second frame with the
  name, checked as vector-operation names are), admitted without a version change or
  staleness accounting and applied on the shard's update thread as a plain ``y += d`` (the
  existing ``apply_deltas`` kernel with rule SGD, ``lr = 1``, coefficient 1, on the named
  vector). Pushing into a vector per replica (``sandblaster.g.<replica>``), which the
  coordinator adds into ``"grad"`` and zeroes when the replica reports the push (``axpy``,
  ``fill``), would also make a replica that dies mid-push harmless (its vector is zeroed, its
  portions computed again), which summing in one place cannot.
* The first step and the stopping tests use L2 norms where ``torch.optim.LBFGS`` uses an L1
  norm and max-abs (no shard operation reduces with ``abs``); see :mod:`.lbfgs`.
* Replicas here are threads of one process talking to the board directly; across processes the
  board's calls become messages (issue 13's cluster part).
"""

from hogwild_plugins.ps.sandblaster.batch import BatchObjective, BatchTimeout, Board
from hogwild_plugins.ps.sandblaster.lbfgs import Iteration, LBFGSOptions, SandblasterLBFGS
from hogwild_plugins.ps.sandblaster.portions import PortionScheduler
from hogwild_plugins.ps.sandblaster.vectors import LocalVectors, ShardVectors

__all__ = [
    "BatchObjective",
    "BatchTimeout",
    "Board",
    "Iteration",
    "LBFGSOptions",
    "LocalVectors",
    "PortionScheduler",
    "SandblasterLBFGS",
    "ShardVectors",
]
