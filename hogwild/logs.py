"""Log lines of hogwild's processes: one logger per role, levels, one format, one switch.

Each process of a job logs through :func:`role_logger` under its role's name (``cluster`` for the
driver, ``replica 0``, ``ps 1``...): ``hogwild replica 0: WARNING: no word from the driver ...``
on stderr. ``--log-level`` (``debug``, ``info``, ``warning``, ``error``) sets the threshold in
the process that parses it and, through :data:`LEVEL_VARIABLE` in the environment, in every role
it starts, so one flag sets a whole job's.

The line a role prints once it serves (``hogwild ROLE: serving ... on HOST:PORT``) is not a log
line: it is how the role's launcher learns its address, and is printed as it is whatever the
level.
"""

from __future__ import annotations

import logging
import os
import sys

ROOT = "hogwild.role"
LEVEL_VARIABLE = "HOGWILD_LOG_LEVEL"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}  # fmt: skip


class _RoleFormatter(logging.Formatter):
    """``hogwild ROLE: LEVEL: message`` (the level left out for info, the usual case)."""

    def format(self, record: logging.LogRecord) -> str:
        role = record.name.removeprefix(ROOT + ".") if record.name != ROOT else "hogwild"
        level = "" if record.levelno == logging.INFO else f"{record.levelname}: "
        text = f"hogwild {role}: {level}{record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _CurrentStderr(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each line (a test's capture, a redirected stream)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # not setStream: it flushes the old one, which may be closed
        super().emit(record)


def role_logger(role: str) -> logging.Logger:
    """The logger of ``role`` (``cluster``, ``replica 0``, ``ps 1``, ``data 0``)."""
    configure_logging()  # a role process started by a launcher configures on first use
    return logging.getLogger(f"{ROOT}.{role}")


def configure_logging(level: str | None = None) -> None:
    """Send the roles' log lines to stderr at ``level`` (default: the environment's, or info).

    Given a level, it also goes into the environment, for the roles this process starts.

    Raises:
        ValueError: ``level`` is not one of :data:`LEVELS`.
    """
    if level is not None:
        if level not in LEVELS:
            raise ValueError(f"log level {level!r}: expected one of {', '.join(LEVELS)}")
        os.environ[LEVEL_VARIABLE] = level
    chosen = os.environ.get(LEVEL_VARIABLE, "info")
    root = logging.getLogger(ROOT)
    root.setLevel(LEVELS.get(chosen, logging.INFO))
    if not any(isinstance(h, _CurrentStderr) for h in root.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(_RoleFormatter())
        root.addHandler(handler)
        root.propagate = False  # one line per message, whatever the application's root logger
