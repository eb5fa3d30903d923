"""The checkpoint of a trained epoch: what ``hogwild train``, the partitioned trainer and the
cluster's driver save at an epoch's end, in the format of :mod:`hogwild.training.checkpoint`.

Apart from the trainer so that a process that only saves what others trained (the driver) loads
neither the trainer's modules nor the kernels behind them.
"""

from __future__ import annotations

import numpy as np

from hogwild.config import Config
from hogwild.data.plan import CacheData
from hogwild.model.network import Network
from hogwild.training import checkpoint as ckpt


def save_checkpoint(
    config: Config,
    network: Network,
    params: np.ndarray,
    velocity: np.ndarray,
    epoch: int,
    record: dict,
    history: list[dict],
    n_classes: int,
    n_train: int,
    data,
    extra: dict | None = None,
    moments: dict[str, np.ndarray] | None = None,
):
    """Write the checkpoint of ``epoch`` into ``output.checkpoint_dir``; its sidecar's path.

    The weights under PyTorch's names and layouts, the velocity and Adam's per-worker
    ``moments`` (:func:`hogwild.training.moments.moments_state`) as the optimizer state, and in
    the sidecar the resolved config, the epoch, the schedule's learning rate, the seed, the data
    position, the epoch's metrics and the history (:mod:`hogwild.training.checkpoint`).
    """
    weights = {k: v.copy() for k, v in network.views(params).items()}
    optimizer_state = {f"{k}.momentum": v.copy() for k, v in network.views(velocity).items()}
    optimizer_state.update(moments or {})
    info = {
        "config": config.to_dict(),
        "epoch": epoch,
        "optimizer": {"rule": config.optim.rule, "lr": record["lr"]},
        "seeds": {"seed": config.train.seed},
        "data_position": {"next_epoch": epoch + 1, "examples_per_epoch": n_train},
        "metrics": record,
        "history": history,
        "connections": network.connections,
        "n_classes": n_classes,
        **(extra or {}),  # a PyTorch module's names (torch_names), float inputs (inputs)
    }
    if isinstance(data, CacheData):
        info["data"] = {"cache": data.path, "classes": list(data.classes)}
    return ckpt.write_checkpoint(
        config.output.checkpoint_dir,
        epoch,
        weights,
        optimizer_state,
        info,
        keep=config.output.keep_checkpoints,
    )
