"""A job's checkpoint directory: start fresh, continue (``--resume``) or replace (``--overwrite``).

A fresh run into a directory that already holds another run's checkpoints would mix the two:
pruning keeps the newest epochs, which may be the old run's, and ``--resume`` or ``hogwild eval
DIR`` would then pick the old run. So such a run is refused unless the user says which they
mean: ``--resume`` continues the checkpoints there, ``--overwrite`` replaces them (they are
removed when the new run commits its first checkpoint, so a run that fails before that loses
nothing).

On resume the checkpoint's recorded config is compared with the job's: a different architecture
(``model.input``, ``model.layers``, the number of classes) cannot take the saved weights and is
an error naming the difference; other changes (more epochs, a new learning rate) are allowed and
reported, one line each. :func:`starting_point` is where a job's parameters start: its initial
weights, or the last checkpoint's weights and momentum.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from hogwild.errors import CheckpointError
from hogwild.model.init import initialise
from hogwild.outputs import writable_directory
from hogwild.training import checkpoint as ckpt

ARCHITECTURE = ("model.input", "model.layers")


def check_directory(directory: str, resume: bool, overwrite: bool) -> bool:
    """Refuse to mix runs in ``directory``; return whether its old checkpoints must be replaced.

    Raises:
        CheckpointError: ``--resume`` without a directory, both flags at once, or a directory
            that holds checkpoints when neither flag was given.
    """
    if resume and overwrite:
        raise CheckpointError(
            "--resume continues the checkpoints, --overwrite replaces them: give one of them"
        )
    if not directory:
        if resume:
            raise CheckpointError("--resume needs a checkpoint directory (--checkpoint-dir DIR)")
        return False
    writable_directory(directory, "checkpoint directory (--checkpoint-dir)")  # before any epoch
    found = ckpt.checkpoint_files(Path(directory))
    if not found or resume:
        return False
    if overwrite:
        return True
    shown = ", ".join(sorted(found)[:3]) + (", ..." if len(found) > 3 else "")
    raise CheckpointError(
        f"{directory} already holds checkpoints of another run ({shown}); pass --resume to "
        "continue that run, --overwrite to replace its checkpoints, or choose another directory"
    )


def starting_point(
    config, network, n_classes: int, resume: bool, say: Callable[[str], None]
) -> tuple[np.ndarray, np.ndarray, int, list[dict]]:
    """Parameters, velocity, first epoch and history a job starts from.

    The initial weights (``model.init``, seeded), or with ``resume`` and a checkpoint in
    ``output.checkpoint_dir`` its weights and momentum, epoch and history; settings that differ
    from the checkpoint's are passed to ``say``, one line.

    Raises:
        CheckpointError: The checkpoint's architecture differs, or its tensors do not fit.
    """
    params = np.zeros(network.n_params, dtype=np.float32)
    velocity = np.zeros_like(params)
    initialise(network, params, config.model.init, config.model.init_scale, config.train.seed)
    directory = config.output.checkpoint_dir
    if not resume or ckpt.latest_checkpoint(directory) is None:
        return params, velocity, 0, []
    restored = ckpt.load_checkpoint(directory)
    saved_classes = int(restored.info.get("n_classes", n_classes))
    changes = compare_configs(
        restored.info.get("config", {}), config.to_dict(), saved_classes, n_classes
    )
    if changes:
        say("resuming with changed settings: " + "; ".join(changes))
    ckpt.restore_parameters(network, params, restored.weights, restored.path, "")
    ckpt.restore_parameters(network, velocity, restored.optimizer_state, restored.path, ".momentum")
    return params, velocity, restored.epoch + 1, list(restored.info.get("history", []))


def _flatten(table: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def compare_configs(saved: dict, current: dict, saved_classes: int, classes: int) -> list[str]:
    """The settings that differ between a checkpoint's config and the job's, as lines.

    Raises:
        CheckpointError: The architecture differs (the message names the first difference).
    """
    if saved_classes != classes:
        raise CheckpointError(
            f"the checkpoint's model has {saved_classes} classes, the data has {classes}: "
            "its weights do not fit; train afresh in another directory"
        )
    before, after = _flatten(saved), _flatten(current)
    for key in ARCHITECTURE:
        old, new = _layers(saved, key), _layers(current, key)
        if old != new:
            raise CheckpointError(
                f"cannot resume: the checkpoint's {_first_difference(key, old, new)}; the "
                "architecture must match the checkpoint's (train afresh in another directory)"
            )
    changes = []
    for key in sorted(set(before) | set(after)):
        if key.startswith(ARCHITECTURE) or key.startswith("output."):
            continue
        if before.get(key) != after.get(key):
            changes.append(f"{key}: {before.get(key)!r} -> {after.get(key)!r}")
    return changes


def _layers(config: dict, dotted: str):
    section, key = dotted.split(".")
    return config.get(section, {}).get(key)


def _first_difference(key: str, old, new) -> str:
    if key == "model.layers" and isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return f"model.layers has {len(old)} layers, the config has {len(new)}"
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            for field in sorted(set(a) | set(b)):
                if a.get(field) != b.get(field):
                    return (
                        f"model.layers[{index}].{field} is {a.get(field)!r}, the config's is "
                        f"{b.get(field)!r}"
                    )
    return f"{key} is {old!r}, the config's is {new!r}"
