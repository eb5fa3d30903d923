"""Who besides a job's owner can reach its roles, and so whether their traffic needs CURVE.

A role that listens beyond loopback is reachable from other machines: it always needs keys
(:func:`hogwild.net.address.check_bind`). One on loopback is reachable by every user of this
machine. ``cluster.auth`` decides what a cluster job does about those:

- ``"always"``: CURVE on every address, loopback included;
- ``"auto"`` (the default): CURVE beyond loopback, and on loopback too when another user is
  logged in to this machine now (:func:`other_logins`: a live login session in utmp of a user
  other than this process's and root, who can do anything here anyway);
- ``"beyond-loopback"``: CURVE beyond loopback only (a machine of one user, or one whose other
  users are trusted).

``"auto"`` reads utmp, which records logins (ssh, a console, a desktop): users that reach the
machine without a login session (services, cron jobs, containers sharing its network) are not
in it, which is why ``"always"`` exists. The decision is taken once, when the job starts.
"""

from __future__ import annotations

import os
import pwd
import struct
from collections.abc import Iterable
from pathlib import Path

from hogwild.signals import process_exists

__all__ = ["AUTH_MODES", "UTMP_FILES", "curve_reason", "other_logins", "read_utmp"]

AUTH_MODES = ("auto", "always", "beyond-loopback")
"""``cluster.auth``: when the job's roles use CURVE (see the module docstring)."""

UTMP_FILES = ("/run/utmp", "/var/run/utmp")
# glibc's struct utmp (Linux, 64-bit and 32-bit alike): type, pid, line, id, user, host, exit
# status, session, time (two int32), address (four int32), reserved.
UTMP = struct.Struct("<hxxi32s4s32s256shhi2i4i20s")
USER_PROCESS = 7  # a login session (utmp's ut_type)


def read_utmp(path: str | os.PathLike) -> list[tuple[str, int]]:
    """The login sessions recorded in the utmp file ``path``: ``(user, pid)`` pairs (an empty
    list if the file is missing or unreadable: nobody is known to be logged in)."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return []
    sessions = []
    for at in range(0, len(raw) - UTMP.size + 1, UTMP.size):
        kind, pid, _, _, user, *_ = UTMP.unpack_from(raw, at)
        name = user.split(b"\0", 1)[0].decode("utf-8", "replace")
        if kind == USER_PROCESS and name:
            sessions.append((name, pid))
    return sessions


def other_logins(files: Iterable[str | os.PathLike] = UTMP_FILES) -> list[str]:
    """Users other than this process's own (and root) with a live login session now, sorted,
    from the first of ``files`` that exists."""
    me = pwd.getpwuid(os.getuid()).pw_name
    for path in files:
        if os.path.exists(path):
            users = {
                u for u, pid in read_utmp(path) if u not in (me, "root") and process_exists(pid)
            }
            return sorted(users)
    return []


def curve_reason(auth: str, loopback: bool, others: list[str] | None = None) -> str | None:
    """Why the job's roles need CURVE keys (a phrase for the progress line), or None.

    Args:
        auth: ``cluster.auth`` (one of :data:`AUTH_MODES`).
        loopback: Whether the roles listen on loopback only.
        others: The other users logged in (:func:`other_logins`; read here when None and
            ``auth`` is ``"auto"`` on loopback).

    Raises:
        ValueError: ``auth`` is not one of :data:`AUTH_MODES`.
    """
    if auth not in AUTH_MODES:
        raise ValueError(f"cluster.auth = {auth!r}: expected one of {', '.join(AUTH_MODES)}")
    if not loopback:
        return "the roles listen beyond loopback"
    if auth == "always":
        return 'cluster.auth = "always"'
    if auth == "beyond-loopback":
        return None
    others = other_logins() if others is None else others
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        return f"other users are logged in ({shown}) and could reach loopback"
    return None
