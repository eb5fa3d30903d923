"""The update rules' codes, as the kernels take them, and the size of an adaptive rule's state.

The kernels that apply the rules are :mod:`hogwild.optim.rules`; what a job's plan needs of them
(which code a rule has, whether its state is a worker's moments, how many floats that state
takes) lives here, beside no kernel, so that a process that only plans or checkpoints a job (a
trainer's parent whose kernels are compiled, a replica's) loads no numba for it.
"""

from __future__ import annotations

RULE_SGD = 0
RULE_MOMENTUM = 1
RULE_ADAM = 2
RULE_ADAMW = 3
RULE_CODES = {"sgd": RULE_SGD, "momentum": RULE_MOMENTUM, "adam": RULE_ADAM, "adamw": RULE_ADAMW}
# The training loop's code for a gradient and no update (hogwild.model.loops.gradient_range):
# beside the rules' so that no rule takes it, and not in RULE_CODES, so no config names it.
GRADIENT_ONLY = -1
ADAPTIVE_RULES = ("adam", "adamw")  # the rules whose state is a worker's moments


def moments_size(n_params: int) -> int:
    """Floats of a worker's Adam state: ``m``, ``v`` and the step count."""
    return 2 * n_params + 1
