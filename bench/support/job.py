"""One command-line job a benchmark runs: its own session, stdout and stderr to files, stopped
on every exit (SIGTERM first, as a user's Ctrl-C would, then SIGKILL to the whole session).

The figure scripts that drive ``hogwild train`` or ``hogwild cluster`` (and the peers' scripts)
run each through :class:`Job`; :class:`bench.support.cluster_run.ClusterRun` builds on it.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from bench.support.paths import REPO

STOP_S = 30.0  # a job told to stop gets this long before it is killed


class Job:
    """One CLI process in its own session, stdout and stderr to files; stopped on every exit."""

    def __init__(self, command: list[str], folder: Path, name: str) -> None:
        self.out_path, self.err_path = folder / f"{name}.out", folder / f"{name}.err"
        env = dict(os.environ)  # NUMBA_CACHE_DIR: main's (one fresh cache for the whole run)
        self.launched = time.time()
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                command, stdout=out, stderr=err, cwd=REPO, env=env, start_new_session=True
            )

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"{self.describe()} took longer than {timeout:.0f} s") from None

    def stop(self) -> None:
        """SIGTERM (the CLI stops its roles), then SIGKILL to the session if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def summary(self) -> dict:
        """The last stdout line (the CLI's JSON summary); RuntimeError if it failed."""
        lines = self.out_path.read_text(errors="replace").strip().splitlines()
        if self.proc.returncode != 0 or not lines:
            raise RuntimeError(f"{self.describe()} failed: {self.err_tail()}")
        return json.loads(lines[-1])

    def err_tail(self) -> str:
        return self.err_path.read_text(errors="replace")[-2000:]

    def describe(self) -> str:
        return shlex.join(self.proc.args[1:])[:160]
