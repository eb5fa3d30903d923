"""How often a worker applies its fully connected weight updates (``train.update_every``).

Adam applies every example's update at once (section 3.2.2). With several workers writing one copy
of the weights, though, per-example writes to the same 1.15 MB of fully connected rows keep moving
cache lines between cores; applying each worker's fully connected updates every few examples,
summed from their activation and error vectors (the local form of section 3.2.6), removes that
cost. A worker with a copy of its own (the default store) has no such traffic and keeps Adam's
per-example updates. The effect on accuracy is measured in ``bench/results/update_every.md``.
"""

from hogwild.config import Config

AUTO_UPDATE_EVERY = 8
CHUNK_CONNECTIONS = 1 << 33
"""Forward connections (multiply-accumulates) a chunk holds at most: a worker stamps its heartbeat
only between chunks, so a chunk of ``train.chunk`` examples of a model of hundreds of millions of
connections would run for minutes and be taken for a stuck worker (``train.stall_s``). 2**33
keeps 256 examples up to 33 million connections (Adam's MNIST model has 0.76 million) and holds
a chunk to a few seconds of one core's work whatever the model."""


def update_every(config: Config, writers: int) -> int:
    """The job's fully connected update interval: as configured, or chosen when it is 0.

    Chosen: per example (1) when a copy of the weights has one writer, as Adam trains; every
    ``AUTO_UPDATE_EVERY`` examples when several workers write the same copy, whose per-example
    writes to the same fully connected rows would otherwise keep moving cache lines between
    cores (``bench/results/update_every.md``).

    Args:
        config: The job.
        writers: The most workers that write one copy (the store's ``writers_per_copy``).
    """
    if config.train.update_every:
        return config.train.update_every
    return AUTO_UPDATE_EVERY if writers > 1 and config.train.batch == 1 else 1


def training_unit(config: Config) -> int:
    """Examples trained as one: a minibatch (``train.batch``) or, at batch 1, a group of
    examples whose fully connected updates are applied together (``train.update_every``)."""
    train = config.train
    return train.batch if train.batch > 1 else max(1, train.update_every)


def whole_units(config: Config, connections: int = 0) -> int:
    """``train.chunk``, at most :data:`CHUNK_CONNECTIONS` ÷ ``connections`` examples (the
    model's forward connections; 0: not capped), rounded down to whole units (at least one), so
    no chunk cuts a minibatch."""
    unit = training_unit(config)
    chunk = config.train.chunk
    if connections > 0:
        chunk = min(chunk, CHUNK_CONNECTIONS // connections)
    return max(unit, chunk // unit * unit)
