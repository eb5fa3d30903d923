"""The rule a push's cadence obeys: no push that decays a whole weight.

A push of activation and error vectors carries the weight decay of the examples it covers,
``lr x decay`` per unit, which must stay below the whole weight: :func:`push_decay_problem`. The
copies stores apply it where they resolve their own cadence and the config checks where the job
sets one; so it lives here, below both, with nothing imported. (Exchanges fall on whole units:
:func:`hogwild.optim.interval.training_unit`.)
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
