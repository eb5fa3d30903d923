"""The numba cache directory's key (:func:`hogwild.runtime.kernel_source_digest`): every kernel
source of the engine and of its plugins is in it, so an edited module that a kernel compiles
constants from never runs beside machine code compiled for its old text."""

from __future__ import annotations

import subprocess
import sys

from hogwild import entry_points, runtime


def test_an_edited_plugin_module_is_a_new_cache(tmp_path, monkeypatch):
    plugin = tmp_path / "a_plugin"
    (plugin / "ps").mkdir(parents=True)
    numbers = plugin / "ps" / "vector_ops.py"  # no numba in it: constants a kernel compiles in
    numbers.write_text("OP_DOT = 1\n")
    monkeypatch.setattr(entry_points, "plugin_packages", lambda: [plugin])
    before = runtime.kernel_source_digest()
    assert runtime.kernel_source_digest() == before  # the same sources, the same cache
    numbers.write_text("OP_DOT = 2\n")
    assert runtime.kernel_source_digest() != before
    monkeypatch.setattr(entry_points, "plugin_packages", lambda: [])
    assert runtime.kernel_source_digest() not in (before, "")  # the engine's sources alone


def test_the_installed_plugin_is_read_without_importing_it():
    code = (
        "import sys, hogwild.runtime as r; names = {s.name for s in r._plugin_kernel_sources()}; "
        "print(sorted(names & {'kernels.py', 'vector_ops.py'}), "
        "[m for m in ('hogwild_plugins', 'numba') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['kernels.py', 'vector_ops.py'] []"
