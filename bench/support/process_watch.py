"""Every process a job ever had, seen from outside: its descendants sampled every 20 ms.

A benchmark that kills roles or a whole job must later check that every process the job ever
started is gone (:mod:`bench.support.leaks`); a process that lived between two looks at the tree
would be missed, hence the short period. :meth:`Watcher.workers` names the live training workers
(the processes ``hogwild train`` titles ``hogwild-w...``).
"""

from __future__ import annotations

import threading

import psutil


class Watcher:
    """Records every descendant of a process, every 20 ms, until stopped."""

    def __init__(self, root: psutil.Process):
        self.root, self.seen = root, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for child in self.root.children(recursive=True):
                    self.seen.setdefault(child.pid, child)
            except psutil.Error:
                pass
            self._stop.wait(0.02)

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
