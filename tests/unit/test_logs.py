"""The roles' log lines: the role's name, the level, one threshold for the whole job."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hogwild.logs import LEVEL_VARIABLE, configure_logging, role_logger


@pytest.fixture
def level(monkeypatch):
    """Restores the environment's level after the test (configure_logging writes it there)."""
    monkeypatch.setenv(LEVEL_VARIABLE, "info")
    yield
    configure_logging("info")


def test_a_line_names_the_role_and_a_level_above_info(level, capsys):
    role_logger("replica 2").info("started %d workers", 3)
    role_logger("cluster").warning("ps 0 exited; restarting (1 of 3)")
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "hogwild replica 2: started 3 workers",
        "hogwild cluster: WARNING: ps 0 exited; restarting (1 of 3)",
    ]


def test_the_level_filters_and_reaches_the_roles_a_process_starts(level, capsys):
    configure_logging("warning")
    role_logger("ps 1").info("not shown")
    role_logger("ps 1").error("shown")
    assert capsys.readouterr().err.splitlines() == ["hogwild ps 1: ERROR: shown"]
    assert os.environ[LEVEL_VARIABLE] == "warning"
    child = subprocess.run(
        [sys.executable, "-c",
         "from hogwild.logs import role_logger as r; r('data 0').info('hidden');"
         "r('data 0').debug('hidden'); r('data 0').warning('kept')"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert child.stderr.splitlines() == ["hogwild data 0: WARNING: kept"]
    configure_logging("debug")
    role_logger("ps 1").debug("now shown")
    assert capsys.readouterr().err.splitlines() == ["hogwild ps 1: DEBUG: now shown"]


def test_an_unknown_level_is_refused(level):
    with pytest.raises(ValueError, match="log level 'loud': expected one of debug, info"):
        configure_logging("loud")


def test_the_cli_flag_takes_only_known_levels(capsys):
    from hogwild.cli_parser import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["cluster", "--log-level", "loud"])
    assert "--log-level" in capsys.readouterr().err
