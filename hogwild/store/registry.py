"""Parameter stores by name: the entry-point group ``hogwild.parameter_stores``.

``train.parameters`` names a store; this module turns the name into its class without the engine
ever importing a plugin by name (docs/design.md, "The parameter-store seam"). The engine's own
stores (``shared``, ``replicate``) and the parameter-server plugin's (``ps``) are all registered
in ``pyproject.toml``; another distribution can add its own under the same group.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points

from hogwild.errors import ConfigError

GROUP = "hogwild.parameter_stores"


@cache
def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def store_names() -> tuple[str, ...]:
    """The registered store names, sorted."""
    return tuple(sorted(_entry_points()))


def cadences(config) -> tuple[int, int]:
    """``train.n_push`` and ``train.n_fetch`` as the job runs them: 0 (the default) is the
    store's own cadence (:meth:`~hogwild.store.protocol.ParameterStore.own_cadence`)."""
    return store_class(config.train.parameters).cadences(config)


def store_class(name: str):
    """The class registered as ``name``.

    Raises:
        ConfigError: No store has that name, or its module cannot be imported (the message says
            which package to install).
    """
    found = _entry_points().get(name)
    if found is None:
        raise ConfigError(
            f"train.parameters = {name!r} is not a parameter store; known: "
            f"{', '.join(store_names()) or 'none (is hogwild installed?)'}"
        )
    try:
        return found.load()
    except ImportError as exc:
        raise ConfigError(
            f"the parameter store {name!r} ({found.value}) cannot be imported: {exc}; "
            "install hogwild with its extras (pip install -e '.[cluster]')"
        ) from None
