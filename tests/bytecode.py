"""Bytecode for the processes the tests start, when this environment writes none itself.

With ``PYTHONDONTWRITEBYTECODE`` set (as on this project's CI machines), no Python process
writes ``.pyc`` files, so each of the hundreds of processes the suite starts (roles, workers,
servers, benchmarks) compiled hogwild's modules from source again: a tenth of a second of CPU
each, on the cores the other processes of its test need. The variable only stops *writing*;
reading is unchanged. So the session compiles the project's own sources once, at its start
(``py_compile`` writes whatever the variable says), and removes exactly the files it wrote when
it ends, leaving the checkout as the variable asked. Third-party packages ship their bytecode.
"""

from __future__ import annotations

import importlib.util
import py_compile
import sys
from pathlib import Path

SOURCES = ("hogwild", "plugins", "bench", "tests")


def needed() -> bool:
    """Whether this environment writes no bytecode (the processes the tests start neither)."""
    return bool(sys.flags.dont_write_bytecode)


def compile_sources(root: Path, folders: tuple[str, ...] = SOURCES) -> list[Path]:
    """Compile the modules under ``root``'s ``folders`` whose bytecode is missing; the files
    written."""
    written = []
    for folder in folders:
        for source in sorted((root / folder).rglob("*.py")):
            target = Path(importlib.util.cache_from_source(str(source)))
            if target.exists():
                continue
            try:
                py_compile.compile(str(source), cfile=str(target), doraise=True)
            except (py_compile.PyCompileError, OSError):
                continue  # that module compiles from source, as before
            written.append(target)
    return written


def remove(written: list[Path]) -> None:
    """Remove the files :func:`compile_sources` wrote, and the folders left empty."""
    for target in written:
        target.unlink(missing_ok=True)
    for folder in {target.parent for target in written}:
        try:
            folder.rmdir()  # only when empty: a folder that held other files stays
        except OSError:
            pass
