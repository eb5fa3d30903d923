"""A benchmark's result: one JSON line on stdout, and the same line in the ``--out`` file, and
the source it was measured on."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

__all__ = ["emit_record", "source"]

REPO = Path(__file__).resolve().parents[1]


def emit_record(record: dict, out: str | Path | None) -> None:
    """Print ``record`` as one JSON line and, when ``out`` is given, write that line there
    (making its directory)."""
    line = json.dumps(record)
    print(line, flush=True)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line + "\n", encoding="utf-8")


def source() -> dict:
    """The commit the run used, and the tracked files that differ from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        return done.stdout.rstrip("\n") if done.returncode == 0 else ""  # " M path": keep

    try:
        commit, changed = git("rev-parse", "HEAD"), git("status", "--porcelain", "-uno")
    except OSError:
        return {"commit": None, "modified": []}
    return {"commit": commit or None, "modified": [line[3:] for line in changed.splitlines()]}
