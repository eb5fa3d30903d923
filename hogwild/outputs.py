"""Output paths checked before any work begins: a file or a folder the job will write.

A job that can only fail to write its metrics, checkpoints or picture at the end (after an epoch,
or an hour) should fail at once instead, with one line naming the path and why. These checks
make the folders a path needs and write (then remove) a probe where the job will write: what the
operating system refuses now it would refuse later. Root may write where permissions say no, but
not below a regular file or on a read-only file system, which these checks catch all the same.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hogwild.errors import HogwildError

__all__ = ["writable_directory", "writable_file"]


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _below_a_file(target: Path, what: str) -> None:
    """Name the file ``target`` would have to be below (mkdir says only "File exists")."""
    for folder in target.parents:
        if folder.exists():
            if not folder.is_dir():
                raise HogwildError(
                    f"{what} {target}: cannot be written ({folder} is not a directory)"
                )
            return


def writable_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path, once a file can be written there (its folder made if missing).

    An existing file is left as it is (it may be appended to); a probe made for a new one is
    removed again.

    Raises:
        HogwildError: ``path`` is a folder, or the file cannot be created, naming ``what``.
    """
    target = Path(path)
    if target.is_dir():
        raise HogwildError(f"{what} {target}: is a directory, expected a file path")
    _below_a_file(target, what)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        existed = target.exists()
        with open(target, "a"):
            pass
        if not existed:
            target.unlink()
    except OSError as exc:
        raise HogwildError(f"{what} {target}: cannot be written ({_why(exc)})") from None
    return target


def writable_directory(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path, once it is a folder (made if missing) a file can be written in.

    Raises:
        HogwildError: It is a file, or cannot be made or written in, naming ``what``.
    """
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise HogwildError(f"{what} {target}: exists and is not a directory")
    _below_a_file(target, what)
    try:
        target.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".hogwild-probe-", dir=target)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise HogwildError(f"{what} {target}: cannot be written ({_why(exc)})") from None
    return target
