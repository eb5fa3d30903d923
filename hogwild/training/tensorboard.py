"""TensorBoard scalars of a training run (``--tensorboard DIR``, ``output.tensorboard``).

Per epoch, under ``epoch/``: the train and test loss and accuracy, the learning rate and the
examples per second, at step = the epoch's number (1, 2, ...). While an epoch trains, under
``train/``: the running training loss and examples per second every ``output.tensorboard_every``
steps (updates: examples over ``train.batch``, all workers together), at step = updates so far.
The in-epoch figures are read from the workers' statistics rows as the parent polls them, so a
point lands at the first poll after its step, not exactly on it.

``hogwild cluster`` writes the per-epoch scalars (its driver sees epochs, not the replicas'
steps). The writer is tensorboardX's (the ``tensorboard`` extra: it needs neither TensorFlow nor
PyTorch); PyTorch's ``torch.utils.tensorboard`` is used when only that is installed.
"""

from __future__ import annotations

from typing import Any

from hogwild.errors import ConfigError
from hogwild.outputs import writable_directory

TENSORBOARD_DIR = "TensorBoard directory (--tensorboard)"  # as a path's error names it
EPOCH_SCALARS = (
    "train_loss", "train_accuracy", "test_loss", "test_accuracy", "lr", "examples_per_s",
)  # fmt: skip


def _summary_writer(directory: str):
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                f"--tensorboard {directory} needs tensorboardX: pip install 'hogwild[tensorboard]'"
                " (or tensorboardX)"
            ) from None
    return SummaryWriter(directory)


class TensorBoardLog:
    """Scalars of one run into ``directory``; nothing at all when ``directory`` is empty."""

    def __init__(self, directory: str, every: int, batch: int):
        if directory:  # one line naming the path, not the writer's traceback
            writable_directory(directory, TENSORBOARD_DIR)
        self.writer: Any = _summary_writer(directory) if directory else None
        self.every_examples = max(1, every) * max(1, batch)
        self.batch = max(1, batch)
        self._next = self.every_examples  # examples trained (all epochs) at the next point

    def training(self, examples_so_far: int, loss: float, examples_per_s: float) -> None:
        """The run has trained ``examples_so_far`` examples: a point if a step boundary passed."""
        if self.writer is None or examples_so_far < self._next:
            return
        step = examples_so_far // self.batch
        self.writer.add_scalar("train/loss", loss, step)
        self.writer.add_scalar("train/examples_per_s", examples_per_s, step)
        self._next = (examples_so_far // self.every_examples + 1) * self.every_examples

    def epoch(self, record: dict) -> None:
        """An epoch's metrics record: its figures at step = epoch number (from 1)."""
        if self.writer is None:
            return
        step = int(record["epoch"]) + 1
        for name in EPOCH_SCALARS:
            value = record.get(name)
            if value is not None:
                self.writer.add_scalar(f"epoch/{name}", float(value), step)
        self.writer.flush()

    def record(self, record: dict) -> None:
        """A metrics record: its figures if it is an epoch's (a listener of the metrics file)."""
        if record.get("event") == "epoch":
            self.epoch(record)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
