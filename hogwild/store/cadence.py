"""The rules an exchange's cadences obey: whole units, and no push that decays a whole weight.

A copy's exchanges (:mod:`hogwild.store.exchange`) fall on unit boundaries, so that an exchange
never cuts a minibatch: :func:`training_unit`. A push of activation and error vectors carries
the weight decay of the examples it covers, ``lr x decay`` per unit, which must stay below the
whole weight: :func:`push_decay_problem`. The copies stores apply both where they resolve their
own cadence, the config checks where the job sets one, and the trainer rounds its chunks to the
unit; so they live here, below all three, with no numba and nothing else imported.
"""

from __future__ import annotations

__all__ = ["push_decay_problem", "training_unit"]


def training_unit(config) -> int:
    """Examples trained as one: a minibatch (``train.batch``) or, at batch 1, a group of
    examples whose fully connected updates are applied together (``train.update_every``)."""
    train = config.train
    return train.batch if train.batch > 1 else max(1, train.update_every)


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
