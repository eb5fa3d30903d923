"""The core's packages import downwards only, and no two of hogwild's packages import each other.

Every ``import`` and ``from ... import`` in ``hogwild/`` is read with :mod:`ast` (those inside
functions and under ``if TYPE_CHECKING:`` too: a circle through a late import is still a circle),
resolved to the hogwild module it names, and checked against the layers below, lowest first:
the job's config and the mechanics (``config``, ``shm``, ``numa``, ``net``), then ``data``,
``optim``, ``model``, ``store``, ``training``, ``cluster``. A package may import its own layer's
modules and those below, and the top-level modules of ``hogwild/`` that hold no policy
(``errors``, ``entry_points``, ``jit``...); never a layer above. Model partitioning adds to
``model/`` and ``shm/``; these tests keep it from reaching up into the trainer or the cluster.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import hogwild
from tests.unit.test_import_graph import imported, modules

ROOT = Path(hogwild.__file__).resolve().parent

LAYERS = {
    "config": 0,
    "shm": 0,
    "numa": 0,
    "net": 0,
    "data": 1,
    "optim": 2,
    "model": 3,
    "store": 4,
    "training": 5,
    "cluster": 6,
    "partition": 6,
}

# The packages whose imports are checked here: every layer.
CHECKED = tuple(LAYERS)

# Top-level modules a package may import: plain mechanics and the entry-point lookup. (The CLI and
# the public API facade sit above the packages.)
BELOW_THE_PACKAGES = {
    "hogwild.blas",
    "hogwild.entry_points",
    "hogwild.errors",
    "hogwild.jit",
    "hogwild.locks",
    "hogwild.logs",
    "hogwild.outputs",
    "hogwild.process_title",
    "hogwild.progress",
    "hogwild.runtime",
    "hogwild.signals",
    "hogwild.compile_records",
    "hogwild.numba_target",
}


MODULES = modules({"hogwild": ROOT})


def _imports(module: str) -> set[tuple[str, int]]:
    """(hogwild module imported, line of its first import) for ``module``, those under ``if
    TYPE_CHECKING:`` included (:func:`tests.unit.test_import_graph.imported`)."""
    return set(imported(module, MODULES[module], MODULES, type_checking=True).items())


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) >= 3 or (len(parts) == 2 and parts[1] in LAYERS) else None


def test_the_import_reader_sees_imports_inside_functions():
    assert "hogwild.data.plan" in {target for target, _ in _imports("hogwild.cli_commands")}
    assert "hogwild.optim.interval" in {target for target, _ in _imports("hogwild.training.worker")}


def test_the_core_packages_import_only_their_layer_and_below():
    upward = []
    for module in sorted(MODULES):
        package = _package(module)
        if package not in CHECKED:
            continue
        for target, line in sorted(_imports(module)):
            other = _package(target)
            if other in LAYERS:
                if LAYERS[other] > LAYERS[package]:
                    upward.append(f"{module}:{line} -> {target}")
            elif target not in BELOW_THE_PACKAGES:
                upward.append(
                    f"{module}:{line} -> {target} (a top-level module above the packages)"
                )
    assert upward == []


def test_no_two_packages_import_each_other():
    arrows = defaultdict(set)
    for module in MODULES:
        package = _package(module)
        if package is None:
            continue
        for target, _ in _imports(module):
            other = _package(target)
            if other is not None and other != package:
                arrows[package].add(other)
    circles = sorted(
        f"{a} <-> {b}" for a in arrows for b in arrows[a] if a < b and a in arrows.get(b, ())
    )
    assert circles == []
