"""The metrics file: JSON lines, one per epoch and a final summary.

Every line is a JSON object with an ``event`` field: ``start`` (the resolved config, the machine,
the model's connection count), ``epoch`` (losses, accuracies, throughput of that epoch) and
``final`` (the run's figures: ``connections``, ``examples_per_s``, ``connections_per_s``,
``train_loss``, ``test_accuracy`` as a fraction, ``workers``, ``epochs``, ``wall_s``, and the
config again). Lines are appended and flushed as they happen, so a crashed run keeps its history
and a resumed run continues the same file.
"""

from __future__ import annotations

import json
import os

from hogwild.outputs import writable_file


class MetricsWriter:
    """Appends JSON lines to a file; does nothing when no path is given."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = writable_file(path, "metrics file (--metrics)") if path else None

    def write(self, record: dict) -> None:
        if self.path is None:
            return
        with open(self.path, "a") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")
            out.flush()
            os.fsync(out.fileno())


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All records of a metrics file, in order."""
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.strip()]
