"""The weight decay one push of vectors carries: it must not remove a whole weight.

A push of activation and error vectors (Adam section 3.2.6, :mod:`hogwild.store.exchange`)
carries the weight decay of every unit it covers, ``lr x decay`` each, applied at once where the
update is formed. Past the whole weight it would flip the weights' sign: :func:`push_decay_problem`
says so. The copies stores check it where they resolve their own cadence, the config checks where
the job sets one; so it lives here, below both, importing nothing (no numba).
"""

from __future__ import annotations

__all__ = ["push_decay_problem"]


def push_decay_problem(optim, n_push: int, what: str) -> str | None:
    """What is wrong when the weight decay one push of vectors carries (``lr x decay x
    n_push``, the fraction of a weight it removes) would remove the whole weight; else None."""
    decay = optim.lr * optim.weight_decay * n_push
    if decay < 1.0:
        return None
    return (
        f"optim.lr x optim.weight_decay x {what} = {decay:g}: the weight decay one push "
        "carries would remove the whole weight; lower train.n_push or the decay"
    )
