"""The import statements of a Python file, read once per test process.

The import tests (``test_import_names.py``, ``test_import_graph.py``, ``test_core_layers.py``)
each read every module's imports, and parsing the files is most of what they cost: each file
is parsed here once, and only its import statements are kept (not the whole syntax tree, which
would hold a worker's memory for the rest of the run), in the order of the source, each marked
where it sits under ``if TYPE_CHECKING:`` (such an import never runs).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

__all__ = ["import_statements"]

Statement = ast.Import | ast.ImportFrom


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == (
        "TYPE_CHECKING"
    )


@cache
def import_statements(path: Path) -> tuple[tuple[Statement, bool], ...]:
    """Every ``import`` and ``from ... import`` in ``path``, at any depth of its code, in the
    order of a depth-first walk of its syntax tree: ``(statement, hidden)``, ``hidden`` where a
    walk that leaves out ``if TYPE_CHECKING:`` skips it (its test and its body, and the
    statements of its ``else`` themselves, whose own children it walks). The statements are
    shared: read them, never change them."""
    found: list[tuple[Statement, bool]] = []

    def take(node: ast.AST, hidden: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, hidden))

    def walk_children(node: ast.AST, hidden: bool) -> None:
        for child in ast.iter_child_nodes(node):
            take(child, hidden)
            if isinstance(child, ast.If) and _type_checking(child):
                for part in (child.test, *child.body):
                    take(part, True)
                    walk_children(part, True)
                for other in child.orelse:  # the statement hidden, what it holds not
                    take(other, True)
                    walk_children(other, hidden)
                continue
            walk_children(child, hidden)

    walk_children(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), False)
    return tuple(found)
