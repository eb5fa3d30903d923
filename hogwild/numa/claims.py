"""The CPUs other live hogwild jobs have pinned workers to, so that two jobs do not share cores.

A hyperparameter sweep starts several ``hogwild train`` jobs on one machine at once; planned
alone, each would pin its workers from the first core on, and two jobs' workers would share
cores while others sat idle. Workers name themselves ``hogwild-w<N>`` (the kernel's process
name, ``/proc/PID/comm``), so a new job finds the CPUs that live workers are pinned to (an
affinity of exactly one CPU) and plans its own workers on the others first. Nothing is written
anywhere: what is taken is read from the running processes, so a job that dies releases its
cores with its processes.

Two jobs planning at the same instant would both see the same free cores; :func:`placement_lock`
(an advisory lock of this host, :mod:`hogwild.locks`) makes a job's planning and the pinning of
its workers one step, for at most ``timeout_s`` seconds of waiting. It is let go as soon as every
worker has pinned itself: compiling the kernels and loading the workers happen outside it, so
jobs and replicas starting together start side by side.
"""

from __future__ import annotations

import os

import psutil

from hogwild.locks import machine_lock

WORKER_NAME_PREFIX = "hogwild-w"


def pinned_by_other_jobs() -> dict[int, int]:
    """CPU -> pid of a live hogwild worker pinned to it alone (workers of this process excluded:
    its children, and its forkserver's)."""
    me = os.getpid()
    try:
        ours = {me, *(child.pid for child in psutil.Process(me).children())}
    except psutil.Error:
        ours = {me}
    taken: dict[int, int] = {}
    for process in psutil.process_iter(["pid", "name"]):
        if not (process.info["name"] or "").startswith(WORKER_NAME_PREFIX):
            continue
        try:
            if process.ppid() in ours:
                continue
            cpus = process.cpu_affinity()
        except psutil.Error:
            continue
        if len(cpus) == 1:
            taken.setdefault(cpus[0], process.info["pid"])
    return taken


def placement_lock(timeout_s: float = 300.0):
    """Hold the machine's placement lock while inside (see :func:`hogwild.locks.machine_lock`)."""
    return machine_lock("placement", timeout_s)
