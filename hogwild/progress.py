"""Progress on stderr, through tqdm: training epochs, image-cache ingest and downloads.

One module for every progress display. On a terminal a bar is redrawn in place a few times a
second; elsewhere (a CI log, a file) bars are off and only whole lines (:meth:`Progress.line`)
are written, so logs stay readable. Every display can be switched off (``enabled=False``).
"""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm

REDRAW_S = 0.25


def progress_bar(
    total: int | None,
    desc: str,
    unit: str,
    *,
    initial: int = 0,
    enabled: bool = True,
    unit_scale: bool = False,
    stream: TextIO | None = None,
) -> tqdm:
    """A tqdm bar on ``stream`` (stderr): drawn on a terminal only, never when not ``enabled``."""
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        unit_scale=unit_scale,
        file=stream or sys.stderr,
        disable=None if enabled else True,  # None: tqdm draws on a terminal only
        mininterval=REDRAW_S,
        dynamic_ncols=True,
        leave=False,
    )


class Progress:
    """Training progress: a bar per epoch (examples/s, connections/s, loss) and whole lines."""

    def __init__(self, enabled: bool, connections: int, stream: TextIO | None = None):
        self.enabled = enabled
        self.connections = connections
        self.stream = stream or sys.stderr
        self._bar: tqdm | None = None
        self._epoch = -1

    def update(self, epoch: int, epochs: int, done: int, total: int, rate: float, loss: float):
        """Move the live bar of ``epoch`` to ``done`` of ``total`` examples."""
        if not self.enabled:
            return
        if self._bar is None or epoch != self._epoch:
            self.close()
            self._epoch = epoch
            self._bar = progress_bar(
                total, f"epoch {epoch + 1}/{epochs}", "ex", enabled=True, stream=self.stream
            )
        self._bar.n = min(done, total)
        self._bar.set_postfix_str(
            f"{rate:,.0f} ex/s {rate * self.connections / 1e9:.2f} Gconn/s loss {loss:.4f}",
            refresh=False,
        )
        self._bar.refresh()

    def line(self, text: str) -> None:
        """Write a whole line (the live bar, if any, is cleared first and redrawn after)."""
        if not self.enabled:
            return
        self.close()
        tqdm.write(text, file=self.stream)
        self.stream.flush()

    def close(self) -> None:
        """Remove the live bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
