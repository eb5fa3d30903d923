"""A plain-text progress line on stderr, redrawn in place with ``\\r``: the ingest's progress bar.

It shows items done of the total, the percentage, the rate of this run and the number of items
skipped; a run that resumes says where it resumes. Redraws are throttled to ten a second.
"""

from __future__ import annotations

import sys
import time


class ProgressLine:
    """A ``\\r``-redrawn progress line on stderr: done/total, percent, rate, skipped.

    Args:
        label: What is counted ("ingest train").
        total: Items in all.
        done: Items already done (a resumed run).
        enabled: Draw anything at all.
    """

    def __init__(self, label: str, total: int, done: int = 0, enabled: bool = True) -> None:
        self.label, self.total, self.start_done = label, total, done
        self.enabled, self.started, self.drawn = enabled, time.monotonic(), 0.0
        if enabled and done:
            print(f"{label}: resuming at item {done:,} of {total:,}", file=sys.stderr)

    def update(self, done: int, skipped: int = 0) -> None:
        """Redraw (at most every 0.1 s, and at the end) with ``done`` items finished."""
        now = time.monotonic()
        if not self.enabled or (now - self.drawn < 0.1 and done < self.total):
            return
        self.drawn = now
        rate = (done - self.start_done) / max(now - self.started, 1e-9)
        width = 30
        filled = width * done // max(self.total, 1)
        bar = "#" * filled + "." * (width - filled)
        line = (
            f"\r{self.label} [{bar}] {done:,}/{self.total:,} {100 * done / max(self.total, 1):.0f}%"
        )
        line += f" {rate:,.0f} img/s" + (f", {skipped} skipped" if skipped else "")
        print(line, end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        """End the line."""
        if self.enabled:
            print(file=sys.stderr, flush=True)
