"""A Sandblaster model replica: fetch at the start of a batch, gradients of portions, pushes.

DistBelief section 4.2: "Sandblaster workers only fetch parameters at the beginning of each batch
(when they have been updated by the coordinator), and only send the gradients every few completed
portions (to protect against replica failures and restarts)." :class:`SandblasterReplica` runs that
loop against a :class:`~.batch.Board`: it asks for work when free; on :class:`~.portions.Fetch` it
pulls the parameters; on :class:`~.portions.Compute` it computes the summed loss and gradient of
the portion's examples with the engine's own kernels (:func:`hogwild.model.loops.gradient_range`,
dropout off) and, if the board accepts the result (the first copy to finish), adds the gradient to
what it will push; on :class:`~.portions.Push` it pushes that sum into its own vector on the shards
(:meth:`~hogwild_plugins.ps.client.PSClient.push_deltas` ``into`` :func:`~.batch.replica_vector`,
which the coordinator folds into the gradient) and reports it. Its parameters stay those fetched
for the whole batch.

:class:`Examples` says which examples make portion ``p``: ``order[p * portion : (p + 1) *
portion]``, so sequential portions are sequential examples (data affinity).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
from hogwild_plugins.ps.sandblaster.batch import Board, Rejoin, Stop, replica_vector
from hogwild_plugins.ps.sandblaster.portions import Compute, Fetch, Push, portions_of

from hogwild.model.context import TrainingContext
from hogwild.model.loops import deterministic_ops, gradient_range
from hogwild.model.network import Network

__all__ = ["Examples", "PortionGradient", "SandblasterReplica"]


@dataclass(frozen=True)
class Examples:
    """The batch and its portions.

    Attributes:
        images: uint8 [N, input_size]; labels: [N], of
            :data:`~hogwild.model.loops.LABEL_DTYPE` (another type compiles the kernels again).
        order: int64: the batch's examples, in portion order.
        portion: Examples per portion.
        mean, std: Input normalisation (the job's ``data.mean``, ``data.std``).
    """

    images: np.ndarray
    labels: np.ndarray
    order: np.ndarray
    portion: int
    mean: float = 0.1307
    std: float = 0.3081

    @property
    def n_portions(self) -> int:
        return portions_of(len(self.order), self.portion)

    def bounds(self, p: int) -> tuple[int, int]:
        """The range of ``order`` that portion ``p`` covers."""
        return p * self.portion, min(len(self.order), (p + 1) * self.portion)


class PortionGradient:
    """Loss and gradient of portions with the engine's kernels, in buffers allocated once.

    Args:
        network: The model.
        examples: The batch.
        minibatch: Examples per forward/backward call inside a portion.
    """

    def __init__(self, network: Network, examples: Examples, minibatch: int = 16) -> None:
        self.ops = deterministic_ops(network.ops)
        self.examples = examples
        self.context = TrainingContext.allocate(network, minibatch)
        self.grad = np.zeros(network.n_params, np.float32)

    def __call__(self, params: np.ndarray, p: int) -> float:
        """The summed loss of portion ``p``; its summed gradient is left in :attr:`grad`."""
        e, c = self.examples, self.context
        start, stop = e.bounds(p)
        self.grad.fill(0.0)
        return float(
            gradient_range(
                self.ops, params, self.grad, c.act, c.dact, c.aux, c.scratch, c.targets,
                e.images, e.labels, e.order, start, stop, e.mean, e.std,
            )
        )  # fmt: skip


class SandblasterReplica:
    """One replica's loop (run it on a thread; it ends when the board closes or ``stop`` is set).

    Args:
        replica: Its id on the board.
        client: Its own parameter-server client (pull and push).
        board: The coordinator's board.
        gradient: Its :class:`PortionGradient`.
        delay_s: Extra seconds per portion (a straggler, for tests).
        die_after: Leave (without pushing) after this many portions (a failure, for tests).

    Attributes:
        computed: Portions it computed; ``kept``: those accepted; ``pushes``: pushes made;
        ``pushed``: portions whose gradients those pushes carried.
        error: The exception that ended it, if any.
    """

    def __init__(
        self,
        replica: int,
        client,
        board: Board,
        gradient: PortionGradient,
        *,
        delay_s: float = 0.0,
        die_after: int | None = None,
    ) -> None:
        self.id, self.client, self.board, self.gradient = replica, client, board, gradient
        self.delay_s, self.die_after = delay_s, die_after
        self.params = np.zeros(client.layout.n_params, np.float32)
        self.accrued = np.zeros_like(self.params)
        self.vector = replica_vector(replica)
        self.computed = self.kept = self.pushes = self.pushed = 0
        self.error: BaseException | None = None

    def run(self, stop: threading.Event | None = None) -> None:
        """Join the board and serve it until it closes (or ``stop``); leave it on every exit."""
        self.board.join(self.id)
        why = None
        try:
            while stop is None or not stop.is_set():
                instruction = self.board.request(self.id)
                if isinstance(instruction, Stop):
                    return
                if isinstance(instruction, Rejoin):  # a new board: what it accrued is void
                    self.accrued.fill(0.0)
                    self.board.join(self.id)
                    continue
                if isinstance(instruction, Fetch):
                    self.client.pull(self.params)
                    self.board.fetched(self.id, instruction.batch)
                elif isinstance(instruction, Compute):
                    if self.die_after is not None and self.computed >= self.die_after:
                        why = f"died on purpose after {self.computed} portions"
                        return
                    self._compute(instruction)
                elif isinstance(instruction, Push):
                    self.client.push_deltas(self.accrued, into=self.vector)
                    self.accrued.fill(0.0)
                    self.pushes += 1
                    self.pushed += len(instruction.portions)
                    self.board.pushed(self.id, instruction.batch, instruction.portions)
        except Exception as exc:  # recorded on the board, which the coordinator reports
            self.error, why = exc, f"{type(exc).__name__}: {exc}"
        finally:
            self.board.leave(self.id, why)

    def _compute(self, task: Compute) -> None:
        loss = self.gradient(self.params, task.portion)
        if self.delay_s:
            time.sleep(self.delay_s)
        self.computed += 1
        if self.board.finished(self.id, task.batch, task.portion, loss):
            self.accrued += self.gradient.grad
            self.kept += 1
