"""What a run left behind: ``/dev/shm/hogwild*`` segments, processes and listening ports.

The benchmarks' version of the test suite's leak check (tests/conftest.py), for runs that are
not this process's children alone: :class:`LeakCheck` lists the segments before a run; after it,
:meth:`LeakCheck.count` takes every process the run ever had (a
:class:`bench.support.process_watch.Watcher` records them) and the ports its roles listened on,
waits (bounded) for those processes to be gone, and counts

- ``segments``: new ``/dev/shm/hogwild*`` entries whose owner (recorded in the name,
  :func:`hogwild.shm.naming.parse_segment_name`) was one of the run's processes, alive or not:
  the owner of a segment left behind by a SIGKILLed process is dead, and the segment is still a
  leak. Other users' segments (other owners) are not counted;
- ``processes``: the run's processes still alive (zombies do not count);
- ``ports``: listening TCP sockets on the run's ports (anyone's), or of its live processes.

It only counts: the caller decides what to remove.
"""

from __future__ import annotations

import os
import time

import psutil

from hogwild.shm import sweeper
from hogwild.shm.naming import parse_segment_name

EXIT_WAIT_S = 20.0


def shm_entries() -> set[str]:
    try:
        return {e for e in os.listdir(sweeper.SHM_DIR) if e.startswith("hogwild")}
    except FileNotFoundError:
        return set()


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in processes:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            continue
    return out


def listening(ports: set[int], pids: set[int]) -> list[str]:
    """``HOST:PORT (pid)`` of every listening TCP socket on ``ports`` or of ``pids``."""
    found = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN:
            continue
        if conn.laddr.port in ports or conn.pid in pids:
            found.append(f"{conn.laddr.ip}:{conn.laddr.port} (pid {conn.pid})")
    return sorted(found)


class LeakCheck:
    """Segments before a run; :meth:`count` after it (see the module docstring)."""

    def __init__(self) -> None:
        self.before = shm_entries()

    def count(self, processes: list[psutil.Process], ports: set[int]) -> dict:
        deadline = time.monotonic() + EXIT_WAIT_S
        while alive(processes) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = alive(processes)
        pids = {p.pid for p in processes}
        segments = []
        for entry in sorted(shm_entries() - self.before):
            owner = parse_segment_name(entry)
            if owner is not None and owner.pid in pids:
                segments.append(entry)
        sockets = listening(ports, {p.pid for p in left})
        return {
            "segments": len(segments),
            "processes": len(left),
            "ports": len(sockets),
            "detail": {
                "segments": segments,
                "processes": [_describe(p) for p in left],
                "ports": sockets,
            },
        }


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline())[:100]}"
    except psutil.Error:
        return str(proc.pid)
