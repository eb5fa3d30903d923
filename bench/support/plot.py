"""What every benchmark plot shares: matplotlib's pyplot on the Agg backend, and saving a PNG.

matplotlib is imported only when a plot is drawn (with the Agg backend, no display needed), so the
benchmarks run without it; each figure's drawing is in its own ``plot_*`` module beside this one.
"""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib's pyplot with the Agg backend (no display needed).

    Raises:
        RuntimeError: matplotlib is not installed (``pip install 'hogwild[bench]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install 'hogwild[bench]'") from exc
    return plt


def save(figure, path: str | Path) -> Path:
    """Lay ``figure`` out, write it to ``path`` (PNG, its directory made), close it; the path."""
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    pyplot().close(figure)
    return path
