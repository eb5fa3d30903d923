"""Draw Adam's Fig. 10 from a ``bench/figures/adam_fig10_partitions.py`` record: connections/s
against the model's size (connections), for 1 and 2 partitions and the control (two independent
unpartitioned processes). matplotlib is imported only when a plot is drawn
(:mod:`bench.support.plot`).
"""

from __future__ import annotations

from bench.support.plot import pyplot, save


def plot_fig10(record: dict, path: str) -> None:
    """Connections/s against the model's size, per number of partitions, beside the control's
    (two independent processes), on log axes."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6, 4))
    rows = record["results"]
    for partitions, style in ((1, "o-"), (2, "s-")):
        mine = sorted(
            (r for r in rows if r["partitions"] == partitions), key=lambda r: r["connections"]
        )
        axis.plot(
            [r["connections"] for r in mine],
            [r["connections_per_s"] for r in mine],
            style,
            label=f"{partitions} partition{'s' if partitions > 1 else ''}",
        )
    control = sorted((r for r in rows if r["partitions"] == 1), key=lambda r: r["connections"])
    axis.plot(
        [r["connections"] for r in control],
        [r["control_examples_per_s"] * r["connections"] for r in control],
        "k--",
        label="control: 2 independent processes",
    )
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("model size (connections)")
    axis.set_ylabel("connections per second")
    axis.set_title("Adam Fig. 10: model partitions on this machine")
    axis.legend()
    save(figure, path)
