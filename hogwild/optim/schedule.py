"""Learning-rate schedules: the learning rate of each epoch, decided by the parent.

The parent computes the rate once per epoch and hands it to the workers with the epoch's work, so
every worker trains an epoch at the same rate and a resumed job continues the same schedule.
"""

import math

from hogwild.config import OptimConfig


def peak_learning_rate(optim: OptimConfig) -> float:
    """The largest rate :func:`learning_rate` gives for any epoch: ``lr``, or ``min_lr`` if it
    is larger (every schedule and the warm-up stay at or below ``lr``, and never below
    ``min_lr``)."""
    return max(optim.lr, optim.min_lr)


def learning_rate(optim: OptimConfig, epoch: int, total_epochs: int) -> float:
    """The learning rate for ``epoch`` (0-based) of ``total_epochs``.

    constant: ``lr``; step: ``lr * decay ** (epoch // decay_every)``; exponential:
    ``lr * decay ** epoch``; cosine: from ``lr`` down towards ``min_lr`` over the run.
    The first ``warmup_epochs`` epochs ramp up to that: epoch ``e`` trains at
    ``(e + 1) / (warmup_epochs + 1)`` of it. Never below ``min_lr``, warm-up included.
    Per-example SGD at a high rate can stop a network learning in its first few hundred updates
    (a run of the default job did, with one seed of three); a gentler first epoch keeps the
    rate's later speed without that risk.
    """
    if optim.schedule == "constant":
        rate = optim.lr
    elif optim.schedule == "step":
        rate = optim.lr * optim.decay ** (epoch // optim.decay_every)
    elif optim.schedule == "exponential":
        rate = optim.lr * optim.decay**epoch
    else:
        progress = epoch / max(total_epochs, 1)
        rate = optim.min_lr + 0.5 * (optim.lr - optim.min_lr) * (1 + math.cos(math.pi * progress))
    if epoch < optim.warmup_epochs:
        rate *= (epoch + 1) / (optim.warmup_epochs + 1)
    return max(rate, optim.min_lr)
