"""Names of hogwild's shared-memory segments, and who owns them.

Every segment hogwild creates is named ``/hogwild-<job>-<pid>-<token>-<ns>-<rand>``:

- ``job``: the job's name (``ps.job``: every segment of a cluster job carries it, so what a
  job leaves is told apart from what other jobs on the machine own), else what the segment is
  (``train``, ``partition``, ``pool``), sanitised to ``[A-Za-z0-9_]`` and cut to
  ``MAX_JOB_CHARS`` so the whole name stays far below ``NAME_MAX`` (255);
- ``pid``: the owner process, the one that created the segment and must remove it;
- ``token``: the owner's start time (psutil ``create_time``, in centiseconds, base 36), so a
  process that later reuses the PID is not mistaken for the owner;
- ``ns``: the owner's PID namespace (the inode of ``/proc/self/ns/pid``, base 36): a pid means
  something only in its own namespace, and containers that share ``/dev/shm`` have their own;
- ``rand``: 8 random hex digits, so two segments of one process never collide.

Invariant: a name built by :func:`segment_name` always parses back with
:func:`parse_segment_name` to the same job, pid, token and namespace, and :func:`owner_alive` is
true for it exactly as long as that very process runs (not a zombie, not a later process with the
same PID). An owner in another PID namespace (or named in the older format, without one) cannot
be checked from here and counts as alive: :mod:`hogwild.shm.sweeper` removes only the segments of
owners that are provably dead, and never touches a live one.
"""

from __future__ import annotations

import os
import re
import secrets
from typing import NamedTuple

import psutil

PREFIX = "hogwild"
"""Every hogwild segment name starts with this (after the leading ``/``)."""

MAX_JOB_CHARS = 48
"""Longest job part kept in a name; the whole name then stays under 100 characters."""

START_TIME_TOLERANCE_S = 2.0
"""How far a live process's start time may drift from the recorded one and still be the owner.

psutil derives ``create_time`` from the boot time in ``/proc/stat``, which can move by about a
second under clock adjustment; a *different* process would have to reuse the PID within this
window of the owner's own start to be confused with it.
"""

_NAME_RE = re.compile(
    r"^/?" + PREFIX + r"-(?P<job>[A-Za-z0-9_]+)-(?P<pid>[0-9]+)-(?P<token>[0-9a-z]+)"
    r"(?:-n(?P<ns>[0-9a-z]+))?-[0-9a-f]{8}$"
)
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


class SegmentOwner(NamedTuple):
    """The owner recorded in a segment's name.

    Attributes:
        job: The sanitised job name.
        pid: The owner's process id.
        token: The owner's start time, in centiseconds since the epoch, base 36.
    """

    job: str
    pid: int
    token: str
    namespace: str | None = None  # None: a name of the older format, without its namespace

    @property
    def start_time(self) -> float:
        """The owner's start time in seconds since the epoch, decoded from ``token``."""
        return int(self.token, 36) / 100.0


def sanitize_job(job: str) -> str:
    """Make a job name safe for a segment name.

    Args:
        job: Any job name.

    Returns:
        ``job`` with every character outside ``[A-Za-z0-9_]`` replaced by ``_``, cut to
        ``MAX_JOB_CHARS``; ``"job"`` if that leaves nothing.
    """
    clean = re.sub(r"[^A-Za-z0-9_]", "_", job)[:MAX_JOB_CHARS]
    return clean or "job"


def _base36(n: int) -> str:
    if n <= 0:
        return "0"
    out = []
    while n:
        n, r = divmod(n, 36)
        out.append(_DIGITS[r])
    return "".join(reversed(out))


def pid_namespace() -> str:
    """This process's PID namespace: the inode of /proc/self/ns/pid in base 36 ("0": unknown)."""
    try:
        return _base36(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def start_token(pid: int) -> str:
    """The start-time token of a running process.

    Args:
        pid: A process id.

    Returns:
        The process's psutil ``create_time`` in centiseconds, base 36.

    Raises:
        ValueError: No process with that id exists.
    """
    try:
        created = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess as exc:
        raise ValueError(f"no process with pid {pid} to own a shared-memory segment") from exc
    return _base36(round(created * 100))


def segment_name(job: str, owner_pid: int | None = None) -> str:
    """A fresh, unique segment name for ``job`` owned by ``owner_pid``.

    Args:
        job: The job's name (any string; it is sanitised).
        owner_pid: The owner process; this process when None. It must be running (a zombie is
            accepted), since its start time goes into the name.

    Returns:
        ``/hogwild-<job>-<pid>-<token>-<rand>``, suitable for ``posix_ipc.SharedMemory``.

    Raises:
        ValueError: ``owner_pid`` is not a running process.
    """
    pid = os.getpid() if owner_pid is None else int(owner_pid)
    token = start_token(pid)
    name = f"/{PREFIX}-{sanitize_job(job)}-{pid}-{token}-n{pid_namespace()}-{secrets.token_hex(4)}"
    assert len(name) < 128, name
    return name


def parse_segment_name(name: str) -> SegmentOwner | None:
    """The owner recorded in a segment name, if the name is one of ours.

    Args:
        name: A segment name, with or without its leading ``/`` (``/dev/shm`` lists it without).

    Returns:
        ``SegmentOwner(job, pid, token)``, or None when ``name`` was not made by
        :func:`segment_name`.
    """
    match = _NAME_RE.match(name)
    if match is None:
        return None
    return SegmentOwner(match["job"], int(match["pid"]), match["token"], match["ns"])


def owner_alive(owner: SegmentOwner) -> bool:
    """Whether the process recorded in a segment's name is still running.

    Args:
        owner: As returned by :func:`parse_segment_name`.

    Returns:
        True if a process with ``owner.pid`` runs and started when the token says (within
        ``START_TIME_TOLERANCE_S``), or if we cannot tell: we may not inspect it, or it lives in
        another PID namespace (or its name does not say which), so we never touch a segment we
        cannot prove dead. False if no such process exists, it is a zombie, or it is a later
        process that reused the PID.
    """
    if owner.namespace != pid_namespace():
        return True
    return process_alive(owner.pid, owner.start_time)


def process_alive(pid: int, started: float) -> bool:
    """Whether process ``pid``, started at ``started`` (within ``START_TIME_TOLERANCE_S``), still
    runs in this PID namespace: False if it is gone, a zombie, or a later process that reused
    the PID; True if we may not inspect it (we cannot prove it dead)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created = proc.create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
    return abs(created - started) <= START_TIME_TOLERANCE_S
