"""The metrics file: JSON lines, one per epoch and a final summary.

Every line is a JSON object with an ``event`` field: ``start`` (the resolved config, the machine,
the model's connection count), ``epoch`` (losses, accuracies, throughput of that epoch) and
``final`` (the run's figures: ``connections``, ``examples_per_s``, ``connections_per_s``,
``train_loss``, ``test_accuracy`` as a fraction, ``workers``, ``epochs``, ``wall_s``, and the
config again). An epoch that ``train.evaluate_every`` leaves without an evaluation writes its line
with ``test_loss`` and ``test_accuracy`` null and ``evaluated`` false. Lines are appended and
flushed as they happen, so a crashed run keeps its history and a resumed run continues the same
file.

A new run does not add to an earlier run's file: that would mix two runs' epochs in one history
(and in ``hogwild plot``). A file that already holds records is refused unless the run continues
it (``--resume``) or replaces it (``--overwrite``: emptied when the new run writes its first
line, so a run that fails before it starts loses nothing).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from hogwild.errors import CheckpointError
from hogwild.outputs import writable_file

# the test figures of an epoch record whose epoch was not evaluated (``train.evaluate_every``)
NOT_EVALUATED = {"test_loss": None, "test_accuracy": None, "evaluated": False}


class MetricsWriter:
    """Appends JSON lines to a file; does nothing when no path is given.

    Raises:
        CheckpointError: The file holds an earlier run's records and neither ``resume`` nor
            ``overwrite`` was given (or both were).
    """

    def __init__(
        self,
        path: str | os.PathLike | None,
        resume: bool = False,
        overwrite: bool = False,
        listeners: tuple[Callable[[dict], object], ...] = (),
    ):
        self.path = Path(path) if path else None
        self.listeners = listeners  # also given every record (TensorBoard), file or no file
        self._replace = False
        if self.path is None:
            return
        if self.path.is_dir():
            raise CheckpointError(f"the metrics file {self.path} is a directory; name a file")
        writable_file(self.path, "metrics file (--metrics)")  # fail now, not after an epoch
        held = self.path.exists() and self.path.stat().st_size > 0
        if held and not resume:
            if not overwrite:
                raise CheckpointError(
                    f"the metrics file {self.path} already holds another run's records; pass "
                    "--resume to continue that run, --overwrite to replace the file, or choose "
                    "another file"
                )
            self._replace = True
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        for listener in self.listeners:
            listener(record)
        if self.path is None:
            return
        mode = "w" if self._replace else "a"
        self._replace = False
        with open(self.path, mode) as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")
            out.flush()
            os.fsync(out.fileno())


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All records of a metrics file, in order."""
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.strip()]
