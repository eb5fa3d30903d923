"""Parameter stores by name: the entry-point group ``hogwild.parameter_stores``.

``train.parameters`` names a store; this module turns the name into its class without the engine
ever importing a plugin by name (docs/design.md, "The parameter-store seam"). The engine's own
stores (``shared``, ``replicate``) and the parameter-server plugin's (``ps``) are all registered
in ``pyproject.toml``; another distribution can add its own under the same group.
"""

from __future__ import annotations

from hogwild.entry_points import load, names

GROUP = "hogwild.parameter_stores"


def store_names() -> tuple[str, ...]:
    """The registered store names, sorted."""
    return names(GROUP)


def cadences(config) -> tuple[int, int]:
    """``train.n_push`` and ``train.n_fetch`` as the job runs them: 0 (the default) is the
    store's own cadence (:meth:`~hogwild.store.protocol.ParameterStore.own_cadence`)."""
    return store_class(config.train.parameters).cadences(config)


def store_class(name: str):
    """The class registered as ``name``.

    Raises:
        PluginMissing: No store has that name, or its module cannot be imported (the message
            says what to install; a :class:`~hogwild.errors.ConfigError`).
    """
    return load(GROUP, name, chosen_by="train.parameters")
