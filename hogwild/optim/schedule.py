"""Learning-rate schedules: the learning rate of each epoch, decided by the parent.

The parent computes the rate once per epoch and hands it to the workers with the epoch's work, so
every worker trains an epoch at the same rate and a resumed job continues the same schedule.
"""

import math

from hogwild.config import OptimConfig


def learning_rate(optim: OptimConfig, epoch: int, total_epochs: int) -> float:
    """The learning rate for ``epoch`` (0-based) of ``total_epochs``.

    constant: ``lr``; step: ``lr * decay ** (epoch // decay_every)``; exponential:
    ``lr * decay ** epoch``; cosine: from ``lr`` down towards ``min_lr`` over the run.
    Never below ``min_lr``.
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
    return max(rate, optim.min_lr)
