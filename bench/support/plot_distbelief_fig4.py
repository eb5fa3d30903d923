"""Draw DistBelief's Fig. 4 from a ``bench/figures/distbelief_fig4_frameworks.py`` record: test
accuracy against seconds.

One line per contender that ran (its epoch-end test accuracies against the driver's ``wall_s``),
a dot where it first reached the target, the target as a horizontal line and the budget as a
vertical one. The y axis shows 90 % to 100 % (where the race is); a contender whose best stays
below that says so in the legend with its best accuracy. Skipped contenders are named in the
legend too. matplotlib is imported only here (Agg backend, no display).
"""

from __future__ import annotations

from pathlib import Path

from bench.support.plot import pyplot, save

Y_FLOOR = 0.9


def plot_fig4(record: dict, path: str | Path) -> Path:
    """Write the figure for ``record`` to ``path`` (PNG); the path.

    Raises:
        RuntimeError: matplotlib is not installed (``pip install 'hogwild[bench]'``).
    """
    plt = pyplot()

    target, budget = record["target"], record["budget_s"]
    figure, ax = plt.subplots(figsize=(8.5, 5.2))
    for i, row in enumerate(record["results"]):
        color = f"C{i % 10}"
        if row["skipped"] or not row["curve"]:
            why = "skipped: not built" if row["skipped"] else "no curve: failed"
            ax.plot([], [], color=color, ls=":", label=f"{row['label']} ({why})")
            continue
        xs = [point[0] for point in row["curve"]]
        ys = [point[1] for point in row["curve"]]
        label = row["label"]
        if row["time_to_target_s"] is not None:
            label += f": {target:.1%} at {row['time_to_target_s']:.0f} s"
        else:
            label += f": best {row['best_test_accuracy']:.2%}, target not reached"
        if row["best_test_accuracy"] < Y_FLOOR:
            label += " (below the axis)"
        ax.plot(xs, ys, marker=".", color=color, label=label)
        if row["time_to_target_s"] is not None:
            hit = row["time_to_target_s"]
            ax.plot([hit], [ys[xs.index(hit)]], "o", ms=8, mfc="none", color=color)
    ax.axhline(target, color="k", ls="--", lw=1, label=f"target {target:.1%}")
    ax.axvline(budget, color="grey", ls=":", lw=1, label=f"budget {budget:.0f} s")
    ax.set_ylim(Y_FLOOR, 1.0)
    last = max((p[0] for r in record["results"] for p in r["curve"]), default=0.0)
    ax.set_xlim(0, max(budget, last) * 1.03)
    ax.set_xlabel("wall-clock seconds since training began (same machine, one run at a time)")
    ax.set_ylabel("test accuracy (10,000 MNIST images)")
    machine = record.get("machine", {})
    ax.set_title(
        "DistBelief Fig. 4 on MNIST (Adam's CNN): accuracy against time\n"
        f"{machine.get('cpu_model', 'this machine')}, {machine.get('usable_cores', '?')} cores",
        fontsize="medium",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc="lower left")  # the lines run along the top
    return save(figure, path)
