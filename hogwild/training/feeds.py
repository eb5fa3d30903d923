"""A worker's data feeds: its training shard and its test examples, read ahead by threads.

A job on an LMDB image cache, or with ``data.augment``, trains through these instead of reading
the arena in place: a :class:`~hogwild.data.feed.WorkerFeed` per split, made in the worker's own
process (the cache is opened here, never inherited across process creation), whose prefetch
thread reads and augments the next batch of the shard while the kernels train on the current
one. ``data_wait_s`` is the time the compute loop waited for it.

A job with data servers (``data.servers``) reads through a
:class:`~hogwild.data.remote.RemoteReader` per split instead: the servers render the augmentation
and deliver the model's layout, so the feed passes their batches through untouched, and each
epoch's reads ask for that epoch's variants.
"""

from __future__ import annotations

import os


class Feeds:
    """The worker's data feeds: its training shard and its test examples, read ahead.

    Made in the worker process. The training feed reads ``chunk`` examples per batch from
    the image cache's ``train`` split (opened here, with this worker's share of the RAM budget)
    or from the arena's examples (:class:`~hogwild.data.feed.ArrayReader`), augmented per
    (seed, epoch, index); the test feed, made at the first evaluation, renders the deterministic
    centre view of the ``test`` split.
    """

    def __init__(self, job, plan, arena, chunk: int, worker: int | None = None) -> None:
        import numpy as np

        from hogwild.data.augment import AugmentSpec

        self.job, self.plan, self._arena = job, plan, arena
        # The data server asked first: the worker's index spreads a job's workers over them.
        self.worker = int.from_bytes(os.urandom(2), "little") if worker is None else worker
        text = job.data.augment.strip()
        self.spec = AugmentSpec.parse(text) if text else None
        self.chunk = chunk  # whole units (minibatches), so no minibatch is cut
        self.readers: list = []
        self.train_feed = self._feed(self._reader("train"), train=True)
        self.test_feed = None  # made at the first evaluation
        self.identity = np.arange(self.chunk, dtype=np.int64)  # each batch trains in feed order

    def _reader(self, split: str):
        """The data servers' ``split``, the image cache's (opened in this process), or the
        arena's examples."""
        if self.plan.servers:
            from hogwild.data.remote import RemoteReader

            reader = RemoteReader(
                self.plan.servers,
                split,
                start=self.worker,
                data_id=self.plan.data_id,
                timeout_s=self.job.data.timeout_s,
                keys=self.job.ps.keys or None,
            )
        elif self.plan.cache:
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

        served = bool(self.plan.servers)  # batches arrive augmented, [n, C, h, w]: as they are
        return WorkerFeed(
            reader,
            batch=self.chunk,
            augment=None if served else self.spec,
            seed=self.job.train.seed,
            train=train,
            channels_first=not served,
            depth=self.job.data.prefetch_depth,
        )

    def train(self, epoch: int, shard, step, still_open, count) -> tuple[int, float, int, float]:
        """Train on ``shard`` (record indices) batch by batch.

        Args:
            epoch: The epoch (selects the augmentation variants).
            shard: This worker's record indices, in training order.
            step: ``step(images, labels, identity_order, n)`` trains one batch (``train_chunk``).
            still_open: False once the parent closed the epoch (or died): stop, drop read-ahead.
            count: ``count(n, loss, correct)`` after every batch (the worker's statistics).

        Returns:
            (examples, summed loss, number correct, seconds waited for the feed).
        """
        feed = self.train_feed
        waited = feed.wait_s
        variants = feed.reader.for_epoch(epoch) if self.plan.servers else None
        # A copy of the shard: the parent rewrites the order next epoch.
        feed.start_epoch(epoch, shard.copy(), variants)
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
            count(n, chunk_loss, chunk_correct)
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
        """Stop the prefetch threads, then close the caches. A read in progress from a data
        server is cancelled first: the worker is leaving, and waits for no timeout."""
        for reader in self.readers:
            if hasattr(reader, "cancel"):
                reader.cancel()
        for feed in (self.train_feed, self.test_feed):
            if feed is not None:
                feed.close()
        for reader in self.readers:
            if hasattr(reader, "close"):
                reader.close()
