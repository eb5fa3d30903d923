"""The live status of a cluster job: one table of its roles, redrawn in place on a terminal.

Rows: every replica (its state and epoch, examples trained in the epoch so far, examples/s, the
training loss, seconds its compute loops waited for data and for the parameter servers), every
parameter server (updates/s, requests/s, the staleness of the updates it applied, the updates at
risk since its last flush) and every data server; replicas and data servers say how often they
were restarted. :func:`format_table` turns the
rows into aligned text; :class:`LiveStatus` redraws it in place on a terminal (off a terminal it
stays silent: the per-epoch lines are the log). ``hogwild cluster status`` prints the same table
from a running job (the driver answers a ``status`` control request with the rows).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from hogwild.cluster.identities import PRIVATE
from hogwild.errors import HogwildError
from hogwild.net.auth import IDENTITY_ENV, has_roster, use_identity
from hogwild.net.control import ControlClient, ControlRefused

COLUMNS = (
    "role", "state", "epoch", "examples", "ex/s", "loss", "data wait", "ps wait", "restarts",
    "detail",
)  # fmt: skip


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4f}" if abs(value) < 10 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(rows: list[dict]) -> str:
    """Aligned text of ``rows`` (dicts keyed by :data:`COLUMNS`; missing cells are ``-``)."""
    cells = [[_cell(row.get(column)) for column in COLUMNS] for row in rows]
    widths = [max(len(c[i]) for c in [list(COLUMNS), *cells]) for i in range(len(COLUMNS))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(COLUMNS, widths, strict=True)).rstrip()]
    for row in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def replica_row(status: dict, previous: dict | None, seconds: float) -> dict:
    """A replica's row from its ``status`` answer (and the previous one, for its rate)."""
    examples = status.get("examples")
    rate = None
    if previous and examples is not None and previous.get("epoch") == status.get("epoch"):
        rate = max(0, examples - previous.get("examples", 0)) / max(seconds, 1e-9)
    loss = status.get("loss")
    return {
        "role": f"replica {status.get('replica')}",
        "state": status.get("state"),
        "epoch": status.get("epoch"),
        "examples": examples,
        "ex/s": rate,
        "loss": loss / examples if loss is not None and examples else None,
        "data wait": status.get("data_wait_s"),
        "ps wait": status.get("store_wait_s"),
    }


def server_row(status: dict) -> dict:
    """A parameter server's row from its status counters."""
    histogram = status.get("staleness_histogram") or {}
    stale = ", ".join(f"{k}:{v}" for k, v in list(histogram.items())[:4])
    window = status.get("loss_window") or {}
    risk = window.get("updates") if isinstance(window, dict) else None
    return {
        "role": f"ps {status.get('server')}",
        "state": "serving",
        "ex/s": None,
        "detail": f"{status.get('updates_per_s', 0):,.0f} updates/s, "
        f"{status.get('requests_per_s', 0):,.0f} req/s, staleness {stale or '-'}"
        + (f", {risk:,} updates since flush" if isinstance(risk, int) else ""),
    }


class LiveStatus:
    """Redraws the table in place on a terminal; silent elsewhere (or when not ``enabled``)."""

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = enabled and self.stream.isatty()
        self._lines = 0

    def draw(self, rows: list[dict]) -> None:
        if not self.live:
            return
        text = format_table(rows)
        if self._lines:
            self.stream.write(f"\033[{self._lines}F\033[J")  # up to the table's top, clear below
        self.stream.write(text + "\n")
        self.stream.flush()
        self._lines = text.count("\n") + 1

    def clear(self) -> None:
        """Forget the table (the next line is written below it)."""
        self._lines = 0


def status_act(job: str, rows: Callable[[], list[dict]]) -> Callable[[str, dict], dict]:
    """What the driver's control channel answers: ``status`` (the job's name, ``rows()`` and
    their table), and nothing else (refused by name). Quick and with no side effect: it runs on
    the network thread and anyone holding the job's keys may ask."""

    def act(op: str, body: dict) -> dict:
        if op == "status":
            current = rows()
            return {"job": job, "rows": current, "table": format_table(current)}
        raise ControlRefused(f"unknown op {op!r} (status)")

    return act


def print_status(
    target: str, as_json: bool = False, job: str | None = None, keys: str | None = None
) -> int:
    """``hogwild cluster status``: the table of a running job, by run directory or by address
    and the job's name (a driver tells its table only to those naming its job); ``keys``: the
    job's CURVE key directory (by run directory: the one the job recorded, unless given)."""
    given = keys
    path = Path(target)
    if path.is_dir():
        found = path / "cluster.json"
        if not found.is_file():
            raise HogwildError(f"{path}: no running cluster job here (no cluster.json)")
        try:
            where = json.loads(found.read_text())
            address, job = str(where["address"]), str(where["job"])
            keys = given or where.get("keys")
            if keys is not None and not isinstance(keys, str):
                raise TypeError(f"keys: {keys!r}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise HogwildError(f"{found}: not a cluster job's address file: {exc}") from None
        user = path / PRIVATE / "user.key_secret"  # a key pair per role: the job's user's own
        if keys and has_roster(keys) and not os.environ.get(IDENTITY_ENV) and user.is_file():
            use_identity(user)
    else:
        if not job:
            raise HogwildError(
                f"{target}: give the job's name too (--job NAME), or the job's run directory"
            )
        address = target
    with ControlClient(address, job, timeout_s=2.0, retries=1, keys=keys) as client:
        status = client.call("status")
    if as_json:
        print(json.dumps(status))
    else:
        print(f"job {status.get('job')} at {address}")
        print(status.get("table", ""))
    return 0
