"""A Ray role's actor keeps the last line matching its ``keep`` apart from its last lines
(plugins/ray/role_actor.py): a follower's stop line, which the launcher relays to the driver at
the job's stop, cannot be pushed out by the lines that come after it (a traceback, the CLI's
error), and a cleared actor forgets it with the process. Run without Ray: the actor's body is
plain Python, and its role a real ``hogwild`` command line."""

from __future__ import annotations

import time

from hogwild_plugins.ray.role_actor import RoleHost


def _exited(host: RoleHost) -> dict:
    deadline = time.monotonic() + 30.0
    while (status := host.status())["returncode"] is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return status


def test_the_kept_line_outlives_the_last_lines_and_goes_with_the_process(tmp_path):
    host = RoleHost("cluster 0")
    try:
        # its usage (a line to keep, then a dozen more) and its error on stderr
        host.start(["cluster", "--bogus"], str(tmp_path / "role.log"), None, {},
                   keep=r"usage: hogwild cluster ")  # fmt: skip
        status = _exited(host)
        assert status["returncode"] == 2, status
        assert status["kept"].startswith("usage: hogwild cluster [-h]"), status
        assert status["kept"] not in status["last"], status  # pushed out of them, kept apart
        assert status["last"][-1].startswith("hogwild cluster: error: unrecognized argument")
    finally:
        host.clear(5.0)
    assert host.status()["kept"] is None  # the next process's lines are its own
    host.start(["cluster", "--bogus"], str(tmp_path / "again.log"), None, {})  # nothing kept
    try:
        assert _exited(host)["kept"] is None
    finally:
        host.clear(5.0)
