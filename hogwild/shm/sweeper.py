"""Cleanup of hogwild's shared-memory segments: by their owner at exit, and after its death.

Two mechanisms, one for each way an owner can end:

- The owner's own exit. :func:`own_segment` records a segment this process created; an
  ``atexit`` hook, and a multiprocessing finalizer for fork/forkserver children (which leave
  through ``os._exit`` and skip ``atexit``), remove whatever is still recorded when the process
  exits normally or through an unhandled exception. :func:`unlink_segment` removes one early.
- A SIGKILLed or hard-crashed owner, which cannot clean up. The trainer calls :func:`sweep` at
  start-up, and ``hogwild shm gc`` / ``hogwild shm ls`` expose :func:`sweep`,
  :func:`list_segments` and :func:`format_segments`.

Invariant: :func:`sweep` removes a segment only if it is provably ours and provably dead: its name
parses as one of hogwild's (:func:`hogwild.shm.naming.parse_segment_name`), it belongs to this
user, and its recorded owner, in this PID namespace, is gone
(:func:`hogwild.shm.naming.owner_alive` is false: no such process, a zombie, or a newer process
that reused the PID). A segment whose owner is alive, lives in another container's namespace,
belongs to another user, or is not ours, is never touched; :func:`sweep_report` says what was
left and why. A segment we may not remove is reported, never a crash. The exit hook removes only
segments recorded by this very process (a forked child inherits the record but not the
ownership).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import posix_ipc

from hogwild.shm.naming import PREFIX, SegmentOwner, owner_alive, parse_segment_name

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
"""Where the kernel shows POSIX shared-memory segments."""


# Segments this process created and still owns: name -> creator pid. The pid keeps a forked
# child, which inherits this dict, from removing its parent's segments.
_owned: dict[str, int] = {}
_owned_lock = threading.Lock()
_finalizer_pid: int | None = None


def own_segment(name: str) -> None:
    """Record that this process created segment ``name`` and must remove it at exit.

    Args:
        name: The segment's name, with its leading ``/``.
    """
    global _finalizer_pid
    pid = os.getpid()
    with _owned_lock:
        _owned[name] = pid
        if _finalizer_pid != pid:
            # fork/forkserver children run multiprocessing's finalizers but not atexit; spawned
            # children and the main process run both (the second finds nothing left to do).
            multiprocessing.util.Finalize(None, unlink_owned_segments, exitpriority=0)
            _finalizer_pid = pid


def unlink_segment(name: str) -> None:
    """Remove segment ``name`` and forget owning it; already gone is fine.

    Args:
        name: The segment's name, with its leading ``/``.
    """
    with _owned_lock:
        _owned.pop(name, None)
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        pass


def unlink_owned_segments() -> None:
    """Remove every segment this process recorded with :func:`own_segment` (the exit hook)."""
    pid = os.getpid()
    with _owned_lock:
        names = [name for name, owner in _owned.items() if owner == pid]
    for name in names:
        log.debug("removing shared-memory segment %s at exit", name)
        unlink_segment(name)


atexit.register(unlink_owned_segments)


@dataclass(frozen=True)
class SegmentInfo:
    """One ``hogwild*`` entry of ``/dev/shm``.

    Attributes:
        name: The segment's name with its leading ``/`` (what ``posix_ipc`` takes).
        size: Its size in bytes.
        owner: The owner recorded in its name, or None if the name is not one of ours.
        alive: Whether that owner still runs; None when ``owner`` is None or cannot be checked
            from here (another PID namespace, or a name without one).
    """

    name: str
    size: int
    owner: SegmentOwner | None
    alive: bool | None
    mine: bool = True  # this user's

    @property
    def removable(self) -> bool:
        """Whether :func:`sweep` would remove it: ours, this user's, and its owner is dead."""
        return self.owner is not None and self.mine and self.alive is False

    @property
    def why_kept(self) -> str | None:
        """Why a segment that may be abandoned is left alone (None: nothing in doubt)."""
        if self.owner is None:
            return None
        if self.alive is None:
            if self.owner.namespace is None:
                return "its name (an older hogwild's) does not say which PID namespace owns it"
            return "its owner lives in another PID namespace (another container)"
        if self.alive is False and not self.mine:
            return "its owner is dead but it belongs to another user"
        return None


def list_segments(shm_dir: Path = SHM_DIR) -> list[SegmentInfo]:
    """Every entry of ``shm_dir`` whose name starts with ``hogwild``, sorted by name.

    Args:
        shm_dir: The shared-memory directory; ``/dev/shm`` unless testing.

    Returns:
        One :class:`SegmentInfo` per entry (empty if the directory does not exist). Entries that
        vanish while being listed are left out.
    """
    try:
        entries = sorted(e for e in os.listdir(shm_dir) if e.startswith(PREFIX))
    except FileNotFoundError:
        return []
    infos = []
    for entry in entries:
        try:
            stat = os.stat(shm_dir / entry)
        except FileNotFoundError:
            continue
        owner = parse_segment_name(entry)
        if owner is None or not _same_namespace(owner):
            alive = None  # not ours, or an owner that cannot be checked from here
        else:
            alive = owner_alive(owner)
        infos.append(
            SegmentInfo("/" + entry, stat.st_size, owner, alive, stat.st_uid == os.geteuid())
        )
    return infos


def _same_namespace(owner: SegmentOwner) -> bool:
    from hogwild.shm.naming import pid_namespace

    return owner.namespace == pid_namespace()


def sweep_report(shm_dir: Path = SHM_DIR) -> list[str]:
    """Sweep (as the trainer does at start-up) and say, one line each, what was done and left."""
    infos = list_segments(shm_dir)  # once: a removable segment is never one kept
    removed, refused = _sweep(False, shm_dir, infos)
    lines = [f"removed {name}: its owner process is dead" for name in removed]
    lines += [f"could not remove {name}: {reason}" for name, reason in refused.items()]
    for info in infos:
        if info.why_kept is not None:
            lines.append(f"left {info.name} ({_human_bytes(info.size)}): {info.why_kept}")
    return lines


def sweep(dry_run: bool = False, shm_dir: Path = SHM_DIR) -> list[str]:
    """Remove the hogwild segments whose owner process is dead.

    Args:
        dry_run: Only report what would be removed.
        shm_dir: The shared-memory directory; ``/dev/shm`` unless testing. Removal goes through
            ``shm_unlink`` when it is ``/dev/shm`` and through ``os.unlink`` otherwise.

    Returns:
        The names (with leading ``/``) removed, or that would be removed when ``dry_run``.
        A segment someone else removed meanwhile, or that we may not remove, is not listed.
    """
    return _sweep(dry_run, shm_dir)[0]


def sweep_owner(pid: int, shm_dir: Path = SHM_DIR) -> list[str]:
    """Remove the segments of dead process ``pid`` alone (e.g. a SIGKILLed driver's, by the
    process that watched it die); those of any other owner, dead or alive, are left as they are.

    Returns:
        The names (with leading ``/``) removed.
    """
    infos = [i for i in list_segments(shm_dir) if i.owner is not None and i.owner.pid == pid]
    return _sweep(False, shm_dir, infos)[0]


def _sweep(
    dry_run: bool, shm_dir: Path, infos: list[SegmentInfo] | None = None
) -> tuple[list[str], dict[str, str]]:
    removed: list[str] = []
    refused: dict[str, str] = {}
    for info in list_segments(shm_dir) if infos is None else infos:
        if not info.removable:
            continue
        if not dry_run:
            try:
                if Path(shm_dir) == SHM_DIR:
                    posix_ipc.unlink_shared_memory(info.name)
                else:
                    os.unlink(Path(shm_dir) / info.name.lstrip("/"))
            except (posix_ipc.ExistentialError, FileNotFoundError):
                continue
            except (posix_ipc.PermissionsError, PermissionError) as exc:
                refused[info.name] = f"not permitted ({exc})"
                continue
            log.info(
                "removed shared-memory segment %s (%d bytes) of dead process %d",
                info.name,
                info.size,
                info.owner.pid if info.owner else -1,
            )
        removed.append(info.name)
    return removed, refused


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_segments(infos: list[SegmentInfo]) -> str:
    """A table of segments for ``hogwild shm ls``.

    Args:
        infos: As returned by :func:`list_segments`.

    Returns:
        One row per segment (name, size, owner pid, job, owner start time, state) and a summary
        line; a single line when there are none.
    """
    if not infos:
        return f"no hogwild shared-memory segments in {SHM_DIR}"
    header = ("NAME", "SIZE", "PID", "JOB", "STARTED", "STATE")
    rows = []
    for info in infos:
        if info.owner is None:
            rows.append((info.name, _human_bytes(info.size), "-", "-", "-", "not ours"))
            continue
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.owner.start_time))
        state = {True: "alive", False: "dead owner", None: "owner unknown"}[info.alive]
        rows.append(
            (
                info.name,
                _human_bytes(info.size),
                str(info.owner.pid),
                info.owner.job,
                started,
                state,
            )
        )
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]
    dead = [i for i in infos if i.removable]
    total = sum(i.size for i in infos)
    summary = f"{len(infos)} segment(s), {_human_bytes(total)}"
    if dead:
        dead_bytes = _human_bytes(sum(i.size for i in dead))
        summary += f"; {len(dead)} with a dead owner ({dead_bytes}): remove with `hogwild shm gc`"
    return "\n".join([*lines, summary])
