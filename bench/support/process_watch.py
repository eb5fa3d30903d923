"""Every process a job ever had, seen from outside: its descendants looked for every 20 ms.

A benchmark that kills roles or a whole job must later check that every process the job ever
started is gone (:mod:`bench.support.leaks`); a process that lived between two looks at the tree
would be missed, hence the short period. :meth:`Watcher.workers` names the live training workers
(the processes ``hogwild train`` titles ``hogwild-w...``).

A look costs what is new since the last one, not the whole machine: the process table is listed
(``/proc``) and only the processes not seen before have their parent read. A process's parent
changes only when it is re-parented on its parent's death, to a process outside the tree, so a
process found outside the tree stays outside, and one found inside is recorded for good. (A
walk of the whole table at every look, ``psutil``'s ``children(recursive=True)``, reads every
process's ``stat``: CPU in proportion to every process on the machine, at every look, for the
length of the run.) Where there is no ``/proc`` the walk is what is done.
"""

from __future__ import annotations

import os
import threading

import psutil

PERIOD_S = 0.02
PROC = "/proc"


def _parent(pid: int) -> int | None:
    """The parent of ``pid`` (from ``/proc/PID/stat``), or None where it is gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2 :].split(maxsplit=2)[1])
    except (OSError, ValueError, IndexError):
        return None


class Watcher:
    """Records every descendant of a process, every 20 ms, until stopped."""

    def __init__(self, root: psutil.Process):
        self.root, self.seen = root, {}
        self._inside = {root.pid}  # the root and its descendants, alive when last listed
        self._outside: set[int] = set()  # processes listed and found not to be descendants
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _look_listed(self) -> None:
        """Classify the processes listed now that were not listed at the last look."""
        listed = {int(name) for name in os.listdir(PROC) if name.isdigit()}
        self._outside &= listed  # a pid gone is forgotten: it may be used again
        self._inside &= listed | {self.root.pid}
        parents = {}
        for pid in listed - self._outside - self._inside:
            parent = _parent(pid)
            if parent is not None:
                parents[pid] = parent
        found = True
        while found:  # a new process's new parent may be listed after it
            found = False
            for pid, parent in list(parents.items()):
                if parent in self._inside:
                    del parents[pid]
                    self._inside.add(pid)
                    try:
                        self.seen.setdefault(pid, psutil.Process(pid))
                    except psutil.Error:
                        pass  # gone already; kept in the tree for its children listed now
                    found = True
        self._outside.update(parents)

    def _look_walked(self) -> None:
        for child in self.root.children(recursive=True):
            self.seen.setdefault(child.pid, child)

    def _run(self) -> None:
        look = self._look_listed if os.path.isdir(PROC) else self._look_walked
        while not self._stop.is_set():
            try:
                look()
            except psutil.Error:
                pass
            self._stop.wait(PERIOD_S)

    def workers(self) -> list[psutil.Process]:
        out = []
        for proc in list(self.seen.values()):
            try:
                if proc.name().startswith("hogwild-w") and proc.is_running():
                    out.append(proc)
            except psutil.Error:
                continue
        return out

    def stop(self) -> list[psutil.Process]:
        self._stop.set()
        self._thread.join(5)
        return list(self.seen.values())
