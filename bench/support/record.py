"""A benchmark's result: one JSON line on stdout, and the same line in the ``--out`` file, with
the command that made it, its wall time and the source it was measured on."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from bench.support.paths import REPO

__all__ = [
    "JOB_ERRORS",
    "command_line",
    "emit_record",
    "fresh_numba_cache",
    "measured",
    "measured_and_emitted",
    "source",
    "stamp",
]

JOB_ERRORS = (RuntimeError, OSError, json.JSONDecodeError, subprocess.TimeoutExpired)
"""What a benchmark's job may end in: it failed or hung (``RuntimeError``, or a child past its
bound: ``subprocess.TimeoutExpired``), a file or process could not be had (``OSError``), or it
did not finish its JSON line."""


def emit_record(record: dict, out: str | Path | None) -> None:
    """Print ``record`` as one JSON line and, when ``out`` is given, write that line there
    (making its directory)."""
    line = json.dumps(record)
    print(line, flush=True)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line + "\n", encoding="utf-8")


def command_line(script: str | Path, argv: Sequence[str]) -> str:
    """The command that runs ``script`` (a file of the repository, e.g. a figure's ``__file__``)
    with ``argv``, as typed at the repository root: ``python bench/figures/NAME.py ARGS``."""
    path = Path(script).resolve()
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return shlex.join(["python", str(shown), *argv])


def stamp(
    record: dict, script: str | Path, argv: Sequence[str], started: float | None = None
) -> dict:
    """``record`` with the command that made it (:func:`command_line` of ``script``), its wall
    time since ``started`` (``time.perf_counter()``; none without it) and :func:`source`."""
    if started is not None:
        record["wall_s"] = round(time.perf_counter() - started, 1)
    record["command"] = command_line(script, argv)
    record["source"] = source()  # the commit, and files changed from it
    return record


def measured(
    script: str | Path,
    argv: Sequence[str],
    measure: Callable[[], dict],
    within: contextlib.AbstractContextManager | None = None,
) -> dict | None:
    """``measure()``'s record, run inside ``within`` (a numba cache of its own, SIGTERM taken
    as Ctrl-C...), :func:`stamp`-ed as ``script`` run with ``argv``; ``None`` once it said on
    stderr why it failed (one of :data:`JOB_ERRORS`)."""
    started = time.perf_counter()
    try:
        with within if within is not None else contextlib.nullcontext():
            record = measure()
    except JOB_ERRORS as exc:
        print(f"{command_line(script, [])}: error: {exc}", file=sys.stderr)
        return None
    return stamp(record, script, argv, started)


def measured_and_emitted(
    script: str | Path,
    argv: Sequence[str],
    measure: Callable[[], dict],
    out: str | Path | None,
    within: contextlib.AbstractContextManager | None = None,
) -> int:
    """A figure script's whole ending: :func:`measured`, the machine and the versions added
    where ``measure`` did not say them, then :func:`emit_record`. Returns the exit status: 0,
    or 2 once it said on stderr why the measurement failed."""
    from bench.support.machine import describe_machine, versions  # psutil: only where measured

    record = measured(script, argv, measure, within)
    if record is None:
        return 2
    record.setdefault("machine", describe_machine())
    record.setdefault("versions", versions())
    emit_record(record, out)
    return 0


@contextlib.contextmanager
def fresh_numba_cache() -> Iterator[None]:
    """The run's jobs compile their kernels into one cache made for it (unless
    ``NUMBA_CACHE_DIR`` is set already), removed at the end.

    No run reuses another's: numba does not invalidate a cached caller when a kernel it calls in
    another file changed, so a cache kept across source versions would time older kernels.
    """
    with tempfile.TemporaryDirectory(prefix="hogwild-bench-numba-") as cache:
        set_here = "NUMBA_CACHE_DIR" not in os.environ
        os.environ.setdefault("NUMBA_CACHE_DIR", cache)
        try:
            yield
        finally:
            if set_here:
                os.environ.pop("NUMBA_CACHE_DIR", None)


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
