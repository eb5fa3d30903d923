"""Draw Adam's Fig. 8 from a ``bench/figures/adam_fig8_cores.py`` record: connections/s against
worker processes.

One panel per batch size. Each shows ours and the PyTorch Hogwild peer (medians, with the
min-max range of the repetitions as error bars), the linear scaling of our one-worker figure,
and what the machine offered in the same run: our one-worker figure times the speedup of N
independent private-model processes (the control). matplotlib is imported only when a plot is
drawn (:mod:`bench.support.plot`).
"""

from __future__ import annotations

from pathlib import Path

from bench.support.plot import pyplot, save


def _errors(rows: list[dict], key: str, scale: float) -> tuple[list[float], list[list[float]]]:
    """Medians and (below, above) error-bar lengths of ``key`` in ``rows``, times ``scale``."""
    values, below, above = [], [], []
    for row in rows:
        median = row[key] * scale
        low, high = row.get(f"{key}_range") or (row[key], row[key])
        values.append(median)
        below.append(max(0.0, median - low * scale))
        above.append(max(0.0, high * scale - median))
    return values, [below, above]


def plot_cores(record: dict, path: str | Path) -> Path:
    """Draw Fig. 8 for ``record`` (the JSON record of ``bench/figures/adam_fig8_cores.py``) into a
    PNG file.

    Args:
        record: the benchmark's record, with ``connections`` and ``results`` rows.
        path: the PNG file to write; its directory is created if missing.

    Returns:
        The path written.

    Raises:
        RuntimeError: matplotlib is not installed (``pip install 'hogwild[bench]'``).
    """
    plt = pyplot()

    connections = record["connections"]
    scale = connections / 1e9  # examples/s -> G connections/s
    batches = sorted({row["batch"] for row in record["results"]})
    figure, axes = plt.subplots(
        1, len(batches), figsize=(max(7.0, 5.5 * len(batches)), 4.8), squeeze=False
    )
    for ax, batch in zip(axes[0], batches, strict=True):
        rows = sorted(
            (row for row in record["results"] if row["batch"] == batch),
            key=lambda row: row["workers"],
        )
        workers = [row["workers"] for row in rows]
        ours, ours_err = _errors(rows, "examples_per_s", scale)
        peer, peer_err = _errors(rows, "peer_examples_per_s", scale)
        ax.errorbar(workers, ours, yerr=ours_err, marker="o", capsize=3, label="hogwild (ours)")
        ax.errorbar(
            workers, peer, yerr=peer_err, marker="s", capsize=3, label="PyTorch Hogwild (peer)"
        )
        one = next((row for row in rows if row["workers"] == 1), None)
        if one is not None:
            base = one["examples_per_s"] * scale
            ax.plot(workers, [base * n for n in workers], "k:", label="linear scaling")
            if all(row.get("control_speedup") for row in rows):
                offered = [base * row["control_speedup"] for row in rows]
                ax.plot(workers, offered, "--", color="grey", label="machine (control)")
        ax.set_xlabel("worker processes (cores)")
        ax.set_ylabel("G connections / s")
        ax.set_xticks(workers)
        ax.set_ylim(bottom=0)
        ax.set_title(f"batch {batch}" + (" (Adam's per-example SGD)" if batch == 1 else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    machine = record.get("machine", {})
    figure.suptitle(
        f"Adam Fig. 8: {connections:,} connections per example\n"
        f"{machine.get('cpu_model', 'this machine')}, {machine.get('usable_cores', '?')} cores",
        fontsize="medium",
    )
    return save(figure, path)
