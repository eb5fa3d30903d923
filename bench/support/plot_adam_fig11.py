"""Draw Adam's Fig. 11 from a ``bench/figures/adam_fig11_replicas.py`` record: examples/s
against model replicas, through one parameter server and independent, beside linear scaling.
matplotlib is imported only when a plot is drawn (:mod:`bench.support.plot`).
"""

from __future__ import annotations

from bench.support.plot import pyplot, save


def plot_fig11(record: dict, path: str) -> None:
    """Fig. 11: examples/s against replicas, through the server, independent, and linear."""
    fig, ax = pyplot().subplots(figsize=(6, 4.2))
    for ps, label, marker in (
        (True, "through 1 parameter server", "o"),
        (False, "independent", "s"),
    ):
        rows = sorted(
            (r for r in record["results"] if r["ps"] == ps and "n_push" not in r),
            key=lambda r: r["replicas"],
        )
        ax.plot([r["replicas"] for r in rows], [r["examples_per_s"] for r in rows], marker=marker,
                label=label)  # fmt: skip
    for r in (r for r in record["results"] if "n_push" in r):
        ax.plot([r["replicas"]], [r["examples_per_s"]], "^",
                label=f"through the server, n_push = n_fetch = {r['n_push']}")  # fmt: skip
    base = [r for r in record["results"] if r["ps"] and r["replicas"] == 1 and "n_push" not in r]
    if base:
        xs = sorted({r["replicas"] for r in record["results"]})
        ax.plot(xs, [x * base[0]["examples_per_s"] for x in xs], "k--", lw=1, label="linear")
    ax.set_xticks(sorted({r["replicas"] for r in record["results"]}))
    ax.set_xlabel("model replicas (1 worker each)")
    ax.set_ylabel("training examples/s")
    cores = record["machine"].get("usable_cores")
    ax.set_title(f"Adam Fig. 11: MNIST, {cores} cores")
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, path)
