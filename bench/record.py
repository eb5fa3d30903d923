"""A benchmark's result: one JSON line on stdout, and the same line in the ``--out`` file."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["emit_record"]


def emit_record(record: dict, out: str | Path | None) -> None:
    """Print ``record`` as one JSON line and, when ``out`` is given, write that line there
    (making its directory)."""
    line = json.dumps(record)
    print(line, flush=True)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line + "\n", encoding="utf-8")
