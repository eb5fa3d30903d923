"""Every entry-point lookup of the engine: how the core reaches what plugins register.

The core never imports a plugin by name; ``pyproject.toml`` declares what each plugin offers
under a group, and this module is the one place that reads those groups:

* ``hogwild.parameter_stores``: the stores ``train.parameters`` names (:mod:`hogwild.store`);
* ``hogwild.launchers``: what starts a cluster job's roles (``cluster.launcher``);
* ``hogwild.commands``: subcommands plugins add to the ``hogwild`` command line;
* ``hogwild.controllers``, ``hogwild.server_groups``, ``hogwild.worker_groups``: what a cluster
  job needs from the parameter-server plugin (the protocols in :mod:`hogwild.cluster.services`).

A name that is registered nowhere, or whose module cannot be imported, is a
:class:`PluginMissing` naming the group, the name and what to install; no lookup fails silently.
Lookups are cached: the installed distributions do not change while a process runs.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Protocol

from hogwild.errors import ConfigError

__all__ = [
    "GROUPS",
    "PARAMETER_STORES",
    "PluginMissing",
    "load",
    "names",
    "plugin_packages",
    "registered",
]

INSTALL = "pip install -e '.[cluster]'"
PARAMETER_STORES = "hogwild.parameter_stores"  # read by the store registry and the config checks
GROUPS = {
    PARAMETER_STORES: "a parameter store",
    "hogwild.launchers": "a launcher",
    "hogwild.commands": "a command",
    "hogwild.controllers": "a controller of replicated parameter servers",
    "hogwild.server_groups": "the synchronisation of server groups",
    "hogwild.worker_groups": "a synchronous worker group",
}
"""Each group the engine reads, and what an entry point of it provides (for messages)."""


class PluginMissing(ConfigError):
    """No entry point of that name in its group, or its module cannot be imported."""


class _Selectable(Protocol):
    """What ``entry_points()`` returns: ``EntryPoints`` from Python 3.12, ``SelectableGroups``
    on 3.11; both select a group."""

    def select(self, *, group: str) -> Iterable[EntryPoint]: ...


@cache
def _installed() -> _Selectable:
    """Every installed distribution's entry points, read once: each ``entry_points(group=...)``
    reads every distribution's metadata again (about 10 ms of CPU a call here, paid by every
    process that runs ``hogwild``, which looks up several groups)."""
    return entry_points()


@cache
def registered(group: str) -> dict[str, EntryPoint]:
    """The entry points of ``group`` by name (every installed distribution's)."""
    return {ep.name: ep for ep in _installed().select(group=group)}


def names(group: str) -> tuple[str, ...]:
    """The names registered in ``group``, sorted."""
    return tuple(sorted(registered(group)))


def load(group: str, name: str, *, chosen_by: str = "", needed_for: str = ""):
    """The object registered as ``name`` in ``group``.

    Args:
        group: The entry-point group (one of :data:`GROUPS`).
        name: The entry point's name.
        chosen_by: The setting that named it (``"train.parameters"``), for the message.
        needed_for: Else, what needs it (``"cluster.copies > 1"``), for the message.

    Raises:
        PluginMissing: Nothing is registered as ``name`` (the message lists what is), or its
            module cannot be imported (the message names the entry point and what to install).
    """
    what = GROUPS.get(group, "an entry point")
    found = registered(group).get(name)
    if found is None:
        known = ", ".join(names(group)) or "none"
        if chosen_by:
            said = f"{chosen_by} = {name!r} is not {what}"
        else:
            said = f"{needed_for or 'the job'} needs {what} registered as {name!r}: none is"
        raise PluginMissing(
            f"{said}; known: {known} (entry-point group {group!r}; the plugin that provides it "
            f"is installed with hogwild's extras: {INSTALL})"
        )
    try:
        return found.load()
    except ImportError as exc:
        raise PluginMissing(
            f"{what} {name!r} (entry point {found.name} = {found.value!r} in group {group!r}) "
            f"cannot be imported: {exc}; install hogwild with its extras: {INSTALL}"
        ) from None


def plugin_packages() -> list[Path]:
    """The folders of the top-level packages, other than ``hogwild``, that register entry
    points in the engine's groups, found without importing them."""
    packages: list[Path] = []
    modules = [ep.value.partition(":")[0] for g in GROUPS for ep in registered(g).values()]
    tops = {module.split(".")[0] for module in modules}
    for top in sorted(tops - {"hogwild"}):
        spec = importlib.util.find_spec(top)
        for location in (spec.submodule_search_locations or []) if spec else []:
            path = Path(location).resolve()
            if path not in packages:
                packages.append(path)
    return packages
