"""``tests/bytecode.py``: the session's bytecode is written where Python reads it, then removed.

A package of the test's own is compiled into its ``__pycache__`` folders; a process that writes
no bytecode (``-B``) reads it instead of compiling the source; a file that was already there and
a module that does not compile are left alone; removal takes exactly what was written, and the
folders it left empty.
"""

from __future__ import annotations

import importlib.util
import py_compile
import subprocess
import sys
from pathlib import Path

from tests.bytecode import compile_sources, remove


def _cached(source: Path) -> Path:
    return Path(importlib.util.cache_from_source(str(source)))


def test_bytecode_is_read_by_a_process_that_writes_none_and_removed_after(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "sub/__init__.py"):
        (package / name).write_text("")
    (package / "sub" / "mod.py").write_text("VALUE = 42\n")
    (package / "broken.py").write_text("def (:\n")
    there = _cached(package / "__init__.py")
    py_compile.compile(str(package / "__init__.py"), cfile=str(there), doraise=True)

    written = compile_sources(tmp_path, ("pkg",))
    assert sorted(written) == sorted(
        [_cached(package / "sub" / "__init__.py"), _cached(package / "sub" / "mod.py")]
    )
    probe = "import pkg.sub.mod as m; print(m.VALUE)"
    done = subprocess.run(
        [sys.executable, "-B", "-v", "-c", probe],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "42", done.stderr[-2000:]
    assert f"code object from '{_cached(package / 'sub' / 'mod.py')}'" in done.stderr

    remove(written)
    assert not (package / "sub" / "__pycache__").exists()
    assert there.is_file()  # not this session's: kept, and its folder with it
