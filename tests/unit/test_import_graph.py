"""The import graph: no circle of modules or packages, and no plugin in the core.

Every module of ``hogwild/`` and ``plugins/`` (installed as ``hogwild_plugins``) is parsed with
:mod:`ast`; each import, at the top or inside a function, is an arrow to the deepest module it
names (``from a.b import c`` points at ``a.b.c`` when that is a module, else at ``a.b``). Imports
under ``if TYPE_CHECKING:`` are left out: they never run. A package is a folder with its
modules; a module directly in ``hogwild/`` or ``plugins/`` counts as a package of its own. (Which
layer may import which: ``test_core_layers.py``.)

Run this file to print the graph's circles::

    python tests/unit/test_import_graph.py
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

from tests.unit.import_statements import import_statements

ROOT = Path(__file__).resolve().parents[2]
TREES = {"hogwild": ROOT / "hogwild", "hogwild_plugins": ROOT / "plugins"}


def modules(trees: dict[str, Path]) -> dict[str, Path]:
    """Every module's dotted name -> its file."""
    found = {}
    for top, tree in trees.items():
        for path in sorted(tree.rglob("*.py")):
            parts = list(path.relative_to(tree).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([top, *parts])] = path
    return found


def imported(
    name: str, path: Path, known: dict[str, Path], *, type_checking: bool = False
) -> dict[str, int]:
    """The modules of ``known`` that module ``name`` imports (at any depth of its code), each
    with the line of its first import; those under ``if TYPE_CHECKING:`` only if
    ``type_checking`` (they never run, but a layer check counts them)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    names: dict[str, int] = {}
    for statement, hidden in import_statements(path):  # in the order of the source
        if hidden and not type_checking:
            continue
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                names.setdefault(alias.name, statement.lineno)
        else:
            base = statement.module or ""
            if statement.level:
                up = package[: len(package) - statement.level + 1]
                base = ".".join([*up, *([statement.module] if statement.module else [])])
            for alias in statement.names:
                full = f"{base}.{alias.name}"
                names.setdefault(full if full in known else base, statement.lineno)
    out: dict[str, int] = {}
    for target, line in names.items():
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out[target] = min(line, out.get(target, line))
    return out


def package_of(name: str, known: dict[str, Path], trees: dict[str, Path]) -> str:
    """A module's package (a module directly under a tree is its own)."""
    if known[name].name == "__init__.py":
        return name
    parent = name.rpartition(".")[0]
    return name if parent in trees else parent


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def graphs(trees: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The module graph and the package graph of ``trees`` (top-level name -> folder)."""
    known = modules(trees)
    module_graph = {name: set(imported(name, path, known)) for name, path in known.items()}
    package_graph: dict[str, set[str]] = {}
    for name, targets in module_graph.items():
        source = package_of(name, known, trees)
        package_graph.setdefault(source, set())
        for target in targets:
            if package_of(target, known, trees) != source:
                package_graph[source].add(package_of(target, known, trees))
    return module_graph, package_graph


@cache
def house() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The project's graphs, read once per test run (treat them as read-only)."""
    return graphs(TREES)


def test_the_core_never_imports_a_plugin_nor_names_one() -> None:
    module_graph, _ = house()
    arrows = [
        (source, target)
        for source, targets in module_graph.items()
        for target in targets
        if source.split(".")[0] == "hogwild" and target.split(".")[0] == "hogwild_plugins"
    ]
    assert not arrows, f"the core imports the plugins: {sorted(arrows)}"
    naming = [str(p.relative_to(ROOT)) for p in TREES["hogwild"].rglob("*.py")
              if "hogwild_plugins" in p.read_text(encoding="utf-8")]  # fmt: skip
    assert not naming, f"core modules that name hogwild_plugins (docstrings too): {naming}"


def test_no_module_imports_itself_through_others() -> None:
    module_graph, _ = house()
    assert circles(module_graph) == []


def test_no_package_imports_itself_through_others() -> None:
    _, package_graph = house()
    assert circles(package_graph) == []


def test_the_graph_sees_function_level_imports_and_finds_a_circle(tmp_path) -> None:
    tree = tmp_path / "pkg"
    (tree / "a").mkdir(parents=True)
    (tree / "b").mkdir()
    for folder in (tree, tree / "a", tree / "b"):
        (folder / "__init__.py").write_text("")
    (tree / "a" / "one.py").write_text("from pkg.b.two import f\n")
    (tree / "b" / "two.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a.one\n"
        "def f():\n    from ..a import one\n"
    )
    module_graph, package_graph = graphs({"pkg": tree})
    assert module_graph["pkg.b.two"] == {"pkg.a.one"}  # the function's; not TYPE_CHECKING's
    assert circles(module_graph) == [["pkg.a.one", "pkg.b.two"]]
    assert circles(package_graph) == [["pkg.a", "pkg.b"]]


if __name__ == "__main__":
    module_graph, package_graph = graphs(TREES)
    print("module circles:", *circles(module_graph) or ["none"], sep="\n  ")
    print("package circles:", *circles(package_graph) or ["none"], sep="\n  ")
