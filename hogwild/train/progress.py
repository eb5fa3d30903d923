"""The live progress line on stderr: epoch, examples/s, connections/s and the running loss.

On a terminal the line is redrawn in place (``\\r``) a few times a second; elsewhere (a CI log, a
file) only the end-of-epoch lines are written, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 24
REDRAW_S = 0.25


class ProgressBar:
    """Draws training progress; silent when ``enabled`` is false."""

    def __init__(self, enabled: bool, connections: int, stream: TextIO | None = None):
        self.enabled = enabled
        self.connections = connections
        self.stream = stream or sys.stderr
        self.live = enabled and self.stream.isatty()
        self._last_draw = 0.0

    def update(self, epoch: int, epochs: int, done: int, total: int, rate: float, loss: float):
        """Redraw the live line (rate-limited); a no-op off a terminal."""
        now = time.monotonic()
        if not self.live or now - self._last_draw < REDRAW_S:
            return
        self._last_draw = now
        filled = int(BAR_WIDTH * min(done / max(total, 1), 1.0))
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        self.stream.write(
            f"\repoch {epoch + 1}/{epochs} [{bar}] {done:,}/{total:,}  {rate:,.0f} ex/s  "
            f"{rate * self.connections / 1e9:.2f} Gconn/s  loss {loss:.4f}  "
        )
        self.stream.flush()

    def line(self, text: str) -> None:
        """Write a whole line (clearing the live line first)."""
        if not self.enabled:
            return
        if self.live:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()
