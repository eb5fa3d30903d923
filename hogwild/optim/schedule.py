"""Learning-rate schedules: the learning rate of each epoch, decided by the parent.

The parent computes the rate once per epoch and hands it to the workers with the epoch's work, so
every worker trains an epoch at the same rate and a resumed job continues the same schedule.
With ``optim.smooth`` the parent hands them the next epoch's rate too (:func:`epoch_rates`) and
each worker moves its rate from one to the other across its shard, chunk by chunk
(:func:`rate_within`), as PyTorch's per-step schedulers do: a run of few epochs then ends at its
schedule's last rate instead of spending its whole last epoch at one rate.
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
    ``lr * decay ** epoch``; cosine: from ``lr`` down towards ``min_lr`` over the run; linear:
    from ``lr`` down to ``min_lr`` in equal steps, reaching it at the end of the run.
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
    elif optim.schedule == "linear":
        rate = optim.lr - (optim.lr - optim.min_lr) * epoch / max(total_epochs, 1)
    else:
        progress = epoch / max(total_epochs, 1)
        rate = optim.min_lr + 0.5 * (optim.lr - optim.min_lr) * (1 + math.cos(math.pi * progress))
    if epoch < optim.warmup_epochs:
        rate *= (epoch + 1) / (optim.warmup_epochs + 1)
    return max(rate, optim.min_lr)


def epoch_rates(optim: OptimConfig, epoch: int, total_epochs: int) -> tuple[float, float | None]:
    """The rate ``epoch`` starts at and, with ``optim.smooth``, the rate it ends at (the next
    epoch's; after the last, the schedule's value at the run's end); ``None`` without."""
    start = learning_rate(optim, epoch, total_epochs)
    if not optim.smooth:
        return start, None
    return start, learning_rate(optim, epoch + 1, total_epochs)


def rate_within(start: float, end: float | None, done: int, total: int) -> float:
    """The rate after ``done`` of a shard's ``total`` examples: ``start`` when ``end`` is None,
    else the straight line from ``start`` to ``end``."""
    if end is None or total <= 0:
        return start
    return start + (end - start) * min(done, total) / total
