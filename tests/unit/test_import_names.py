"""Every ``from hogwild... import name`` in the tree names something its module has.

The import graph test (``test_import_graph.py``) draws arrows between modules; it does not ask
whether the imported *name* is still there. An import inside a function runs only when the
function does, so a name taken out of a module (a re-export dropped in a refactor) breaks only
the code path that calls it, at run time, in whatever process runs it: once a partition process's
examples were loaded through a name ``hogwild.model.loops`` no longer re-exported, and nine
partition tests failed in a full run, each with a receiver or a partition dying. This reads every
``from ... import`` of ``hogwild``'s and the plugins' modules, at the top or inside a function, in
``hogwild/``, ``plugins/``, ``tests/`` and ``bench/``, and imports it.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from tests.unit.import_statements import import_statements

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("hogwild", "plugins", "tests", "bench")
OURS = ("hogwild", "hogwild_plugins")


def from_imports(path: Path) -> list[tuple[int, str, str]]:
    """``(line, module, name)`` of each absolute ``from`` import of our modules in ``path``."""
    found = []
    for node, _ in import_statements(path):  # under TYPE_CHECKING too: the name must be there
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in OURS:
                found.extend((node.lineno, node.module, a.name) for a in node.names)
    return found


def unresolved(paths) -> list[str]:
    """Each import of ``paths`` whose module does not import or does not hold its name."""
    missing = []
    for path in paths:
        for line, module_name, name in from_imports(path):
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}"
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                missing.append(f"{where}: {module_name}: {exc}")
                continue
            if name == "*" or hasattr(module, name):
                continue
            try:
                importlib.import_module(f"{module_name}.{name}")
            except ImportError:
                missing.append(f"{where}: from {module_name} import {name}: not there")
    return missing


def test_every_name_imported_from_our_modules_is_there() -> None:
    paths = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(paths) > 400  # the whole tree was read
    assert unresolved(paths) == []


def test_a_name_a_module_no_longer_has_is_found_inside_a_function(tmp_path) -> None:
    source = tmp_path / "lazy.py"
    source.write_text(
        "def load():\n"
        "    from hogwild.model.loops import no_such_kernel\n"
        "    from hogwild.model.passes import load_example\n"
    )
    assert unresolved([source]) == [
        f"{source}:2: from hogwild.model.loops import no_such_kernel: not there"
    ]
