"""The control of ``hogwild bench cores``: N processes training private copies of the model.

Each process is pinned as a worker would be and trains its own copy of the model on its own shard
with the engine's kernel (``train_chunk``), the same fully connected update interval as a job with
N workers, and nothing shared: what N cores of this machine give to work of the same kind. The
machine's virtual cores sometimes deliver less than a core each; the control, measured in the
same run as the engine, says how much scaling was on offer.
"""

from __future__ import annotations

import time

import numpy as np

from bench.support.machine import Gang
from hogwild.model.loops import LABEL_DTYPE


def _control_process(config_dict: dict, images, labels, batch: int, warmup: int, *, ready) -> dict:
    """Train a private model on a private shard: ``warmup`` examples, then the timed shard."""
    from hogwild.config import config_from_dict
    from hogwild.model.context import TrainingContext
    from hogwild.model.init import initialise
    from hogwild.model.network import build_network
    from hogwild.model.random import seed_kernels
    from hogwild.optim.rules import RULE_CODES

    job = config_from_dict(config_dict, origin="<bench>")
    network = build_network(job.model)
    params = np.zeros(network.n_params, dtype=np.float32)
    initialise(network, params, job.model.init, job.model.init_scale, job.train.seed)
    velocity = np.zeros_like(params)
    update_every = job.train.update_every if batch == 1 else 1
    context = TrainingContext.allocate(network, batch, update_every)
    optim, chunk = job.optim, job.train.chunk
    mu = optim.momentum if optim.rule == "momentum" else 0.0
    seed_kernels(job.train.seed)

    settings = dict(batch=batch, lr=optim.lr, mu=mu, wd=optim.weight_decay)
    settings.update(rule=RULE_CODES[optim.rule], mean=job.data.mean, std=job.data.std)
    settings.update(update_every=update_every)

    def train(order: np.ndarray) -> None:  # as a worker does: chunk by chunk
        for lo in range(0, len(order), chunk):
            stop = min(lo + chunk, len(order))
            context.train_chunk(
                network.ops, params, velocity, images, labels, order, lo, stop, **settings
            )

    train(np.arange(warmup, dtype=np.int64) % len(labels))
    ready()
    started = time.perf_counter()
    train(np.arange(len(labels), dtype=np.int64))
    return {"examples": len(labels), "seconds": time.perf_counter() - started}


def job_update_every(config, workers: int):
    """``config`` with ``train.update_every`` resolved as a job of ``workers`` workers has it."""
    from hogwild.model.network import build_network
    from hogwild.optim.interval import update_every
    from hogwild.store.registry import store_class
    from hogwild.training.placement import worker_placements

    store = store_class(config.train.parameters)(
        config, build_network(config.model), worker_placements(workers, config.train.placement)
    )
    return config.override({"train.update_every": update_every(config, store.writers_per_copy)})


def measure_control(gang: Gang, config, images, labels, order, shards, *, batch, warmup) -> dict:
    """Examples per second of ``len(shards)`` independent private-model processes.

    Each trains as a worker of a job with that many workers would: the same ``update_every``.
    """
    warm_each = -(-warmup // len(shards))
    config = job_update_every(config.override({"train.batch": batch}), len(shards))
    args = []
    for start, stop in shards:
        chosen = order[start:stop]
        shard = np.ascontiguousarray(images[chosen].reshape(len(chosen), -1))
        shard_labels = np.ascontiguousarray(labels[chosen], LABEL_DTYPE)  # what was compiled
        args.append((config.to_dict(), shard, shard_labels, batch, warm_each))
    seconds, answers = gang.run(_control_process, args)
    return {"examples_per_s": sum(a["examples"] for a in answers) / seconds}
