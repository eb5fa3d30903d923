"""When ``hogwild cluster`` tests each epoch's model: between epochs or beside the next one.

:func:`hogwild.cluster.driver.evaluates_between` is pure: ``auto`` follows the launcher (the
local launcher's driver shares the replicas' cores; Ray's usually has a machine of its own),
and an explicit choice wins over it. The jobs in ``tests/cluster`` check that each launcher's
run records the mode it used and the seconds each evaluation took.
"""

from __future__ import annotations

import pytest

from hogwild.cluster.driver import evaluates_between
from hogwild.config import ClusterConfig, load_config


@pytest.mark.parametrize(
    ("evaluate", "launcher", "between"),
    [
        ("auto", "local", True),
        ("auto", "ray", False),
        ("between", "ray", True),
        ("beside", "local", False),
        ("between", "local", True),
        ("beside", "ray", False),
    ],
)
def test_the_mode_follows_the_launcher_unless_chosen(evaluate, launcher, between):
    assert evaluates_between(ClusterConfig(evaluate=evaluate, launcher=launcher)) is between


def test_the_bundled_config_lets_the_launcher_decide():
    assert load_config().cluster.evaluate == "auto"
