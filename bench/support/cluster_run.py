"""One ``hogwild cluster`` job seen from outside, as a benchmark drives it.

:class:`ClusterRun` starts ``hogwild cluster ARGS --checkpoint-dir DIR --metrics DIR/metrics.jsonl``
(through :class:`bench.support.job.Job`: its own session, stdout and stderr to files, stopped on
every exit), records every process it ever has (:class:`bench.support.process_watch.Watcher`), and
reads what the driver writes into the run directory while it runs:

- the metrics file: the ``start`` record (the resolved config, the servers' addresses), the
  epoch records (which carry no time: :attr:`ClusterRun.epoch_seen` keeps when each was first
  read);
- ``cluster.json`` (rewritten on every restart): each role's pid, so that :meth:`pid_of` names
  the live process of a role now.

:meth:`ClusterRun.finish` waits for the job and counts what it left behind
(:class:`bench.support.leaks.LeakCheck`). The job runs under a name of its own (``--ps.job``,
unique on the machine), which every segment of it carries: what it leaves is counted by that
name, and a benchmark or test running beside it keeps its own. So that the count cannot pass
for want of names, the segments named for the job are also looked for while it runs
(``named_while_running`` in what :meth:`ClusterRun.finish` returns).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from pathlib import Path

import psutil

from bench.support.job import Job
from bench.support.leaks import LeakCheck, shm_entries
from bench.support.process_watch import Watcher
from hogwild.shm.naming import parse_segment_name, sanitize_job

START_S = 300.0  # the roles' start-up, at most
NAMED_LOOK_S = 0.1  # how often the job's named segments are looked for while it runs


def unique_job(name: str) -> str:
    """A job name no other job on the machine has: the run's name, this pid, random digits."""
    return sanitize_job(f"bench_{name}_{os.getpid()}_{secrets.token_hex(3)}")


class ClusterRun:
    """``hogwild ARGS`` (a ``cluster`` command) in ``folder/name``, started now.

    Args:
        args: ``hogwild``'s arguments, from ``cluster`` on.
        folder: Where the run directory and the job's stdout and stderr go.
        name: The run's name (its directory).
        prefix: A command that runs the driver's command line where it should run and
            execs it (so its pid is the driver's): ``ip netns exec NS`` runs it in a
            namespace host (:meth:`tests.hosts.harness.Hosts.argv`).
    """

    def __init__(
        self, args: list[str], folder: Path, name: str, prefix: list[str] | None = None
    ) -> None:
        self.dir = folder / name
        self.metrics = self.dir / "metrics.jsonl"
        command = [*(prefix or []), sys.executable, "-m", "hogwild.cli", *args]
        command += ["--checkpoint-dir", str(self.dir), "--metrics", str(self.metrics)]
        self.job_name = unique_job(name)
        command.append(f"--ps.job={self.job_name}")
        self.check = LeakCheck()
        self.named: set[str] = set()  # segments named for the job, seen while it ran
        self._named_stop = threading.Event()
        self.job = Job(command, folder, name)
        self.started = time.time()
        self.root = psutil.Process(self.job.proc.pid)
        self.watcher = Watcher(self.root)
        self._named_thread = threading.Thread(target=self._look_named, daemon=True)
        self._named_thread.start()
        self.start: dict = {}
        self.where: dict = {}
        self.epoch_seen: dict[int, float] = {}  # epoch -> when its record was first read

    def _look_named(self) -> None:
        while not self._named_stop.wait(NAMED_LOOK_S):
            for entry in shm_entries():
                owner = parse_segment_name(entry)
                if owner is not None and owner.job == self.job_name:
                    self.named.add(entry)

    def running(self) -> bool:
        return self.job.proc.poll() is None

    def wait_started(self) -> None:
        """Until the driver wrote its start record and ``cluster.json``.

        Raises:
            RuntimeError: The job exited first, or took longer than ``START_S``.
        """
        deadline = time.monotonic() + START_S
        while not (self.start and self.where):
            if not self.running() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.job.describe()} did not start: {self.job.err_tail()}")
            starts = [r for r in self.records() if r.get("event") == "start"]
            self.start = starts[0] if starts else {}
            self.where = self.roles_file()
            time.sleep(0.1)

    def records(self) -> list[dict]:
        """The metrics file's records so far."""
        try:
            lines = self.metrics.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written
                continue
        for record in out:
            if record.get("event") == "epoch":
                self.epoch_seen.setdefault(record["epoch"], time.time())
        return out

    def roles_file(self) -> dict:
        try:
            return json.loads((self.dir / "cluster.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def pid_of(self, name: str) -> int | None:
        """The live process of role ``name`` (``"ps 0"``) now; None: dead, not yet restarted."""
        roles = {r["name"]: r.get("pid") for r in self.roles_file().get("roles", [])}
        pid = roles.get(name)
        try:
            proc = psutil.Process(pid) if pid else None
            if proc is None or proc.status() == psutil.STATUS_ZOMBIE:
                return None
        except psutil.Error:
            return None
        return pid

    def last_epoch_done(self, epochs: int) -> bool:
        return any(
            r.get("epoch") == epochs - 1 for r in self.records() if r.get("event") == "epoch"
        )

    def ports(self) -> set[int]:
        """The ports its servers, its etcd and its driver listened on."""
        config = self.start.get("config", {})
        addresses = [*self.start.get("ps_servers", []), *self.start.get("data_servers", [])]
        addresses += [config.get("cluster", {}).get("etcd") or "", self.where.get("address") or ""]
        return {int(a.rsplit(":", 1)[1]) for a in addresses if ":" in a}

    def finish(self, bound_s: float, stop: bool = False) -> tuple[dict | None, str | None, dict]:
        """Wait for the job (or stop it now): its summary (None: it failed), why it failed, and
        what it left behind."""
        summary = error = None
        try:
            if stop:
                self.job.stop()
            self.job.wait(bound_s)
            summary = self.job.summary()
        except RuntimeError as exc:
            error = str(exc)
        finally:
            self.job.stop()
            seen = [self.root, *self.watcher.stop()]
            self._named_stop.set()
            self._named_thread.join()
        leaked = self.check.count(seen, self.ports(), jobs=(self.job_name,))
        return summary, error, leaked | {"named_while_running": len(self.named)}
