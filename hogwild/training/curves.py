"""Learning curves of finished (or running) jobs: ``hogwild plot RUN_OR_METRICS... --out FILE``.

Reads each run's metrics file (:mod:`hogwild.training.metrics`; a run directory stands for the
``metrics.jsonl`` in it) and draws four panels: test accuracy and loss (train and test) against
epochs, and the same against seconds of training, every run in each panel under its own label.
Seconds are the epochs' training time summed (``train_s``), so a run's evaluation and
checkpoint pauses do not stretch its curve. matplotlib comes with the ``bench`` extra and is
imported only here, when a plot is asked for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hogwild.errors import DataError, HogwildError
from hogwild.outputs import writable_file
from hogwild.training.metrics import read_metrics

RUN_FILE = "metrics.jsonl"  # what a run directory's metrics file is called in the docs


@dataclass
class Curve:
    """One run's per-epoch figures, in epoch order."""

    label: str
    epochs: list[int]
    seconds: list[float]
    train_loss: list[float | None]
    test_loss: list[float | None]
    test_accuracy: list[float | None]


def metrics_path(run: str | os.PathLike) -> Path:
    """The metrics file of ``run``: the file itself, or ``metrics.jsonl`` in a run directory.

    Raises:
        DataError: Neither exists.
    """
    path = Path(run)
    if path.is_dir():
        path = path / RUN_FILE
    if not path.is_file():
        raise DataError(
            f"{run}: no metrics file (give the file written by --metrics, or a run directory "
            f"holding {RUN_FILE})"
        )
    return path


def read_curve(run: str | os.PathLike, label: str | None = None) -> Curve:
    """The epochs of one run's metrics file.

    Raises:
        DataError: The file is not JSON lines, or holds no epoch.
    """
    path = metrics_path(run)
    try:
        records = read_metrics(path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a metrics file (JSON lines): {exc}") from None
    epochs = [r for r in records if isinstance(r, dict) and r.get("event") == "epoch"]
    if not epochs:
        raise DataError(f"{path}: no epoch recorded yet")
    seconds, total = [], 0.0
    for record in epochs:
        total += float(record.get("train_s") or 0.0)
        seconds.append(total)
    return Curve(
        label=label or run_label(path),
        epochs=[int(r["epoch"]) + 1 for r in epochs],
        seconds=seconds,
        train_loss=[r.get("train_loss") for r in epochs],
        test_loss=[r.get("test_loss") for r in epochs],
        test_accuracy=[_percent(r.get("test_accuracy")) for r in epochs],
    )


def run_label(path: Path) -> str:
    """A short name for a run: its directory's name for ``DIR/metrics.jsonl``, else the file's
    stem."""
    return path.parent.name if path.name == RUN_FILE and path.parent.name else path.stem


def _percent(value: float | None) -> float | None:
    return None if value is None else 100.0 * float(value)


def plot_runs(runs: list[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Draw the runs' curves into the image ``out`` (its suffix picks the format); its path.

    Raises:
        HogwildError: matplotlib is not installed.
        DataError: A run has no metrics file or no epoch yet.
    """
    curves = [read_curve(run) for run in runs]  # every input checked before drawing anything
    out = writable_file(out, "plot (--out)")  # and where it goes
    if len({curve.label for curve in curves}) < len(curves):  # two runs named alike: paths
        for curve, run in zip(curves, runs, strict=True):
            curve.label = str(run)
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise HogwildError(
            "hogwild plot needs matplotlib: pip install 'hogwild[bench]' (or matplotlib)"
        ) from None
    figure, axes = plt.subplots(2, 2, figsize=(11, 7.5), constrained_layout=True)
    from matplotlib.ticker import MaxNLocator

    for column, (x_name, x_label) in enumerate(
        (("epochs", "epoch"), ("seconds", "seconds of training"))
    ):
        accuracy, loss = axes[0][column], axes[1][column]
        for index, curve in enumerate(curves):
            colour = f"C{index % 10}"
            x = getattr(curve, x_name)
            _draw(accuracy, x, curve.test_accuracy, colour, "-", curve.label)
            _draw(loss, x, curve.train_loss, colour, "--", f"{curve.label} (train)")
            _draw(loss, x, curve.test_loss, colour, "-", f"{curve.label} (test)")
        accuracy.set(xlabel=x_label, ylabel="test accuracy (%)")
        loss.set(xlabel=x_label, ylabel="loss", yscale="log")
        for panel in (accuracy, loss):
            if x_name == "epochs":
                panel.xaxis.set_major_locator(MaxNLocator(integer=True))
            panel.grid(alpha=0.3)
            panel.legend(fontsize="small")
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def _draw(panel, x, y, colour: str, style: str, label: str) -> None:
    points = [(a, b) for a, b in zip(x, y, strict=True) if b is not None]
    if points:
        xs, ys = zip(*points, strict=True)
        panel.plot(xs, ys, style, color=colour, marker="o", markersize=3, label=label)
