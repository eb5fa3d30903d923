"""Sandblaster (DistBelief section 4.2 and appendix): batch L-BFGS through parameter-server shards.

Modules, one concept each:

* :mod:`.vectors`: the shard operations a coordinator issues (``dot``, ``asum``, ``amax``,
  ``axpy``, ``scale``, ``copy``, ``fill`` on named vectors; :class:`~.vectors.ShardVectors`
  runs them through a parameter-server client) and an in-memory stand-in with the shards'
  arithmetic.
* :mod:`.lbfgs`: the coordinator's L-BFGS (two-loop recursion, history on the shards, Armijo
  backtracking, torch's first step and stopping tests), holding scalars only.
* :mod:`.portions`: the I/O-free scheduler of a batch's portions (free replicas ask; backup
  copies near the end, first result wins; data affinity; lost replicas; which pushes the
  coordinator folds into the gradient).
* :mod:`.batch`: one batch pass (the board replicas and coordinator wait on, and the
  coordinator's ``evaluate()`` that gathers the gradient on the shards).
* :mod:`.replica`: a replica's loop (fetch once per batch, portion gradients with the engine's
  kernels, pushes every few portions into its own vector on the shards).
* :mod:`.board_service`: the board across processes (the coordinator answers its members'
  calls as control messages; a member's side with the board's methods).
* :mod:`.member`: a group's member role (``hogwild cluster member``): one replica as a process
  of its own, on any node.
* :mod:`.group`: the worker-group role ``hogwild cluster --cluster.framework=sandblaster``
  starts: the coordinator and its board, answering the driver as a replica does.

What differs from DistBelief, and why:

* Replicas push their gradients into a vector of their own beside the parameters (a push into
  a named vector: ``y += d`` on the shards, no rule, no version), which the coordinator folds
  into ``"grad"`` (``axpy``, then ``fill`` with 0) once the push is reported complete; the
  paper does not say where the shards sum the gradient. A vector per replica makes a replica
  that dies mid-push harmless (its vector is zeroed, its portions computed again); see
  :mod:`.batch` and :mod:`.portions`.
* Under ``hogwild cluster`` each replica is a process of its own (:mod:`.member`), talking to
  the coordinator's board in messages (:mod:`.board_service`); the coordinator is a role of its
  own per group, not a process of the driver. Tests also run replicas as threads on an
  in-process board.
* Parameter servers that keep copies (``copies > 1``) replicate vector operations that write
  and named pushes like any update (each takes the shard's next version), so L-BFGS's history
  survives a primary's death; :func:`~.batch.check_servers` checks the servers answer.
"""

from hogwild_plugins.ps.sandblaster.batch import (
    BatchObjective,
    BatchTimeout,
    Board,
    check_servers,
)
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
    "check_servers",
]
