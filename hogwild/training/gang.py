"""The trainer's worker processes as one gang: start, command, listen, watch, stop.

Invariants: every blocking wait is bounded. A worker that cannot start in ``READY_TIMEOUT_S``,
that died, or that is alive but shows no heartbeat for ``stall_s`` seconds is an error naming it
(:class:`~hogwild.errors.WorkerDiedError`, :class:`~hogwild.errors.WorkerStalledError`), never a
hang; and :meth:`WorkerGang.stop` leaves no process and no queue behind, whatever state the gang
is in (asked to stop, then terminated, then killed: a stopped process dies of SIGKILL too).
A worker busy with a command when the gang stops is terminated at once rather than after
``STOP_TIMEOUT_S``: it reads its queue only between commands, and its SIGTERM handler runs the
same cleanup (its store closed, a request in flight to a dead server cancelled), so the stop
waits for that cleanup, not for the shard or a timeout.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import time
from collections.abc import Callable

import numpy as np
import psutil

from hogwild.errors import (
    DataError,
    HogwildError,
    StoppedError,
    WorkerDiedError,
    WorkerStalledError,
)
from hogwild.shm.naming import process_alive
from hogwild.training import zygote
from hogwild.training.messages import (
    DataFailed,
    Evaluate,
    Evaluated,
    Failed,
    Pinned,
    Ready,
    Stop,
    StoppedFailed,
    Train,
    Trained,
    Wake,
)

READY_TIMEOUT_S = 300.0  # a worker that cannot pin itself, or then start, in this long is broken
POLL_S = 0.1
STOP_TIMEOUT_S = 5.0
FORKSERVER_GONE = 255  # the exit code multiprocessing gives every worker of a forkserver that ended
REPORT_WAIT_S = 0.2  # how long a dead worker's last report may take to come through the queue


class WorkerGang:
    """Worker processes, one command queue each, and one queue of their answers.

    Args:
        context: A multiprocessing context (spawn or forkserver).
        kept_checkpoint: The checkpoint directory, named in the error when a worker dies.
        heartbeats: A view of the workers' heartbeat column in the arena (seconds of the
            monotonic clock), or None to watch only for deaths.
        stall_s: Seconds without a heartbeat after which a live worker counts as stuck.
    """

    def __init__(
        self,
        context,
        kept_checkpoint: str = "",
        heartbeats: np.ndarray | None = None,
        stall_s: float = 120.0,
    ):
        self.context = context
        self.kept_checkpoint = kept_checkpoint
        self.heartbeats = heartbeats
        self.stall_s = stall_s
        self.processes: list = []
        self._created: list[float | None] = []  # each worker's creation time, as the kernel has it
        self.commands: list = []
        self.results = None
        self._ready: dict[int, Ready] = {}
        self._pending: dict[int, int] = {}  # worker -> commands sent and not yet answered

    def start(self, n: int, target, setup_of: Callable[[int], object]) -> None:
        """Start ``n`` workers running ``target(setup_of(i), commands, results)``; return once
        each has pinned itself to its CPU (:meth:`wait_ready` waits for the rest of its start).
        """
        self.results = self.context.Queue()
        for worker in range(n):
            commands = self.context.Queue()
            process = self.context.Process(
                target=target,
                name=f"hogwild-worker-{worker}",
                args=(setup_of(worker), commands, self.results),
                daemon=True,
            )
            process.start()
            self.commands.append(commands)
            self.processes.append(process)
            self._created.append(_creation_time(process.pid))
        pinned: set[int] = set()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(pinned) < n:
            message = self.next_message("starting", deadline)
            if isinstance(message, Pinned):
                pinned.add(message.worker)
            elif isinstance(message, Ready):  # a worker that was quick: kept for wait_ready
                self._ready[message.worker] = message

    def wait_ready(self) -> list[Ready]:
        """Wait until every started worker is ready for commands.

        Returns:
            Each worker's :class:`~hogwild.training.messages.Ready`, by worker.
        """
        n = len(self.processes)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(self._ready) < n:
            message = self.next_message("starting", deadline)
            if isinstance(message, Ready):
                self._ready[message.worker] = message
        return [self._ready[w] for w in range(n)]

    def send(self, worker: int, command) -> None:
        self.commands[worker].put(command)
        if isinstance(command, (Train, Evaluate)):  # each is answered once (Trained, Evaluated)
            self._pending[worker] = self._pending.get(worker, 0) + 1

    def busy(self) -> list[int]:
        """The workers with a command sent and not yet answered."""
        return sorted(w for w, n in self._pending.items() if n > 0)

    def wake(self) -> None:
        """Make the :meth:`poll` under way in another thread (or the next one) return a
        :class:`~hogwild.training.messages.Wake` at once: that thread has work besides the
        workers' answers (a replica's command from its driver). Nothing before :meth:`start`
        or after :meth:`stop`."""
        results = self.results
        if results is None:
            return
        with contextlib.suppress(ValueError, OSError):  # closed meanwhile: nobody to wake
            results.put(Wake())

    def next_message(self, doing: str, deadline: float | None = None, idle=None):
        """The next answer; raises if a worker died, failed or stalled, or the deadline passed.

        ``idle`` is called between polls (the progress line).
        """
        while True:
            message = self.poll(doing, POLL_S)
            if message is not None and not isinstance(message, Wake):
                return message
            if deadline is not None and time.monotonic() > deadline:
                raise HogwildError(f"workers did not become ready within {READY_TIMEOUT_S:.0f} s")
            if idle is not None:
                idle()

    def poll(self, doing: str, timeout: float):
        """The next answer within ``timeout`` seconds (None if none came); raises if a worker
        died, failed or stalled."""
        try:
            message = self.results.get(timeout=timeout)
        except queue.Empty:
            self._check(doing)
            return None
        return self._reported(message, doing)

    def _reported(self, message, doing: str):
        """``message``, or the error it reports (a worker that failed) raised."""
        if isinstance(message, (Trained, Evaluated)) and self._pending.get(message.worker):
            self._pending[message.worker] -= 1
        if isinstance(message, Failed):
            raise WorkerDiedError(
                f"worker {message.worker} failed while {doing}:\n{message.traceback}"
            )
        if isinstance(message, DataFailed):  # a bad record, say: the user's input, one line
            raise DataError(f"worker {message.worker}, while {doing}: {message.message}")
        if isinstance(message, StoppedFailed):  # its parameter server stopped the bucket
            raise StoppedError(f"worker {message.worker}, while {doing}: {message.message}")
        return message

    def _kept(self) -> str:
        if not self.kept_checkpoint:
            return ""
        return f" and the last checkpoint in {self.kept_checkpoint} is kept"

    def _check(self, doing: str) -> None:
        for worker, process in enumerate(self.processes):
            code = process.exitcode
            if code is None:
                continue
            # A worker that said why before it exited (its report may have come in after this
            # poll's wait ended): that report is the error, not its exit code.
            with contextlib.suppress(queue.Empty, ValueError, OSError):
                while True:
                    self._reported(self.results.get(timeout=REPORT_WAIT_S), doing)
            how = (
                f"was killed by {signal.Signals(-code).name}"
                if code < 0 and -code in signal.valid_signals()
                else f"exited with code {code}"
            )
            if code == FORKSERVER_GONE and self._forkserver_gone():
                how = (
                    f"was reported ended (code {code}) by its forkserver's end: the forkserver, "
                    "which reports its workers' exits, ended (killed, or out of memory)"
                )
            raise WorkerDiedError(
                f"worker {worker} (pid {process.pid}) {how} while {doing}; the job is stopped"
                + self._kept()
            )
        if self.heartbeats is None:
            return
        now = time.monotonic()
        for worker, beat in enumerate(self.heartbeats):
            if beat > 0 and now - beat > self.stall_s:
                raise WorkerStalledError(
                    f"worker {worker} (pid {self.processes[worker].pid}) is alive but showed no "
                    f"progress for {now - beat:.0f} s while {doing} (stopped, or stuck; "
                    f"train.stall_s = {self.stall_s:g}); the job is stopped" + self._kept()
                )

    def _forkserver_gone(self) -> bool:
        return self.context.get_start_method() == "forkserver" and zygote.server_pid() is None

    def _end_unreported(self) -> None:
        """End the workers that multiprocessing counts as ended but that still run.

        A forked worker's exit is reported by its forkserver: once that server is gone, every
        worker reads as exited (code 255) and terminate() or kill() do nothing, though one may
        still run (and one not yet in its main has no parent-death signal). Those are signalled
        by pid, once the kernel's creation time shows the pid is still the worker's.
        """
        left = []
        for process, created in zip(self.processes, self._created, strict=False):
            if created is None or process.exitcode is None:
                continue  # never seen, or still joined by multiprocessing above
            if not process_alive(process.pid, created):
                continue  # ended, a zombie, or its pid another process's now
            with contextlib.suppress(psutil.Error):
                worker = psutil.Process(process.pid)
                worker.terminate()
                left.append(worker)
        _, alive = psutil.wait_procs(left, timeout=STOP_TIMEOUT_S)
        for worker in alive:
            with contextlib.suppress(psutil.Error):
                worker.kill()
        psutil.wait_procs(alive, timeout=1.0)

    def stop(self) -> None:
        """Ask every worker to leave, then terminate and kill the ones that do not; close queues."""
        for commands, process in zip(self.commands, self.processes, strict=False):
            if process.is_alive():
                try:
                    commands.put(Stop())
                except (OSError, ValueError):
                    pass
        for worker in self.busy():  # inside a command: it would read Stop only after it
            if worker < len(self.processes) and self.processes[worker].is_alive():
                self.processes[worker].terminate()
        self._pending.clear()
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
        self._end_unreported()
        if self.results is not None:  # this process's Wakes, if unread, are not waited for
            self.results.cancel_join_thread()
        for q in [*self.commands, self.results]:
            if q is not None:
                q.close()
                q.join_thread()


def _creation_time(pid: int | None) -> float | None:
    """When process ``pid`` was created, as the kernel has it (None if it is gone already)."""
    if pid is None:
        return None
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None
