"""The machine a benchmark ran on, and its physical limit: float32 sgemm GFLOP/s.

:func:`describe_machine` and :func:`versions` give what every benchmark's JSON line records (CPU
model, cores, memory; Python, numpy, numba, torch and hogwild versions). :func:`sgemm_gflops` is
the yardstick of the training throughput: ``n`` processes, each running numpy's float32 matmul
(``size`` x ``size``) with its BLAS pinned to one thread, all running at once, so that ``n`` cores
are busy with the densest arithmetic the machine offers. The children are started with spawn after
``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` are set to 1, so their numpy
loads single-threaded whatever this process's BLAS does; they start timing together.

:class:`Gang` is the harness every multi-process measurement of the benchmarks shares: N spawn
processes that stay up between tasks; for each task every member warms up, all are released
together (an event set once all said they are ready) and timed until the last one is done. A
member that fails sends its traceback, which becomes the parent's ``RuntimeError``, as does a
member that dies; every wait has a timeout, and the members are stopped (or killed) on every
exit. :class:`MemoryProbe` samples the private
resident memory (USS) of running processes from a background thread.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import queue
import signal
import threading
import time
import traceback
from contextlib import contextmanager
from importlib import metadata

import psutil

MB = 2**20
PROBE_INTERVAL_S = 0.25

BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
DEFAULT_TIMEOUT_S = 600.0  # start-up, warm-up, and again the timed work
STOP_TIMEOUT_S = 5.0
POLL_S = 0.5


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def usable_cores() -> int:
    """The logical CPUs this process may run on (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def describe_machine() -> dict:
    """CPU model, logical and physical cores, usable cores, memory and the kernel."""
    return {
        "cpu_model": cpu_model(),
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": usable_cores(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 2),
        "system": f"{platform.system()} {platform.release()}",
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    """Versions of Python and of the packages a benchmark depends on (None where missing)."""
    import numpy

    blas = None
    try:
        blas = numpy.__config__.CONFIG["Build Dependencies"]["blas"]
        blas = f"{blas.get('name')} {blas.get('version')}"
    except (AttributeError, KeyError, TypeError):
        pass
    return {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "blas": blas,
        "numba": _version("numba"),
        "torch": _version("torch"),
        "hogwild": _version("hogwild"),
    }


@contextmanager
def single_threaded_blas_env():
    """Set the BLAS thread variables to 1 for children started inside the block, then restore."""
    saved = {name: os.environ.get(name) for name in BLAS_THREAD_VARIABLES}
    os.environ.update({name: "1" for name in BLAS_THREAD_VARIABLES})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _gang_member(rank, cpus, commands, start, results, timeout, parent) -> None:
    """A gang member: pin, then run each ``(target, args)`` sent until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns shutdown
    if cpus:
        os.sched_setaffinity(0, cpus)

    def ready() -> None:
        results.put(("ready", rank, None))
        if not start.wait(timeout):
            raise TimeoutError(f"no start signal within {timeout:.0f} s")

    while True:
        try:
            command = commands.get(timeout=POLL_S)
            if command is None:
                return
            target, args = command
            results.put(("ok", rank, target(*args, ready=ready)))
        except queue.Empty:
            if os.getppid() != parent:
                return  # the parent died: nobody will ever send "stop"
        except BaseException:  # report rather than leave the parent waiting
            results.put(("error", rank, traceback.format_exc()))
            return


class Gang:
    """N long-lived processes that run timed tasks together, from a common start.

    Each task is a module-level function (spawn imports it by name) called in every member as
    ``target(*args, ready=ready)``: it prepares (warm-up), calls ``ready()``, which returns once
    every member is ready and the parent started the clock, does the timed work and returns a
    picklable answer. The members are started
    with spawn (or ``context``) and one BLAS thread each, and stay up between tasks, so a task
    pays no process start-up or import. Use as a context manager: leaving it stops the members
    (and kills those that do not leave). A failed task breaks the gang; close it.
    """

    def __init__(
        self,
        n: int,
        cpu_sets: list[list[int]] | None = None,
        context=None,
        timeout: float = DEFAULT_TIMEOUT_S,
        name: str = "bench",
    ):
        self.n = n
        self.timeout = timeout
        self._context = context or mp.get_context("spawn")
        self._start = self._context.Event()
        self._results = self._context.Queue()
        self._commands = []
        self._processes = []
        try:
            with single_threaded_blas_env():
                for rank in range(n):
                    commands = self._context.Queue()
                    process = self._context.Process(
                        target=_gang_member,
                        args=(
                            rank,
                            cpu_sets[rank] if cpu_sets else None,
                            commands,
                            self._start,
                            self._results,
                            timeout,
                            os.getpid(),
                        ),
                        name=f"{name}-{rank}",
                        daemon=True,
                    )
                    process.start()
                    self._commands.append(commands)
                    self._processes.append(process)
        except BaseException:
            self.close()
            raise

    def run(self, target, per_rank_args: list[tuple]) -> tuple[float, list]:
        """Run ``target`` in every member; returns (seconds from the start, answers by rank).

        Raises:
            RuntimeError: a member failed (its traceback is quoted), died, or did not answer in
                time.
        """
        if len(per_rank_args) != self.n:
            raise ValueError(f"{len(per_rank_args)} argument tuples for a gang of {self.n}")
        self._start.clear()
        for commands, args in zip(self._commands, per_rank_args, strict=True):
            commands.put((target, tuple(args)))
        for _ in range(self.n):
            self._next(target, "ready")
        started = time.perf_counter()
        self._start.set()  # all warmed up: release them together
        answers: list = [None] * self.n
        for _ in range(self.n):
            rank, answer = self._next(target, "ok")
            answers[rank] = answer
        return time.perf_counter() - started, answers

    def _next(self, target, expected: str) -> tuple[int, object]:
        """The next member message, which must be ``expected``; checks the members while waiting."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                status, rank, answer = self._results.get(timeout=POLL_S)
                break
            except queue.Empty:
                dead = [p for p in self._processes if p.exitcode is not None]
                if dead:
                    raise RuntimeError(
                        f"{target.__name__}: gang member {dead[0].name} (pid {dead[0].pid}) "
                        f"exited with code {dead[0].exitcode}"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{target.__name__}: no answer from the gang within {self.timeout:.0f} s"
                    ) from None
        if status != expected:
            raise RuntimeError(f"{target.__name__} failed in gang member {rank}:\n{answer}")
        return rank, answer

    def close(self) -> None:
        """Stop the members: ask, wait a little, then kill; release the queues."""
        for commands, process in zip(self._commands, self._processes, strict=False):
            if process.is_alive():
                try:
                    commands.put(None)
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(1.0)
        for q in [*self._commands, self._results]:
            q.close()
            q.join_thread()
        self._processes, self._commands = [], []

    def __enter__(self) -> Gang:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _sgemm(size: int, seconds: float, *, ready) -> float:
    """One sgemm process: warm up, wait for the others, then multiply for ``seconds``."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    c = np.empty((size, size), dtype=np.float32)
    np.matmul(a, b, out=c)  # warm-up: pages touched, BLAS kernels chosen
    ready()
    count = 0
    started = time.perf_counter()
    while True:
        np.matmul(a, b, out=c)
        count += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            break
    return 2.0 * size**3 * count / elapsed / 1e9


def pinned_cpu_sets(n: int) -> list[list[int]]:
    """One usable CPU per process, in order, wrapping around when there are more processes."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    return [[cpus[rank % len(cpus)]] for rank in range(n)]


def sgemm_gflops(n_procs: int, size: int = 1024, seconds: float = 1.0) -> dict:
    """Summed and per-process float32 sgemm GFLOP/s of ``n_procs`` single-threaded processes.

    Args:
        n_procs: processes running at once, one BLAS thread each, pinned one per CPU.
        size: the square matrices' side.
        seconds: how long each process multiplies after the common start.

    Returns:
        ``{"processes": n, "total": GFLOP/s summed, "per_process": [GFLOP/s, ...]}``.
    """
    with Gang(n_procs, pinned_cpu_sets(n_procs), name="bench-sgemm") as gang:
        _, answers = gang.run(_sgemm, [(size, seconds)] * n_procs)
    per_process = sorted(answers)
    return {"processes": n_procs, "total": sum(per_process), "per_process": per_process}


class MemoryProbe:
    """Samples the USS (private resident memory) of some processes from a background thread."""

    def __init__(self, pids: list[int]):
        self._procs = [psutil.Process(pid) for pid in pids]
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memory-probe", daemon=True)

    def _sample(self) -> None:
        for proc in self._procs:
            try:
                uss = proc.memory_full_info().uss
            except psutil.Error:
                continue
            self.first.setdefault(proc.pid, uss)
            self.last[proc.pid] = uss
            self.peak[proc.pid] = max(self.peak.get(proc.pid, 0), uss)

    def _loop(self) -> None:
        while not self._stop.wait(PROBE_INTERVAL_S):
            self._sample()

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def report(self) -> dict:
        """Largest USS of any process, and largest change of one over the probe, in MB."""
        growth = [self.last[pid] - self.first[pid] for pid in self.last]
        return {
            "worker_private_mb": max(self.peak.values(), default=0) / MB,
            "worker_private_growth_mb": max(growth, default=0) / MB,
        }
