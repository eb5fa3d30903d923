"""A synchronous worker group as a role of ``hogwild cluster``: a coordinator and its replicas.

SINGA section 5.2: workers within a group are synchronous, groups asynchronous; one worker group
and one server group give synchronous training. Three frameworks (:mod:`hogwild.config.topology`)
run on the same parts: the parameter servers the driver starts, and a worker-group role per group
(``hogwild cluster replica --index G``, which serves the class registered for the job's framework
in the entry-point group ``hogwild.worker_groups``: :class:`LBFGSGroup` or :class:`SGDGroup`,
a :class:`hogwild.cluster.services.WorkerGroupFramework`) holding

* a **coordinator** with a parameter-server client of its own, through which only shard
  operations and scalars pass: it gathers each batch's gradient on the shards
  (:class:`~.batch.BatchObjective`) and moves the parameters there;
* the :class:`~.batch.Board`, which its ``workers_per_group`` **members** reach as messages
  over this role's control channel (:class:`~.board_service.BoardService`). Each member is a
  role of its own (``hogwild cluster member``, :mod:`.member`), a process the launcher places
  on any node like any other role: a :class:`~.replica.SandblasterReplica` with its own client,
  fetching the parameters once per batch, computing portion gradients with the engine's
  kernels, pushing them into its own vector on the shards, backed up near the end of a batch.

The frameworks differ in the coordinator's step:

* ``sandblaster`` (:class:`LBFGSGroup`, DistBelief 4.2): L-BFGS (:class:`~.lbfgs.SandblasterLBFGS`).
  With ``cluster.lbfgs_batch = 0`` (the default), **full-batch**: one ``train`` (an epoch's
  share: with one worker group, the whole training set or ``train.subset``, whose order does not
  change the summed gradient) is ``cluster.lbfgs_iterations`` (1) L-BFGS iterations, whose line
  search may take more than one pass (the first epoch also evaluates the start). The history
  stays on the shards across epochs; a share of other examples starts a fresh L-BFGS. With
  ``cluster.lbfgs_batch = B``, **mini-batches**: the share, in the epoch's shuffled order, is cut
  into batches of about B examples, each a new board and ``lbfgs_iterations`` iterations; the
  history carries over from batch to batch (:meth:`~.lbfgs.SandblasterLBFGS.new_batch`).
  ``cluster.lbfgs_batch_growth = g`` grows them from epoch to epoch, ``B g^e`` examples in epoch
  ``e`` (:func:`lbfgs_batch_size`): a mini-batch's gradient error, large against the gradient
  near a minimum, shrinks as the batch grows (Byrd, Chin, Nocedal & Wu, "Sample size selection
  in optimization methods for machine learning", Math. Programming 2012; Friedlander & Schmidt
  2012, below).
  ``close`` does not cut an iteration short (with mini-batches it ends the share at the next
  batch). **Warm start** (``cluster.lbfgs_warm_start = E``): the job's first ``E`` examples
  (numbered across epochs in the epochs' shuffled orders) are trained by synchronous SGD steps
  as ``allreduce`` takes them (``train.batch`` a step, ``optim.lr`` and its schedule), through
  the same board and shards; L-BFGS then begins, without history, from the parameters the SGD
  steps left on the shards, on the rest of that epoch's share (full-batch: the rest is that
  epoch's batch). Stochastic steps gain most per example far from a minimum, and batch
  quasi-Newton steps near one (Friedlander & Schmidt, "Hybrid deterministic-stochastic methods
  for data fitting", SIAM J. Sci. Comput. 2012; Bollapragada et al., "A progressive batching
  L-BFGS method for machine learning", ICML 2018, growing the batch instead). Without it
  ``optim.lr``, its schedule and ``train.batch`` are not used.
* ``allreduce`` (:class:`SGDGroup`): synchronous SGD: the share in batches of ``train.batch``
  examples (split into portions over the workers), after each ``axpy(-lr, grad, params)`` on the
  shards with the driver's ``lr`` (``optim.lr`` and its schedule, on the batch's mean gradient as
  ``hogwild train`` uses it). SINGA's AllReduce binds a server to every worker
  (``servers_per_group = workers_per_group``): the shards are spread over that many servers, each
  collecting its slice of every worker's gradient; where the servers run is the launcher's.
* ``hybrid`` (:class:`SGDGroup` in every group): several such groups, each trained on its
  share of the epoch (the driver's Downpour coordinator) and stepping its server group's
  parameters asynchronously to the others, with a gradient vector (``sgd.grad<G>``) and replica
  numbers (``G * workers + i``, hence replica vectors) of its own on the shards. On one server
  group the groups step the same parameters; on several (``cluster.server_groups``, SINGA's
  hybrid of synchronous groups that are asynchronous to each other, each set of them on its own
  server group) the first group of each server group moves it to the groups' mean every
  ``cluster.sync_every`` examples it trained, between two steps
  (:class:`hogwild.cluster.group_sync.GroupSync`, as a distributed Hogwild replica does:
  pulling every server group's parameters, the one time vectors pass through a coordinator),
  and the driver makes them one at every epoch end.

**What differs from the papers.** The coordinator lives in this role (not in the driver), one
per group; its members exchange with it only the board's small messages, and with the servers
the parameters and gradients, over the network. The driver starts a group's members once the
group serves (each is told its address); a group that is restarted comes back elsewhere, and the
driver restarts its members told the new address. The driver sees a replica: the core's serve
loop (:class:`hogwild.cluster.serving.ReplicaServer`, the one every replica role answers
through: ``train``, ``close``, ``status``, ``describe``, ``stop``; the members' ops go to
:meth:`WorkerGroup.answer`) serves the group, so the driver's epochs, evaluation, checkpoints and
restarts work unchanged; ``train_accuracy`` is not counted.

Both: ``optim.weight_decay`` is an L2 term on every parameter (biases too); dropout is off (the
line search compares losses, so the objective must be deterministic); ``train.stall_s`` bounds
every wait on the board and a member's silence; the data are MNIST arrays in memory
(:func:`check_job` refuses image caches, data servers and augmentation before the job starts).
"""

from __future__ import annotations

import math
import queue
import sys
import time
from dataclasses import dataclass

import numpy as np
from hogwild_plugins.ps.sandblaster.batch import BatchObjective, Board, check_servers
from hogwild_plugins.ps.sandblaster.board_service import BoardService
from hogwild_plugins.ps.sandblaster.lbfgs import (
    GRAD,
    PARAMS,
    Iteration,
    LBFGSOptions,
    SandblasterLBFGS,
)
from hogwild_plugins.ps.sandblaster.member import group_client, serve_member, training_arrays
from hogwild_plugins.ps.sandblaster.portions import PortionScheduler, portions_of
from hogwild_plugins.ps.sandblaster.vectors import ShardVectors

from hogwild.cluster.group_sync import GroupSync
from hogwild.cluster.replica_role import ReplicaRole, driver_silence_s
from hogwild.cluster.serving import POLL_S
from hogwild.errors import ConfigError
from hogwild.training.job import epoch_permutation

__all__ = [
    "LBFGSGroup",
    "SGDGroup",
    "WorkerGroup",
    "check_job",
    "lbfgs_batch_size",
    "portion_size",
]

PORTIONS_PER_WORKER = 8  # DistBelief: portions much smaller than 1/N of the batch
MIN_PORTION = 16  # examples: below this a portion costs more in requests than in compute
PUSH_EVERY = 3  # portions between a replica's pushes ("every few completed portions")
MAX_COPIES = 2  # copies of an outstanding portion near the end of a batch (backup tasks)


def portion_size(n_examples: int, workers: int) -> int:
    """Examples per portion: about ``PORTIONS_PER_WORKER`` portions per worker, at least
    ``MIN_PORTION`` examples each."""
    return max(MIN_PORTION, math.ceil(n_examples / (PORTIONS_PER_WORKER * max(workers, 1))))


def lbfgs_batch_size(batch: int, growth: float, epoch: int, share: int) -> int:
    """Examples per L-BFGS batch in ``epoch``: ``batch * growth ** epoch``, rounded, at most
    ``share`` (the whole share when ``batch`` is 0, the full batch)."""
    if not batch or (growth > 1.0 and epoch * math.log(growth) >= math.log(share / batch)):
        return share
    return max(1, min(share, round(batch * growth**epoch)))


def check_job(config, data, framework: str = "sandblaster") -> None:
    """Refuse, before anything starts, what a synchronous group cannot train from.

    Raises:
        ConfigError: Data servers, augmentation, data that is not MNIST arrays, or (SGD steps:
            allreduce, hybrid, Sandblaster's warm start) a batch too small to split over the
            workers.
    """
    from hogwild.data.mnist import MnistData

    name = f"cluster.framework = {framework!r}"
    if config.cluster.data_servers or config.data.servers:
        raise ConfigError(
            f"{name} with data servers: not built; the worker group reads its examples itself "
            "(cluster.data_servers = 0, data.servers = [])"
        )
    if config.data.augment.strip():
        why = (
            "L-BFGS's line search compares losses of one fixed batch, and augmentation renders "
            "new variants of it"
            if framework == "sandblaster"
            else "not built: the worker group reads the stored images as they are"
        )
        raise ConfigError(f'{name} with data.augment = {config.data.augment!r}: {why}; use ""')
    if not isinstance(data, MnistData):
        raise ConfigError(
            f"{name} reads MNIST idx files into memory; training from an image cache "
            f"({getattr(data, 'path', data)}) is not built"
        )
    workers, batch = config.cluster.workers_per_replica, config.train.batch
    warm = config.cluster.lbfgs_warm_start
    if (framework != "sandblaster" or warm) and batch < workers * MIN_PORTION:
        what = f"{name} with cluster.lbfgs_warm_start = {warm}" if warm else name
        raise ConfigError(
            f"{what} steps once per batch of train.batch examples split over the "
            f"{workers} worker(s), at least {MIN_PORTION} each: train.batch = {batch} is too "
            f"small; e.g. --train.batch={max(256, workers * MIN_PORTION)} (optim.lr is then the "
            "step on the batch's mean gradient)"
        )


@dataclass
class _Share:
    epoch: int
    start: int
    examples: int
    trained: int = 0
    loss: float = 0.0
    started: float = 0.0
    seconds: float = 0.0


class WorkerGroup(ReplicaRole):
    """The worker-group role (see the module docstring); subclasses train a share. A
    :class:`hogwild.cluster.serving.ServedRole` that takes the driver's requests as every replica
    role does (:class:`hogwild.cluster.replica_role.ReplicaRole`): the core's
    :class:`~hogwild.cluster.serving.ReplicaServer` serves it to the driver.

    Args:
        framework: The job's framework.
        config: The job's resolved config.
        data: :class:`~hogwild.data.mnist.MnistData`.
        index: The group's index.
    """

    does = ""  # what it runs, for its ready line
    unit, least_examples = "share", 1  # a `train` hands over a share of the epoch, not empty
    grad = GRAD  # the vector its batch gradient is gathered in
    check_job = staticmethod(check_job)  # the driver's check, before anything starts
    serve_member = staticmethod(serve_member)  # ``hogwild cluster member``: one of its members

    def __init__(self, framework: str, config, data, index: int) -> None:
        check_job(config, data, framework)
        super().__init__(config, index, driver_silence_s(config, 2))
        self.framework, self.config = framework, config
        self.n_train = len(training_arrays(config, data)[1])  # the members hold the examples
        self.workers = config.cluster.workers_per_replica  # the topology's workers_per_group
        first = index * self.workers  # its members' numbers (their vectors on the shards)
        self.service = BoardService(range(first, first + self.workers), config.train.stall_s)
        self.share: _Share | None = None
        self.board: Board | None = None
        self.objective: BatchObjective | None = None
        self.clients: list = []
        self.coordinator: ShardVectors | None = None
        self.iterations = 0
        self.past_boards: dict[str, int] = {}  # counters of the boards before the current one
        self.last_step: dict = {}
        self.group_sync = GroupSync(config, index)  # several server groups: its part
        self.trained = 0  # examples its SGD steps took, in all (when a synchronisation is due)

    def train_share(self, epoch: int, start: int, stop: int, lr: float) -> None:
        """Train ``order[start:stop]`` of ``epoch``'s permutation, updating :attr:`share`."""
        raise NotImplementedError

    # -- the network thread (ReplicaServer's requests) --------------------------------------------

    @property
    def job(self) -> str:
        return self.config.ps.job

    def facts(self) -> dict:
        return {
            "workers": self.workers,
            "framework": self.framework,
            "members": list(self.service.members),
        }

    def answer(self, op: str, body: dict) -> dict:
        """A member's request (:class:`~.board_service.BoardService`, on the network thread)."""
        return self.service.answer(op, body)

    def status(self) -> dict:
        with self.lock:
            share = self.share
            out: dict = {"replica": self.index, "framework": self.framework}
            out["sandblaster"] = self._counters()
            out.update(self.group_sync.status())  # its server group's synchronisations
            if share is None:
                return {**out, "state": "idle"}
            done = bool(share.seconds)
            out.update(
                state="done" if done else "training",
                epoch=share.epoch,
                examples=share.trained,
                loss=share.loss,
                seconds=share.seconds or time.perf_counter() - share.started,
            )
            # the driver's coordinator reads a share as one portion (coordinator.status_events)
            if done:
                out["finished"] = [{"start": share.start, "examples": share.trained,
                                    "loss": share.loss, "correct": 0}]  # fmt: skip
            else:
                out["portion"] = {"start": share.start, "stop": share.start + share.examples,
                                  "examples": share.trained, "seconds": out["seconds"]}  # fmt: skip
            return out

    def _board_counters(self) -> dict:
        """The current board's counters (its batch passes, portions, backups...)."""
        stats = self.board.scheduler.stats if self.board is not None else None
        return {
            "evaluations": self.objective.batch if self.objective is not None else 0,
            "portions": stats.portions if stats else 0,
            "backups": stats.backups if stats else 0,
            "duplicates": stats.duplicates if stats else 0,
            "lost": stats.lost if stats else 0,
        }

    def _counters(self) -> dict:
        board = self._board_counters()
        return {
            "iterations": self.iterations,
            "workers": self.workers,
            **{key: self.past_boards.get(key, 0) + value for key, value in board.items()},
            "kept": [self.service.kept[m] for m in self.service.members],  # from each member
            "rejoined": self.service.reaped,  # members taken for gone after their silence
            **self.last_step,
        }

    # -- the main thread ---------------------------------------------------------------------------

    def start(self) -> str:
        """The ready line's description (the coordinator computes no gradients: no kernels);
        with several server groups, the clients of every group, if it is its server group's
        synchroniser."""
        cluster = self.config.cluster
        replicated = cluster.copies > 1  # each server group routed by its own bucket map
        self.group_sync.open(
            self.job,
            etcd=cluster.etcd if replicated else None,
            etcd_tls=(cluster.etcd_tls or None) if replicated else None,
        )
        return (
            f"{self.framework} group {self.index} ({self.workers} member process(es), "
            f"{self.n_train:,} examples, {self.does} through parameter server(s) "
            f"{', '.join(self.config.ps.servers)})"
        )

    def started(self, address: str) -> None:
        """Nothing more to start once the driver can reach it."""

    def step(self) -> None:
        """Train the next share the driver handed over, if one comes within ``POLL_S``."""
        try:
            command = self.commands.get(timeout=POLL_S)
        except queue.Empty:
            return
        epoch, start, stop = command.epoch, command.start, command.stop
        with self.lock:
            self.share = _Share(epoch, start, stop - start, started=time.perf_counter())
        self.train_share(epoch, start, stop, command.lr)
        with self.lock:
            self.share.seconds = time.perf_counter() - self.share.started

    def _order(self, epoch: int, start: int, stop: int) -> np.ndarray:
        return epoch_permutation(self.config.train.seed, epoch, self.n_train)[start:stop]

    def _start_board(self, order: np.ndarray, portion: int) -> None:
        """A new board (the members join it, computing on ``order``) and the objective."""
        self._close_board()
        for key, value in self._board_counters().items():  # the counters go on over boards
            self.past_boards[key] = self.past_boards.get(key, 0) + value
        if self.coordinator is None:
            client = self._client()
            self.clients.append(client)
            self.coordinator = ShardVectors(client)  # the coordinator's shard operations
            check_servers(client.status())
        scheduler = PortionScheduler(push_every=PUSH_EVERY, max_copies=MAX_COPIES)
        self.board = Board(scheduler, timeout_s=self.config.train.stall_s)
        self.service.install(self.board, order, portion)
        l2 = self.config.optim.weight_decay
        self.objective = BatchObjective(
            self.coordinator, self.board, len(order), portion, l2=l2, grad=self.grad
        )

    def _start_sgd_board(self, order: np.ndarray) -> None:
        """A board for :meth:`_sgd_steps`: portions of a ``train.batch`` batch over the workers."""
        size = self.config.train.batch
        self._start_board(order[:size], portion_size(size, self.workers))

    def _sgd_steps(self, epoch: int, order: np.ndarray, lr: float) -> None:
        """Synchronous SGD on ``order`` in batches of ``train.batch``: each batch's mean gradient
        (with L2) gathered in :attr:`grad` on the shards, then ``axpy(-lr, grad, params)``
        there; :attr:`share` counts the examples, :meth:`_count_step` the steps, as they are
        taken. The board must be one :meth:`_start_sgd_board` started. Stops early when the
        epoch is closed or the role is leaving."""
        size = self.config.train.batch
        portion = portion_size(size, self.workers)
        v, objective = self.coordinator, self.objective
        for first in range(0, len(order), size):
            if self.closed_epoch >= epoch or self.stopping:  # the epoch rule, or leaving
                break
            batch = order[first : first + size]
            self.service.set_examples(batch, portion)  # the members', before the batch begins
            objective.n_examples = len(batch)
            objective.n_portions = portions_of(len(batch), portion)
            loss = objective()  # the batch's mean gradient (with L2) in self.grad on the shards
            v.axpy(-lr, self.grad, PARAMS)
            self._count_step()
            self.last_step = {"loss": loss, "step": lr}
            with self.lock:
                self.share.trained += len(batch)
                self.share.loss += loss * len(batch)
            self.trained += len(batch)
            self.group_sync.when_due(self.trained)  # between steps: before the share is done

    def _count_step(self) -> None:
        """An SGD step was taken (an SGD group's iterations are its steps)."""
        self.iterations += 1

    def _client(self):
        """The coordinator's parameter-server client."""
        return group_client(self.config)

    def _close_board(self) -> None:
        if self.board is not None:
            self.board.close()

    def release(self) -> None:
        self.service.close()  # the members' next request is answered stop
        self._close_board()
        self.group_sync.close()
        for client in self.clients:
            client.close()
        self.clients = []

    def _say(self, text: str) -> None:
        print(f"hogwild replica {self.index}: {text}", file=sys.stderr, flush=True)


class LBFGSGroup(WorkerGroup):
    """Sandblaster: L-BFGS iterations on each share, its full batch or mini-batches (see the
    module docstring)."""

    does = "L-BFGS"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batch_key: bytes | None = None  # the examples the L-BFGS below optimises over
        self.lbfgs: SandblasterLBFGS | None = None
        self.warm_steps = 0  # SGD steps of the warm start

    def warm_examples(self, epoch: int, start: int, examples: int) -> int:
        """How many of the share's first examples the warm start trains: the job's examples
        are numbered across epochs (``epoch * n_train + position in the epoch's order``), and
        those numbered below ``cluster.lbfgs_warm_start`` are SGD's. A function of the share
        alone, so a restarted role or a resumed job neither repeats nor skips it."""
        first = epoch * self.n_train + start
        return min(examples, max(0, self.config.cluster.lbfgs_warm_start - first))

    def train_share(self, epoch: int, start: int, stop: int, lr: float) -> None:
        c = self.config.cluster
        order = self._order(epoch, start, stop)
        warm = self.warm_examples(epoch, start, len(order))
        if warm:
            self._warm_start(epoch, order[:warm], lr)
            if warm == len(order) or self.closed_epoch >= epoch or self.stopping:
                return
            order = order[warm:]  # L-BFGS on the rest of the share, each example once
        size = lbfgs_batch_size(c.lbfgs_batch, c.lbfgs_batch_growth, epoch, len(order))
        batches = (
            np.array_split(order, math.ceil(len(order) / size)) if size < len(order) else [order]
        )
        for number, batch in enumerate(batches):
            if (number or warm) and (self.closed_epoch >= epoch or self.stopping):
                break  # between batches only
            batch = np.sort(batch)  # a set: sorted, portions contiguous
            if batch.tobytes() != self.batch_key:
                self._start_board(batch, portion_size(len(batch), self.workers))
                self.batch_key = batch.tobytes()
                if c.lbfgs_batch and self.lbfgs is not None:
                    self.lbfgs.new_batch()  # mini-batches: the history carries over
                else:
                    self.lbfgs = self._lbfgs()
            for _ in range(c.lbfgs_iterations):
                it = self._iterate()
            with self.lock:
                self.share.trained += len(batch)
                self.share.loss += it.loss * len(batch)

    def _warm_start(self, epoch: int, order: np.ndarray, lr: float) -> None:
        """SGD steps on ``order`` through the same shards; L-BFGS then starts afresh from the
        parameters they leave (no history: the pairs of another optimizer's path would not be
        this objective's curvature)."""
        self._start_sgd_board(order)
        self.batch_key, self.lbfgs = None, None  # the next L-BFGS batch gets its own board
        self._sgd_steps(epoch, order, lr)
        with self.lock:
            trained, loss = self.share.trained, self.share.loss
        self._say(
            f"warm start: {trained:,} examples, {self.warm_steps} SGD step(s) in all at lr "
            f"{lr:.4g}, loss {loss / max(trained, 1):.5f}; L-BFGS begins from these parameters"
        )

    def _count_step(self) -> None:
        """The warm start's steps are counted apart from L-BFGS's iterations."""
        self.warm_steps += 1

    def _counters(self) -> dict:
        return {**super()._counters(), "warm_steps": self.warm_steps}

    def _iterate(self) -> Iteration:
        """One L-BFGS iteration on the current batch (a fresh L-BFGS after one that stops)."""
        it = self.lbfgs.step()
        self.iterations += 1
        self.last_step = {"loss": it.loss, "step": it.step, "trials": it.evaluations,
                          "pairs": it.pairs}  # fmt: skip
        self._say(
            f"L-BFGS iteration {self.iterations}: loss {it.loss:.5f}, step {it.step:.4g}, "
            f"{it.evaluations} pass(es), {it.pairs} pair(s)"
            + (f"; {it.stop}: the history starts again" if it.stop else "")
        )
        if it.stop:  # converged, or no descent: a fresh start (steepest descent) next time
            self.lbfgs = self._lbfgs()
        return it

    def _lbfgs(self) -> SandblasterLBFGS:
        options = LBFGSOptions(history=self.config.cluster.lbfgs_history)
        return SandblasterLBFGS(self.coordinator, self._evaluate, options)

    def _evaluate(self) -> float:
        return self.objective()  # the current batch's (a new board per batch)


class SGDGroup(WorkerGroup):
    """AllReduce, or a hybrid's group: synchronous SGD, a step per batch of ``train.batch``."""

    does = "synchronous SGD"

    @property
    def grad(self) -> str:
        return f"sgd.grad{self.index}"

    def train_share(self, epoch: int, start: int, stop: int, lr: float) -> None:
        order = self._order(epoch, start, stop)
        if self.board is None:
            self._start_sgd_board(order)
        self._sgd_steps(epoch, order, lr)
        self._say(f"epoch {epoch}: {self.share.trained:,} examples, {self.iterations} steps, "
                  f"loss {self.share.loss / max(self.share.trained, 1):.5f}")  # fmt: skip
