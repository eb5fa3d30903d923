"""Remember what was compiled into numba's cache, so a warm start need not load it to be sure.

A job's parent process compiles the kernels its workers call (:mod:`hogwild.model.compile`) so
that each worker loads them from numba's on-disk cache instead of compiling them again. When the
cache already holds them, that step still costs the parent a second or two of CPU on every start
(numba sets up its whole target and loads every kernel's machine code), on the cores the starting
workers need. :func:`compile_once` skips it when a record says the same kernels were compiled
into this cache, on this CPU, by this numba, from these very source files, and every cache file
there was then is still there.

The record is only ever a reason to skip the parent's warm-up: a worker that finds its kernel
missing after all compiles it itself, as numba always does. Records live beside the machine code,
in ``NUMBA_CACHE_DIR``, and go with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

RECORDS = "hogwild-compiled"
CACHE_SUFFIXES = (".nbi", ".nbc")  # numba's index and machine-code files


def compile_once(what: dict, compile: Callable[[], None]) -> bool:
    """Run ``compile`` unless a record says this cache already holds what it compiled.

    Args:
        what: JSON-able description of everything that decides which kernels ``compile`` calls
            and with which argument types (the model, the sizes, the options).
        compile: Compiles them (calls each kernel once with the workers' argument types).

    Returns:
        Whether ``compile`` ran.
    """
    cache = os.environ.get("NUMBA_CACHE_DIR")
    if not cache:  # numba's default: beside the sources, where we do not keep records
        compile()
        return True
    cache_dir = Path(cache)
    path = cache_dir / RECORDS / f"{_digest(what)}.json"
    if _still_holds(path, cache_dir):
        return False
    compile()
    _write_record(path, cache_dir)
    return True


def _digest(what: dict) -> str:
    """The record's name: ``what``, this CPU as numba targets it, the interpreter and numba."""
    import numba
    from llvmlite import binding

    host = {
        "what": what,
        "triple": binding.get_process_triple(),
        "cpu": os.environ.get("NUMBA_CPU_NAME") or binding.get_host_cpu_name(),
        "features": os.environ.get("NUMBA_CPU_FEATURES")
        or binding.get_host_cpu_features().flatten(),
        "python": sys.version,
        "numba": numba.__version__,
    }
    return hashlib.sha256(json.dumps(host, sort_keys=True).encode()).hexdigest()[:24]


def _sources() -> dict[str, list[int]]:
    """Modification time and size of every module of hogwild and its plugins: numba's own stamp
    of a kernel's file is these two, so an edited or re-installed file forgets its kernels."""
    stamps = {}
    for package in _packages():
        for source in sorted(package.rglob("*.py")):
            stat = source.stat()
            stamps[str(source)] = [stat.st_mtime_ns, stat.st_size]
    return stamps


def _packages() -> list[Path]:
    import hogwild

    packages = [Path(hogwild.__file__).resolve().parent]
    try:
        import hogwild_plugins

        packages += [Path(p).resolve() for p in hogwild_plugins.__path__]
    except ImportError:
        pass
    return packages


def _cache_files(cache_dir: Path) -> list[str]:
    return sorted(
        str(p.relative_to(cache_dir)) for p in cache_dir.rglob("*") if p.suffix in CACHE_SUFFIXES
    )


def _still_holds(path: Path, cache_dir: Path) -> bool:
    try:
        record = json.loads(path.read_text())
        return record["sources"] == _sources() and all(
            (cache_dir / name).is_file() for name in record["cache_files"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False  # none yet, or unreadable: compile, and write a good one


def _write_record(path: Path, cache_dir: Path) -> None:
    record = {"sources": _sources(), "cache_files": _cache_files(cache_dir)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(record))
        os.replace(partial, path)
    except OSError:
        pass  # a read-only cache: the next start compiles (loads) again, as before records
