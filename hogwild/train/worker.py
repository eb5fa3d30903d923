"""The worker process: pin, attach the arena, allocate a training context once, then train.

A worker is started by the trainer with spawn or forkserver (never a bare fork: numba, LMDB and the
arena's mappings are not fork-safe). It pins itself to its core *before* allocating its training
context, so first touch places the context on that core's NUMA node, loads the kernels the parent
already compiled (numba's on-disk cache), and then serves the parent's commands:

* ``("train", epoch, lr, start, stop, seed)``: train on ``order[start:stop]`` of the shared
  permutation, writing every update straight into the shared parameters; stop early if the parent
  closes the epoch. Reports ``("trained", worker, epoch, examples, loss, correct, data_wait_s)``.
* ``("eval", start, stop)``: loss and accuracy of test examples ``start:stop`` with the current
  shared weights. Reports ``("evaluated", worker, examples, loss, correct)``.
* ``("stop",)``: detach and exit.

Examples reach the kernels one of two ways (:class:`~hogwild.train.job.DataPlan`). Idx data
without augmentation is read in place from the arena, zero-copy (``data_wait_s`` is 0: nothing
is waited for). A job on an LMDB image cache, or with ``data.augment``, reads through
:class:`_Feeds`: a :class:`~hogwild.data.feed.WorkerFeed` per split, made in this process (the
cache is opened here, never inherited), whose prefetch thread reads and augments the next
``train.chunk`` examples of the shard while the kernels train on the current ones; each batch is
one ``train_chunk`` call over an identity order, and the epoch-closed flag is checked between
batches. ``data_wait_s`` is the time the loop waited for the feed.

The worker ignores SIGINT (the parent owns shutdown) and asks the kernel for SIGTERM when its
parent dies; an orphaned worker then removes the job's arena itself, so a SIGKILLed parent leaves
neither processes nor segments behind. A :class:`~hogwild.errors.DataError` (a corrupt record, a
stalled feed) is reported as ``("data_error", worker, message)`` for a one-line error.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import traceback

PR_SET_PDEATHSIG = 1
COMMAND_POLL_S = 0.5


def worker_main(
    worker: int,
    arena_name: str,
    layout_json: str,
    config: dict,
    plan: dict,
    placement,
    parameter_plan,
    commands,
    results,
) -> None:
    """Entry point of a worker process (the target the trainer starts).

    ``placement`` is the worker's :class:`~hogwild.numa.placement.WorkerPlacement`,
    ``parameter_plan`` the job's :class:`~hogwild.numa.placement.ParameterPlacement` (which copy
    of the parameters this worker trains on).
    """
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _die_with_parent()
    arena = feeds = shared = None
    try:
        from hogwild.numa.pinning import pin_worker

        pin_worker(placement)  # before the context is allocated: first touch places it
        # Imported only now: numba loads after the process is pinned and its environment is set.
        from hogwild.config import config_from_dict
        from hogwild.model.network import build_network
        from hogwild.shm.arena import Arena, ArenaLayout
        from hogwild.train.context import TrainingContext
        from hogwild.train.job import DataPlan
        from hogwild.train.parameters import SharedParameters

        job = config_from_dict(config, origin="<job>")
        data = DataPlan.from_dict(plan)
        network = build_network(job.model, data.n_classes)
        arena = Arena.attach(arena_name, ArenaLayout.from_json(layout_json))
        shared = SharedParameters.attach(arena, parameter_plan)
        context = TrainingContext.allocate(network, job.train.batch, job.train.update_every)
        feeds = _Feeds(job, data, arena) if data.feed else None  # after pinning: its thread too
        results.put(("ready", worker, os.getpid(), context.nbytes))
        _serve(worker, job, network, arena, shared, context, feeds, commands, results, parent)
    except SystemExit:
        pass
    except BaseException as exc:  # report anything else to the parent rather than dying silently
        from hogwild.errors import DataError

        if isinstance(exc, DataError):
            results.put(("data_error", worker, str(exc)))
        else:
            results.put(("error", worker, traceback.format_exc()))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup below must run to its end
        if feeds is not None:
            feeds.close()
        shared = None  # views into the arena: dropped before it is unmapped
        if arena is not None:
            orphaned = _parent_is_gone(parent)
            arena.close()
            if orphaned:
                from hogwild.shm.sweeper import unlink_segment

                unlink_segment(arena_name)


def _serve(worker, job, network, arena, shared, context, feeds, commands, results, parent) -> None:
    from hogwild.model.engine import evaluate_range
    from hogwild.model.random import seed_kernels
    from hogwild.optim.rules import RULE_CODES
    from hogwild.train.job import CONTROL_EPOCH, STAT_CORRECT, STAT_EXAMPLES, STAT_LOSS
    from hogwild.train.parameters import ExchangeClock

    params, velocity = shared.for_worker(worker)  # its own or its node's copy when replicated
    unit = job.train.batch if job.train.batch > 1 else job.train.update_every
    exchange = ExchangeClock(shared, worker, job.train.exchange_every, unit)
    control, stats = arena.array("control"), arena.array("stats")
    order = arena.array("order")
    if feeds is None:
        train_images, train_labels = arena.array("train_images"), arena.array("train_labels")
        test_images, test_labels = arena.array("test_images"), arena.array("test_labels")
    optim, train, data = job.optim, job.train, job.data
    rule = RULE_CODES[optim.rule]
    mu = optim.momentum if optim.rule == "momentum" else 0.0
    my_stats = stats[worker]

    def train_range(images, labels, order, lo, hi, lr):
        """Train examples ``order[lo:hi]``; a node's leader stops to exchange on schedule."""
        loss, correct = 0.0, 0
        start = lo
        while start < hi:
            stop = start + exchange.span(hi - start)
            part_loss, part_correct = context.train_chunk(
                network.ops,
                params,
                velocity,
                images,
                labels,
                order,
                start,
                stop,
                batch=train.batch,
                lr=lr,
                mu=mu,
                wd=optim.weight_decay,
                rule=rule,
                mean=data.mean,
                std=data.std,
                update_every=train.update_every,
            )
            exchange.trained(stop - start)
            loss += part_loss
            correct += part_correct
            start = stop
        return loss, correct

    while True:
        try:
            command = commands.get(timeout=COMMAND_POLL_S)
        except queue.Empty:
            if os.getppid() != parent:
                return
            continue
        kind = command[0]
        if kind == "stop":
            return
        if kind == "train" and feeds is not None:
            _, epoch, lr, start, stop, seed = command
            seed_kernels(seed)

            def step(images, labels, identity, n, lr=lr):
                return train_range(images, labels, identity, 0, n, lr)

            def still_open(epoch=epoch):
                return control[CONTROL_EPOCH] == epoch and os.getppid() == parent

            shard = order[start:stop]
            done, loss, correct, waited = feeds.train(epoch, shard, step, still_open, my_stats)
            results.put(("trained", worker, epoch, done, loss, correct, waited))
        elif kind == "train":
            _, epoch, lr, start, stop, seed = command
            seed_kernels(seed)
            done, loss, correct = 0, 0.0, 0
            for lo in range(start, stop, train.chunk):
                if control[CONTROL_EPOCH] != epoch or os.getppid() != parent:
                    break
                hi = min(lo + train.chunk, stop)
                chunk_loss, chunk_correct = train_range(
                    train_images, train_labels, order, lo, hi, lr
                )
                done += hi - lo
                loss += chunk_loss
                correct += chunk_correct
                my_stats[STAT_EXAMPLES] += hi - lo
                my_stats[STAT_LOSS] += chunk_loss
                my_stats[STAT_CORRECT] += chunk_correct
            results.put(("trained", worker, epoch, done, loss, correct, 0.0))
        elif kind == "eval" and feeds is not None:
            _, start, stop = command

            def measure(images, labels, n):
                return evaluate_range(
                    network.ops,
                    params,
                    context.act,
                    context.aux,
                    context.scratch,
                    images,
                    labels,
                    0,
                    n,
                    data.mean,
                    data.std,
                )

            loss, correct = feeds.evaluate(start, stop, measure)
            results.put(("evaluated", worker, stop - start, loss, correct))
        elif kind == "eval":
            _, start, stop = command
            loss, correct = evaluate_range(
                network.ops,
                params,
                context.act,
                context.aux,
                context.scratch,
                test_images,
                test_labels,
                start,
                stop,
                data.mean,
                data.std,
            )
            results.put(("evaluated", worker, stop - start, loss, correct))


class _Feeds:
    """The worker's data feeds: its training shard and its test examples, read ahead.

    Made in the worker process. The training feed reads ``train.chunk`` examples per batch from
    the image cache's ``train`` split (opened here, with this worker's share of the RAM budget)
    or from the arena's examples (:class:`~hogwild.data.feed.ArrayReader`), augmented per
    (seed, epoch, index); the test feed, made at the first evaluation, renders the deterministic
    centre view of the ``test`` split.
    """

    def __init__(self, job, plan, arena) -> None:
        import numpy as np

        from hogwild.data.augment import AugmentSpec

        self.job, self.plan, self._arena = job, plan, arena
        text = job.data.augment.strip()
        self.spec = AugmentSpec.parse(text) if text else None
        self.chunk = job.train.chunk
        self.readers: list = []
        self.train_feed = self._feed(self._reader("train"), train=True)
        self.test_feed = None  # made at the first evaluation
        self.identity = np.arange(self.chunk, dtype=np.int64)  # each batch trains in feed order

    def _reader(self, split: str):
        """The image cache's ``split``, opened in this process, or the arena's examples."""
        if self.plan.cache:
            from hogwild.data.cache import open_cache

            budget = self.plan.ram_budget_bytes if split == "train" else 0
            reader = open_cache(self.plan.cache, split, ram_budget_bytes=budget)
        else:
            from hogwild.data.feed import ArrayReader

            images = self._arena.array(f"{split}_images")
            labels = self._arena.array(f"{split}_labels")
            # The feed's label buffers are int32, and ArrayReader copies labels without casting.
            reader = ArrayReader(images.reshape(-1, *self.plan.shape), labels)
        self.readers.append(reader)
        return reader

    def _feed(self, reader, train: bool):
        from hogwild.data.feed import WorkerFeed

        return WorkerFeed(
            reader,
            batch=self.chunk,
            augment=self.spec,
            seed=self.job.train.seed,
            train=train,
            channels_first=True,
            depth=self.job.data.prefetch_depth,
        )

    def train(self, epoch: int, shard, step, still_open, my_stats) -> tuple[int, float, int, float]:
        """Train on ``shard`` (record indices) batch by batch, counting into ``my_stats``.

        Args:
            epoch: The epoch (selects the augmentation variants).
            shard: This worker's record indices, in training order.
            step: ``step(images, labels, identity_order, n)`` trains one batch (``train_chunk``).
            still_open: False once the parent closed the epoch (or died): stop, drop read-ahead.
            my_stats: This worker's statistics row in the arena.

        Returns:
            (examples, summed loss, number correct, seconds waited for the feed).
        """
        from hogwild.train.job import STAT_CORRECT, STAT_EXAMPLES, STAT_LOSS

        feed = self.train_feed
        waited = feed.wait_s
        feed.start_epoch(epoch, shard.copy())  # a copy: the parent rewrites the order next epoch
        done, loss, correct = 0, 0.0, 0
        while True:
            if not still_open():
                feed.cancel()  # the epoch was closed early: drop what was read ahead
                break
            batch = feed.next_batch()
            if batch is None:
                break
            n = len(batch)
            chunk_loss, chunk_correct = step(
                batch.images.reshape(n, -1), batch.labels, self.identity, n
            )
            done += n
            loss += chunk_loss
            correct += chunk_correct
            my_stats[STAT_EXAMPLES] += n
            my_stats[STAT_LOSS] += chunk_loss
            my_stats[STAT_CORRECT] += chunk_correct
        return done, loss, correct, feed.wait_s - waited

    def evaluate(self, start: int, stop: int, measure) -> tuple[float, int]:
        """Summed loss and number correct of test records ``start:stop``."""
        import numpy as np

        if self.test_feed is None:
            self.test_feed = self._feed(self._reader("test"), train=False)
        feed = self.test_feed
        feed.start_epoch(0, np.arange(start, stop, dtype=np.int64))
        loss, correct = 0.0, 0
        while (batch := feed.next_batch()) is not None:
            n = len(batch)
            batch_loss, batch_correct = measure(batch.images.reshape(n, -1), batch.labels, n)
            loss += batch_loss
            correct += batch_correct
        return loss, correct

    def close(self) -> None:
        """Stop the prefetch threads, then close the caches."""
        for feed in (self.train_feed, self.test_feed):
            if feed is not None:
                feed.close()
        for reader in self.readers:
            if hasattr(reader, "close"):
                reader.close()


def _parent_is_gone(parent: int) -> bool:
    """True once the trainer has died, even while it is still a zombie.

    The parent-death signal arrives before this process is re-parented, so ``getppid()`` may
    still name the dead trainer; its process state tells the truth.
    """
    if os.getppid() != parent:
        return True
    import psutil

    try:
        return psutil.Process(parent).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent exits (prctl PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the worker still notices the parent's death when it polls
