"""The worker process: pin, attach the arena, allocate a training context once, then train.

A worker is started by the trainer with spawn or from the preloaded forkserver
(:mod:`hogwild.training.zygote`; never a bare fork of the trainer: numba, LMDB and the arena's
mappings are not fork-safe). It asks the kernel for SIGTERM when its parent dies (and, forked by
the forkserver, whose death is not the trainer's, watches the trainer for it too), then
checks that the trainer is still there (a trainer killed while the worker started would otherwise
leave it polling forever), pins itself to its core *before* allocating its training context, so
first touch places the context on that core's NUMA node, opens its side of the parameter store
(:mod:`hogwild.store.protocol`), loads the kernels the parent compiled (numba's on-disk cache;
before it says it is ready, so its first epoch's time is training) and serves the trainer's
commands (:mod:`hogwild.training.messages`):

* :class:`~hogwild.training.messages.Train`: train on ``order[start:stop]`` of the shared
  permutation in spans the store chooses (its push and pull cadences), stopping early if the
  parent closes the epoch, then :meth:`~hogwild.store.protocol.WorkerStore.finish` (everything
  pushed) and answer :class:`~hogwild.training.messages.Trained`.
* :class:`~hogwild.training.messages.Evaluate`: loss and accuracy of test examples
  ``start:stop`` with the store's parameters (one model: the parent made it at the epoch end).
* :class:`~hogwild.training.messages.Stop`: detach and exit.

Chunks of ``train.chunk`` examples (fewer for a model too large to train that many in a few
seconds: :func:`~hogwild.optim.interval.whole_units`) are rounded down to whole units
(minibatches, or groups of examples that share a fully connected update), so a chunk boundary
never cuts a minibatch. After
every chunk, and while idle, the worker stamps a heartbeat in its statistics row: a worker that
is alive but stuck is found by the parent and named.

Idx data without augmentation is read in place from the arena (``data_wait_s`` is 0); an LMDB
image cache or augmentation reads through :class:`~hogwild.training.feeds.Feeds`. The worker
ignores SIGINT (the parent owns shutdown); an orphaned worker removes the job's arena itself, so
a SIGKILLed parent leaves neither processes nor segments behind. A
:class:`~hogwild.errors.DataError` (a corrupt record, a stalled feed) is answered as
:class:`~hogwild.training.messages.DataFailed` for a one-line error.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import time
import traceback

PR_SET_NAME = 15
COMMAND_POLL_S = 0.5
COMPILED_POLL_S = 0.05  # how often a starting worker looks for the trainer's compile step's end
PROCESS_NAME = "hogwild-w{}"  # the kernel's name of a worker (other jobs look for it)


def worker_main(setup, commands, results) -> None:
    """Entry point of a worker process (the target the trainer starts).

    Args:
        setup: The :class:`~hogwild.training.messages.WorkerSetup`.
        commands: This worker's command queue.
        results: The queue of every worker's answers.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from hogwild.runtime import collect_garbage_less_often
    from hogwild.signals import die_with_parent, die_with_process

    collect_garbage_less_often()  # before numba and the kernels load
    die_with_parent(signal.SIGTERM)  # not Linux: the worker still polls for the trainer's death
    if os.getppid() != setup.trainer_pid:  # forked by the forkserver, whose death is not ours
        die_with_process(setup.trainer_pid, signal.SIGTERM)
    if not trainer_alive(setup.trainer_pid, setup.trainer_started):
        return  # the trainer died before the death signal was asked for: nobody to serve
    arena = feeds = store = None
    try:
        from hogwild.numa.pinning import helper_cpus, helpers_on, pin_worker
        from hogwild.training.placement import machine_topology

        # read before pinning: the topology lists only the CPUs this process may use
        helpers = helper_cpus(setup.placement, os.sched_getaffinity(0), machine_topology())
        pin_worker(setup.placement)  # before the context is allocated: first touch places it
        _set_process_name(PROCESS_NAME.format(setup.worker))
        from hogwild.training.messages import Pinned

        results.put(Pinned(setup.worker))  # the trainer can let the placement lock go
        # Imported only now: numba loads after the process is pinned and its environment is set.
        from hogwild.config import config_from_dict
        from hogwild.data.plan import DataPlan
        from hogwild.model.context import TrainingContext
        from hogwild.model.network import build_network
        from hogwild.optim.interval import whole_units
        from hogwild.shm.arena import Arena, ArenaLayout
        from hogwild.store.protocol import open_worker_store
        from hogwild.training.messages import Ready

        job = config_from_dict(setup.config, origin="<job>")
        data = DataPlan.from_dict(setup.plan)
        network = build_network(job.model, data.n_classes)
        arena = Arena.attach(setup.arena_name, ArenaLayout.from_json(setup.layout_json))
        # The store's threads (a copy's exchange thread and its transport's I/O thread) start
        # free to run on any CPU of the worker's node it may use: pinned to the worker's CPU, they
        # take time from its compute while another CPU of the node may be idle.
        with helpers_on(helpers):
            store = open_worker_store(setup.store, arena, network, job)
        from hogwild.training.moments import MOMENTS_REGION

        # Adam's moments: this worker's row of the arena, which the checkpoints keep
        moments = None
        if MOMENTS_REGION in arena.layout.regions:
            moments = arena.array(MOMENTS_REGION)[setup.worker]
        context = TrainingContext.allocate(
            network, job.train.batch, job.train.update_every, moments=moments
        )
        chunk = whole_units(job, network.connections)
        if data.feed:  # after pinning: its prefetch thread runs here too
            from hogwild.training.feeds import Feeds

            feeds = Feeds(job, data, arena, chunk)
        if not _load_kernels(setup, network, job, data, arena, commands):
            return  # told to stop, or the trainer is gone, before its compile step ended
        results.put(Ready(setup.worker, os.getpid(), context.nbytes))
        loop = WorkerLoop(setup, job, network, arena, store, context, feeds, chunk, results)
        loop.serve(commands)
    except SystemExit:
        pass
    except BaseException as exc:  # report anything else to the parent rather than dying silently
        from hogwild.errors import DataError, StoppedError, cause_of
        from hogwild.training.messages import DataFailed, Failed, StoppedFailed

        stopped = cause_of(exc, StoppedError)
        if isinstance(exc, DataError):
            results.put(DataFailed(setup.worker, str(exc)))
        elif stopped is not None:  # (raised in the store's communication thread, say)
            results.put(StoppedFailed(setup.worker, str(stopped)))
        else:
            results.put(Failed(setup.worker, traceback.format_exc()))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup below must run to its end
        if store is not None:
            store.close()
        if feeds is not None:
            feeds.close()
        store = None  # views into the arena: dropped before it is unmapped
        if arena is not None:
            orphaned = not trainer_alive(setup.trainer_pid, setup.trainer_started)
            arena.close()
            if orphaned:
                from hogwild.shm.sweeper import unlink_segment

                unlink_segment(setup.arena_name)


def _load_kernels(setup, network, job, data, arena, commands) -> bool:
    """Load the kernels this worker calls before it says it is ready, so that its first epoch
    trains instead of loading them (a second of the epoch's time, counted as training).

    The trainer compiles them into numba's cache while its workers start (or finds them there),
    then sets ``CONTROL_COMPILED``: wait for that, then load what it compiled, beside the other
    workers. A Stop, or the trainer's death, while waiting ends the wait.

    Returns:
        True once loaded; False when the worker is to leave instead.
    """
    import numpy as np

    from hogwild.model.compile import compile_kernels
    from hogwild.signals import interrupts_not_lost
    from hogwild.training.job import CONTROL_COMPILED
    from hogwild.training.messages import Stop

    control = arena.array("control")
    # No deadline of its own: the trainer may wait minutes for another job's compile and then
    # compile; what ends its start (its own timeouts, an error, its death) ends this wait.
    while not control[CONTROL_COMPILED]:
        try:
            if isinstance(commands.get(timeout=COMPILED_POLL_S), Stop):
                return False
        except queue.Empty:
            if not trainer_alive(setup.trainer_pid, setup.trainer_started):
                return False
    train = job.train
    evaluates = data.feed or arena.array("test_labels").shape[0] > 0  # a replica's never does
    stored = arena.array("train_images").dtype if not data.feed else np.uint8
    with interrupts_not_lost():  # numba's compiler calls back into Python: SIGTERM not lost
        compile_kernels(
            network,
            train.batch,
            train.update_every,
            feed=data.feed,
            evaluate=bool(evaluates),
            images_dtype=stored,
        )
    return True


class WorkerLoop:
    """A worker's state while it serves commands (everything allocated once)."""

    def __init__(self, setup, job, network, arena, store, context, feeds, chunk, results):
        from hogwild.optim.rules import RULE_CODES
        from hogwild.training.job import STAT_SLOTS

        self.setup, self.job, self.network, self.arena = setup, job, network, arena
        self.store, self.context, self.feeds, self.chunk = store, context, feeds, chunk
        self.results = results
        self.worker = setup.worker
        self.parent = os.getppid()  # the trainer, or the forkserver that started this process
        self.control = arena.array("control")
        self.order = arena.array("order")
        self.stats = arena.array("stats")[setup.worker]
        assert self.stats.shape[0] == STAT_SLOTS
        optim = job.optim
        self.rule = RULE_CODES[optim.rule]
        self.mu = optim.momentum if optim.rule in ("momentum", "adam", "adamw") else 0.0
        if feeds is None:
            self.train_images = arena.array("train_images")
            self.train_labels = arena.array("train_labels")
            self.test_images = arena.array("test_images")
            self.test_labels = arena.array("test_labels")
        self.beat()

    def beat(self) -> None:
        """Stamp the heartbeat the parent watches (seconds of the system's monotonic clock)."""
        from hogwild.training.job import STAT_BEAT

        self.stats[STAT_BEAT] = time.monotonic()

    def count(self, n: int, loss: float, correct: int) -> None:
        from hogwild.training.job import STAT_CORRECT, STAT_EXAMPLES, STAT_LOSS

        self.stats[STAT_EXAMPLES] += n
        self.stats[STAT_LOSS] += loss
        self.stats[STAT_CORRECT] += correct
        self.beat()

    def serve(self, commands) -> None:
        from hogwild.training.messages import Evaluate, Stop, Train

        while True:
            try:
                command = commands.get(timeout=COMMAND_POLL_S)
            except queue.Empty:
                self.beat()
                if not trainer_alive(self.setup.trainer_pid, self.setup.trainer_started):
                    return
                continue
            self.beat()
            if isinstance(command, Stop):
                return
            if isinstance(command, Train):
                self.train(command)
            elif isinstance(command, Evaluate):
                self.evaluate(command)

    def open(self, epoch: int) -> bool:
        """Whether ``epoch`` is still open and the trainer still there."""
        from hogwild.training.job import CONTROL_EPOCH

        return self.control[CONTROL_EPOCH] == epoch and os.getppid() == self.parent

    def train(self, command) -> None:
        from hogwild.model.random import seed_kernels
        from hogwild.optim.schedule import rate_within
        from hogwild.training.messages import Trained

        seed_kernels(command.seed)
        store = self.store
        store_waited = store.wait_s
        store.start_epoch(command.lr)
        size = command.stop - command.start

        def rate(done: int) -> float:  # optim.smooth: the rate moves across the shard
            return rate_within(command.lr, command.lr_end, done, size)

        if self.feeds is not None:
            fed = [0]

            def step(images, labels, identity, n):
                lr = rate(fed[0])
                fed[0] += n
                return self.train_span(images, labels, identity, 0, n, lr)

            shard = self.order[command.start : command.stop]
            done, loss, correct, waited = self.feeds.train(
                command.epoch, shard, step, lambda: self.open(command.epoch), self.count
            )
        else:
            done, loss, correct, waited = 0, 0.0, 0, 0.0
            for lo in range(command.start, command.stop, self.chunk):
                if not self.open(command.epoch):
                    break
                hi = min(lo + self.chunk, command.stop)
                chunk_loss, chunk_correct = self.train_span(
                    self.train_images,
                    self.train_labels,
                    self.order,
                    lo,
                    hi,
                    rate(lo - command.start),
                )
                done += hi - lo
                loss += chunk_loss
                correct += chunk_correct
                self.count(hi - lo, chunk_loss, chunk_correct)
        store.finish()
        self.results.put(
            Trained(
                self.worker, command.epoch, done, loss, correct, waited, store.wait_s - store_waited
            )
        )

    def train_span(self, images, labels, order, lo, hi, lr) -> tuple[float, int]:
        """Train ``order[lo:hi]`` in the spans the store asks for, telling it after each."""
        from hogwild.data.arrays import input_normalisation

        train, optim, data = self.job.train, self.job.optim, self.job.data
        store, context = self.store, self.context
        mean, std = input_normalisation(images.dtype, data.mean, data.std)
        loss, correct = 0.0, 0
        start = lo
        while start < hi:
            stop = start + store.span(hi - start)
            part_loss, part_correct = context.train_chunk(
                self.network.ops,
                store.params,
                store.velocity,
                images,
                labels,
                order,
                start,
                stop,
                batch=train.batch,
                lr=lr,
                mu=self.mu,
                wd=optim.weight_decay,
                rule=self.rule,
                mean=mean,
                std=std,
                update_every=train.update_every,
                beta2=optim.beta2,
                eps=optim.eps,
            )
            store.trained(stop - start, context)
            loss += part_loss
            correct += part_correct
            start = stop
        return loss, correct

    def evaluate(self, command) -> None:
        from hogwild.data.arrays import input_normalisation
        from hogwild.training.messages import Evaluated

        data, context, params = self.job.data, self.context, self.store.params

        def measure(images, labels, start, stop):
            mean, std = input_normalisation(images.dtype, data.mean, data.std)
            result = context.evaluate_range(
                self.network.ops, params, images, labels, start, stop, mean, std
            )
            self.beat()  # spans of a chunk at most: a large model's test set is minutes of work
            return result

        if self.feeds is not None:
            loss, correct = self.feeds.evaluate(
                command.start, command.stop, lambda images, labels, n: measure(images, labels, 0, n)
            )
        else:
            loss, correct = 0.0, 0
            for lo in range(command.start, command.stop, self.chunk):
                hi = min(lo + self.chunk, command.stop)
                span_loss, span_correct = measure(self.test_images, self.test_labels, lo, hi)
                loss += span_loss
                correct += span_correct
        self.results.put(Evaluated(self.worker, command.stop - command.start, loss, correct))


def trainer_alive(pid: int, started: float) -> bool:
    """Whether the trainer (``pid``, started at ``started``) still runs: not gone, not a zombie.

    The parent-death signal arrives before this process is re-parented, so ``getppid()`` may
    still name a dead trainer; and under forkserver the parent is not the trainer at all. The
    trainer's own process entry tells the truth.
    """
    from hogwild.shm.naming import process_alive

    return process_alive(pid, started)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _prctl(option: int, value) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the worker still notices the trainer's death when it polls


def _set_process_name(name: str) -> None:
    """The name ``ps`` and ``/proc/PID/comm`` show (15 bytes at most)."""
    _prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]))
