"""The trainer's worker processes as one gang: start, command, listen, stop.

Invariants: every blocking wait is bounded (a worker that cannot start in ``READY_TIMEOUT_S`` or
that died is an error, never a hang); a worker that exits while the job runs stops the job with a
:class:`~hogwild.errors.WorkerDiedError` naming the worker, its pid and its signal; and
:meth:`WorkerGang.stop` leaves no process and no queue behind, whatever state the gang is in
(asked to stop, then terminated, then killed).
"""

from __future__ import annotations

import queue
import signal
import time
from collections.abc import Callable

from hogwild.errors import DataError, HogwildError, WorkerDiedError

READY_TIMEOUT_S = 300.0  # a worker that cannot load its kernels in this long is broken
POLL_S = 0.1
STOP_TIMEOUT_S = 5.0


class WorkerGang:
    """Worker processes, one command queue each, and one queue of their answers."""

    def __init__(self, context, kept_checkpoint: str = ""):
        self.context = context
        self.kept_checkpoint = kept_checkpoint  # named in the error when a worker dies
        self.processes: list = []
        self.commands: list = []
        self.results = None

    def start(self, n: int, target, args_of: Callable[[int], tuple]) -> None:
        """Start ``n`` workers running ``target(*args_of(i), commands, results)``; wait for all.

        Each worker answers ``("ready", ...)`` once it can take commands.
        """
        self.results = self.context.Queue()
        for worker in range(n):
            commands = self.context.Queue()
            process = self.context.Process(
                target=target,
                name=f"hogwild-worker-{worker}",
                args=(*args_of(worker), commands, self.results),
                daemon=True,
            )
            process.start()
            self.commands.append(commands)
            self.processes.append(process)
        ready = 0
        deadline = time.monotonic() + READY_TIMEOUT_S
        while ready < n:
            if self.next_message("starting", deadline)[0] == "ready":
                ready += 1

    def send(self, worker: int, command: tuple) -> None:
        self.commands[worker].put(command)

    def next_message(self, doing: str, deadline: float | None = None, idle=None) -> tuple:
        """The next answer; raises if a worker died or failed, or the deadline passed.

        ``idle`` is called between polls (the progress line).
        """
        while True:
            try:
                message = self.results.get(timeout=POLL_S)
            except queue.Empty:
                self._check(doing)
                if deadline is not None and time.monotonic() > deadline:
                    raise HogwildError(
                        f"workers did not become ready within {READY_TIMEOUT_S:.0f} s"
                    ) from None
                if idle is not None:
                    idle()
                continue
            if message[0] == "error":
                raise WorkerDiedError(f"worker {message[1]} failed while {doing}:\n{message[2]}")
            if message[0] == "data_error":  # a bad record, say: the user's input, one line
                raise DataError(f"worker {message[1]}, while {doing}: {message[2]}")
            return message

    def _check(self, doing: str) -> None:
        for worker, process in enumerate(self.processes):
            code = process.exitcode
            if code is None:
                continue
            how = (
                f"was killed by {signal.Signals(-code).name}"
                if code < 0 and -code in signal.valid_signals()
                else f"exited with code {code}"
            )
            kept = (
                f" and the last checkpoint in {self.kept_checkpoint} is kept"
                if self.kept_checkpoint
                else ""
            )
            raise WorkerDiedError(
                f"worker {worker} (pid {process.pid}) {how} while {doing}; the job is stopped"
                + kept
            )

    def stop(self) -> None:
        """Ask every worker to leave, then terminate and kill the ones that do not; close queues."""
        for commands, process in zip(self.commands, self.processes, strict=False):
            if process.is_alive():
                try:
                    commands.put(("stop",))
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
                process.join(1.0)
            if process.is_alive():
                process.kill()
                process.join(1.0)
        for q in [*self.commands, self.results]:
            if q is not None:
                q.close()
                q.join_thread()
