"""Running a benchmark script from a test: what every benchmark promises of its output.

A benchmark prints one JSON line on stdout (its progress goes to stderr) and writes the same
line to its ``--out`` file (../shared/CONVENTIONS.md, Benchmarks). The tests of each benchmark's
``--quick`` run then check that line's fields.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def run_bench(command: list[str], out: Path, *, timeout: float, cwd: Path | None = None) -> dict:
    """Run ``command`` to its end (``timeout``: a bound for a hang, not a speed check); it must
    exit 0, print exactly one JSON line and write the same line to ``out``. Its record."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout  # one JSON line, progress on stderr
    assert out.read_text().strip() == lines[0]
    return json.loads(lines[0])
