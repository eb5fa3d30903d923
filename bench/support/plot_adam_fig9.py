"""Draw Adam's Fig. 9 from a ``bench/figures/adam_fig9_ps.py`` record: updates/s against server
cores.

One panel per update API. Lines: in process (the update path alone), over IPC and over TCP;
dashed: the limits measured in the same run (triad / 12 bytes for deltas, sgemm / 2 flops for
activation vectors, raw pyzmq 1 MiB request/reply for deltas over loopback); markers: the Ray and
PyTorch RPC peers (deltas over loopback, all cores). matplotlib is imported only here.
"""

from __future__ import annotations

from pathlib import Path

from bench.support.plot import pyplot, save


def plot_fig9(record: dict, path: str | Path) -> Path:
    """Write the figure for ``record`` to ``path`` (PNG); the path."""
    plt = pyplot()

    limits, results = record["limits"], record["results"]
    figure, axes = plt.subplots(1, 2, figsize=(11, 5.8))
    styles = {"inproc": ("C0", "o"), "ipc": ("C1", "s"), "tcp": ("C2", "^")}
    for ax, api in zip(axes, ("deltas", "activations"), strict=True):
        cores = sorted({r["server_cores"] for r in results})
        for transport, (color, marker) in styles.items():
            rows = sorted(
                (
                    r
                    for r in results
                    if r["api"] == api
                    and r["transport"] == transport
                    and "recv" not in r
                    and "pushes" not in r
                ),
                key=lambda r: r["server_cores"],
            )
            ax.plot(
                [r["server_cores"] for r in rows],
                [r["updates_per_s"] / 1e9 for r in rows],
                color=color,
                marker=marker,
                label=f"hogwild ps, {transport}",
            )
        if api == "deltas":
            ax.axhline(
                limits["triad_gb_s"] / 12, color="k", ls="--", lw=1, label="STREAM triad / 12 B"
            )
            ax.axhline(
                limits["pyzmq_1mb_gb_s"] / 4,
                color="C2",
                ls=":",
                lw=1,
                label="raw pyzmq 1 MiB req/rep + numpy add (tcp)",
            )
            for (name, peer), marker in zip(
                record.get("peers", {}).items(), ("x", "+", "1"), strict=False
            ):
                if peer.get("updates_per_s"):
                    way = {"tcp": "tcp", "default": "its own transport"}.get(
                        peer.get("transport", "default"), "its own transport"
                    )
                    if name == "ray":
                        way = "object store"
                    ax.plot(
                        [max(cores)],
                        [peer["updates_per_s"] / 1e9],
                        marker,
                        ms=10,
                        color="C3",
                        label=f"{name} ({way}, {peer.get('clients')} clients)",
                    )
            ax.set_title("API (a): weight deltas, 1 MiB shards")
        else:
            ax.axhline(
                limits["sgemm_gflops"] / 2, color="k", ls="--", lw=1, label="sgemm peak / 2 flops"
            )
            ax.set_title(f"API (b): k={record['k']} activation + error vectors")
        ax.set_xlabel("server cores")
        ax.set_ylabel("parameter updates / s (billions)")
        ax.set_yscale("log")
        ax.set_xticks(cores)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.14), ncol=2)
    machine = record.get("machine", {})
    figure.suptitle(
        f"Adam Fig. 9 on {machine.get('cpu_model', '?')} ({machine.get('usable_cores', '?')} cores)"
    )
    return save(figure, path)
