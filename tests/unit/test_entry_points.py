"""The one entry-point lookup (:mod:`hogwild.entry_points`) and the cluster's services through it.

A name nobody registered, and one whose module cannot be imported, must each fail with a message
naming the group, the entry point and what to install; what the parameter-server plugin registers
must provide what :mod:`hogwild.cluster.services` declares.
"""

from __future__ import annotations

import inspect
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

import hogwild.entry_points as ep
from hogwild.cluster import services
from hogwild.cluster.serving import ServedRole
from hogwild.errors import ConfigError


def test_an_unknown_name_lists_the_known_ones_and_says_what_to_install() -> None:
    with pytest.raises(ep.PluginMissing) as caught:
        ep.load("hogwild.launchers", "nope", chosen_by="cluster.launcher")
    said = str(caught.value)
    assert "cluster.launcher = 'nope' is not a launcher" in said
    assert "local" in said and "'hogwild.launchers'" in said and "[cluster]" in said
    assert isinstance(caught.value, ConfigError)  # the CLI reports it as a bad config


def test_a_plugin_that_cannot_be_imported_names_its_entry_point(monkeypatch) -> None:
    broken = EntryPoint("etcd", "hogwild_plugins_not_installed.controller:X", services.CONTROLLERS)
    monkeypatch.setattr(ep, "registered", lambda group: {"etcd": broken})
    with pytest.raises(ep.PluginMissing) as caught:
        services.open_controller("", "job", print)
    said = str(caught.value)
    assert "etcd = 'hogwild_plugins_not_installed.controller:X'" in said
    assert "'hogwild.controllers'" in said and "pip install" in said


def test_a_service_nobody_registers_says_what_needs_it(monkeypatch) -> None:
    monkeypatch.setattr(ep, "registered", lambda group: {})
    with pytest.raises(ep.PluginMissing, match=r"cluster.copies > 1 needs .* registered as 'etcd'"):
        services.open_controller("", "job", print)


def test_the_plugin_provides_every_method_the_cluster_protocols_declare() -> None:
    def methods(protocol) -> set[str]:
        return {n for n, v in vars(protocol).items() if inspect.isfunction(v) and n[0] != "_"}

    controller = ep.load(services.CONTROLLERS, services.CONTROLLER)
    assert methods(services.Controller) <= set(dir(controller))
    groups = ep.load(services.SERVER_GROUPS, services.SERVER_GROUP_SYNC)
    assert methods(services.ServerGroupSync) <= set(dir(groups))
    for framework in ("sandblaster", "allreduce", "hybrid"):
        role = services.worker_group(framework)
        assert callable(role.check_job)
        assert methods(ServedRole) <= set(dir(role))  # the core's serve loop serves it


def test_plugin_packages_are_found_without_importing_them() -> None:
    before = set(sys.modules)
    found = ep.plugin_packages()
    assert found and all(isinstance(p, Path) and p.is_dir() for p in found)
    assert not {m for m in set(sys.modules) - before if m.startswith("hogwild_plugins.")}
