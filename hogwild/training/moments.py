"""Adam's per-worker moments: where they live during a job and how a checkpoint keeps them.

Each worker of an Adam or AdamW job keeps its own first and second moments and step count
(:mod:`hogwild.optim.rules`). On one machine the trainer puts them in the job's arena, one row
per worker (``MOMENTS_REGION``, ``[workers, 2 * n_params + 1]``: ``m``, ``v``, then ``t``), so
that between epochs, while every worker is idle, the parent can copy them into the checkpoint and,
on ``--resume``, write them back before the workers start. A resumed Adam job then continues
exactly as the unbroken one would have (one worker; several workers race, as they always do).

In a checkpoint's optimizer file a worker's moments are ``"<parameter>.exp_avg.worker<w>"`` and
``"<parameter>.exp_avg_sq.worker<w>"`` (``torch.optim.Adam``'s names for ``m`` and ``v``, in the
parameter's PyTorch layout) and the step counts ``"adam_step"`` (one per worker). A job resumed
with a different number of workers gives worker ``w`` the moments of saved worker
``w % saved``: each row estimates the same moments of the job's gradient. A checkpoint without
moments (written by SGD or momentum) starts them at zero, as a fresh job does.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from hogwild.errors import CheckpointError
from hogwild.model.network import Network
from hogwild.optim.rule_codes import ADAPTIVE_RULES, moments_size

MOMENTS_REGION = "moments"
STEP_KEY = "adam_step"
_WORKER_RE = re.compile(r"\.exp_avg\.worker(\d+)$")


def keeps_moments(rule: str) -> bool:
    """Whether a job with optimizer ``rule`` keeps per-worker moments."""
    return rule in ADAPTIVE_RULES


def moments_shape(network: Network, n_workers: int) -> tuple[int, int]:
    """The shape of the arena's moments region: one row per worker."""
    return (n_workers, moments_size(network.n_params))


def moments_state(network: Network, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The checkpoint tensors of every worker's moments (copies), named as the module says."""
    n = network.n_params
    state: dict[str, np.ndarray] = {}
    for worker, row in enumerate(rows):
        for kind, part in (("exp_avg", row[:n]), ("exp_avg_sq", row[n : 2 * n])):
            for name, view in network.views(part).items():
                state[f"{name}.{kind}.worker{worker}"] = view.copy()
    state[STEP_KEY] = rows[:, 2 * n].astype(np.float32)
    return state


def saved_workers(tensors: dict[str, np.ndarray]) -> int:
    """How many workers' moments ``tensors`` (a checkpoint's optimizer state) holds; 0 if none."""
    found = {int(m[1]) for key in tensors if (m := _WORKER_RE.search(key))}
    return max(found) + 1 if found else 0


def restore_moments(
    network: Network,
    rows: np.ndarray,
    tensors: dict[str, np.ndarray],
    path,
    say: Callable[[str], None],
) -> None:
    """Write a checkpoint's moments into ``rows`` (the arena's region), worker ``w`` from saved
    worker ``w % saved``; with none saved, leave ``rows`` at zero and say so.

    Raises:
        CheckpointError: A saved worker's tensor is missing or has another shape.
    """
    saved = saved_workers(tensors)
    if not saved:
        rows[...] = 0.0
        say(f"resuming: {path} holds no Adam moments (another rule wrote it); they start at zero")
        return
    steps = tensors.get(STEP_KEY)
    if steps is None or steps.shape != (saved,):
        raise CheckpointError(
            f"checkpoint {path}: {STEP_KEY!r} must hold {saved} step counts, one per worker, "
            f"got {None if steps is None else steps.shape}"
        )
    if saved != len(rows):
        say(
            f"resuming with {len(rows)} worker(s), the checkpoint's Adam moments are of {saved}: "
            f"worker w continues from saved worker w % {saved}"
        )
    n = network.n_params
    for worker, row in enumerate(rows):
        source = worker % saved
        for kind, part in (("exp_avg", row[:n]), ("exp_avg_sq", row[n : 2 * n])):
            for name, view in network.views(part).items():
                key = f"{name}.{kind}.worker{source}"
                if key not in tensors:
                    raise CheckpointError(f"checkpoint {path} has no tensor {key!r}")
                if tensors[key].shape != view.shape:
                    raise CheckpointError(
                        f"checkpoint {path}: {key} has shape {tensors[key].shape}, the "
                        f"configured model needs {view.shape}"
                    )
                view[...] = tensors[key]
        row[2 * n] = steps[source]
