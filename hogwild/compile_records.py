"""Remember what was compiled into numba's cache, so a warm start need not load it to be sure.

A job's parent process compiles the kernels its workers call (:mod:`hogwild.model.compile`) so
that each worker loads them from numba's on-disk cache instead of compiling them again. When the
cache already holds them, that step still costs the parent a second or two of CPU on every start
(numba sets up its whole target and loads every kernel's machine code), on the cores the starting
workers need. :func:`compile_once` skips it when a record says the same kernels were compiled
into this cache, on this CPU, by this numba, from these very source files, and every cache file
there was then is still there as it was. An index may have changed since: numba rewrites a
module's index whenever it compiles one more kernel of that module (another test, another job's
types), and such an index still counts if it still lists every machine-code file it listed then.
numba drops entries only by starting an index afresh, numbered from ``.1`` again: for a source
file changed since (the record's stamps of the sources tell), an index written by another numba
(the version at the index's head is checked), an index deleted, or ``recompile()`` (a rebuilt
index may reuse the names; the machine-code files' sizes are what is left to tell).

The record is only ever a reason to skip the parent's warm-up: a worker that finds its kernel
missing after all compiles it itself, as numba always does. Records live beside the machine code,
in ``NUMBA_CACHE_DIR``, and go with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickletools
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
    sources = _sources()  # before compiling: a file edited meanwhile is not taken as compiled
    if sources is not None and _still_holds(path, cache_dir, sources):
        return False
    compile()
    if sources is not None:
        _write_record(path, cache_dir, sources)
    return True


def _numba_version() -> str:
    """numba's version, without importing numba where its package metadata says it: a start
    that finds its kernels compiled need not load it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("numba")
    except PackageNotFoundError:  # a numba without package metadata (vendored): ask it
        import numba

        return numba.__version__


def _digest(what: dict) -> str:
    """The record's name: ``what``, this CPU as numba targets it, the interpreter and numba."""
    from llvmlite import binding

    numba_version = _numba_version()
    host = {
        "what": what,
        "triple": binding.get_process_triple(),
        "cpu": os.environ.get("NUMBA_CPU_NAME") or binding.get_host_cpu_name(),
        "features": os.environ.get("NUMBA_CPU_FEATURES")
        or binding.get_host_cpu_features().flatten(),
        "python": sys.version,
        "numba": numba_version,
    }
    return hashlib.sha256(json.dumps(host, sort_keys=True).encode()).hexdigest()[:24]


def _sources() -> dict[str, list[int]] | None:
    """Modification time and size of every module of hogwild and its plugins: stricter than
    numba's own stamp (a hash of the file's content), so an edited, touched or re-installed file
    forgets its kernels.
    None when the folders cannot be read through (one removed during the walk): no record is
    read or written then."""
    stamps = {}
    try:
        for package in _packages():
            for source in sorted(package.rglob("*.py")):
                try:
                    stat = source.stat()
                except OSError:  # gone meanwhile, or an editor's dangling lock link (.#name.py)
                    continue
                stamps[str(source)] = [stat.st_mtime_ns, stat.st_size]
    except OSError:
        return None
    return stamps


def _packages() -> list[Path]:
    """The engine's folder (this module's) and its plugins' (their kernels count too)."""
    from hogwild.entry_points import plugin_packages

    return [Path(__file__).resolve().parent, *plugin_packages()]


def _cache_files(cache_dir: Path) -> dict[str, list[int]]:
    """Every index (modification time and size) and machine-code file (size: two processes
    compiling the same kernel at once each write its file under one name, equivalent code that
    differs only in the symbols' per-process counters, usually of the same size)."""
    files = {}
    for path in cache_dir.rglob("*"):
        if path.suffix not in CACHE_SUFFIXES:
            continue
        try:
            stat = path.stat()
        except OSError:
            continue
        stamp = [stat.st_mtime_ns, stat.st_size] if path.suffix == ".nbi" else [stat.st_size]
        files[str(path.relative_to(cache_dir))] = stamp
    return files


def _still_holds(path: Path, cache_dir: Path, sources: dict[str, list[int]]) -> bool:
    try:
        record = json.loads(path.read_text())
        kept = record["cache_files"]
        if record["sources"] != sources or not any(name.endswith(".nbi") for name in kept):
            return False
        now = _cache_files(cache_dir)
        changed = [name for name, stamp in kept.items() if now.get(name) != stamp]
        return all(_still_lists(cache_dir, name, kept) for name in changed)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False  # none yet, or unreadable: compile, and write a good one


def _still_lists(cache_dir: Path, index: str, kept: dict[str, list[int]]) -> bool:
    """Whether ``index``, changed since the record, is an index that still lists every
    machine-code file it listed then (a machine-code file changed since is never good)."""
    if not index.endswith(".nbi"):
        return False
    stem = index.removesuffix(".nbi")
    listed = [
        Path(name).name
        for name in kept
        if name.endswith(".nbc")
        and name.startswith(f"{stem}.")
        and name.removeprefix(f"{stem}.").removesuffix(".nbc").isdigit()
    ]
    if not listed:  # an index the record knew no entry of: nothing to check it by
        return False
    return set(listed) <= _names_in_index(cache_dir / index)


def _names_in_index(path: Path) -> set[str]:
    """The strings in a numba index (its version, then its source's stamp and its entries, each
    a key and a machine-code file's name), read as pickle opcodes: nothing is unpickled, so
    reading one loads no numba. An index another numba wrote lists nothing this one serves
    (numba starts such an index afresh, from the same file names): the empty set."""
    with path.open("rb") as index:
        written_by = [arg for _, arg, _ in pickletools.genops(index) if isinstance(arg, str)]
        if written_by != [_numba_version()]:
            return set()
        return {arg for _, arg, _ in pickletools.genops(index) if isinstance(arg, str)}


def _write_record(path: Path, cache_dir: Path, sources: dict[str, list[int]]) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        record = {"sources": sources, "cache_files": _cache_files(cache_dir)}
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(record))
        os.replace(partial, path)
    except OSError:  # a read-only or full cache: the next start compiles (loads) again
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
