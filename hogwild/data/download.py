"""Downloading one file, checked against a known MD5, with a progress bar.

Invariant: the destination path either does not exist or holds the complete file with the
expected checksum. The bytes go to a temporary file next to the destination (same directory, so
the final rename is atomic) and are hashed as they arrive; the temporary file is renamed only when
the sum matches and is removed on every other exit path -- a network error, a wrong sum, a full
disk, Ctrl-C. Every network operation (connect, each read) has a timeout, so a dead mirror fails
instead of hanging.

The download uses the standard library (urllib); the progress bar is :mod:`hogwild.progress`.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from hogwild.errors import DataError
from hogwild.progress import progress_bar

DEFAULT_TIMEOUT = 30.0
"""Seconds any single network operation (connect, one read) may take."""

_CHUNK = 1 << 16


def download(
    url: str,
    dest: str | os.PathLike,
    md5: str,
    progress: bool = True,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> None:
    """Download ``url`` to ``dest``, keeping it only if its MD5 is ``md5``.

    Args:
        url: What to fetch (http, https; anything urllib opens).
        dest: Where the file goes; its directory must exist. Replaced atomically if present.
        md5: The expected MD5 of the file, as hex digits.
        progress: Draw a progress bar (bytes, percent) on stderr.
        timeout: Seconds allowed for each network operation.

    Raises:
        DataError: The server cannot be reached or answers with an error, the connection drops
            or stalls, the file's MD5 is not ``md5`` (the message gives both sums), or the file
            cannot be written. Nothing is left at ``dest`` or beside it.
    """
    dest = Path(dest)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    except OSError as exc:
        raise DataError(f"cannot create a file in {dest.parent}: {exc.strerror or exc}") from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            actual, size = _fetch(url, out, dest.name, progress, timeout)
            out.flush()
            os.fsync(out.fileno())
        if actual != md5.lower():
            raise DataError(
                f"{dest.name} from {url}: MD5 mismatch: expected {md5.lower()}, found {actual} "
                f"({size} bytes); the download was discarded"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _fetch(url: str, out, name: str, progress: bool, timeout: float) -> tuple[str, int]:
    """Stream ``url`` into ``out``; return the MD5 hex digest and the number of bytes."""
    digest = hashlib.md5(usedforsecurity=False)
    size = 0
    total: int | None = None
    bar = None
    request = urllib.request.Request(url, headers={"User-Agent": "hogwild"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            total = _content_length(response)
            bar = progress_bar(total, name, "B", enabled=progress, unit_scale=True)
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                bar.update(len(chunk))
    except urllib.error.HTTPError as exc:
        exc.close()
        raise DataError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise DataError(f"{url}: cannot connect: {exc.reason}") from None
    except TimeoutError:
        raise DataError(f"{url}: no data for {timeout:g} s after {size} bytes") from None
    except (OSError, http.client.HTTPException) as exc:
        raise DataError(f"{url}: download failed after {size} bytes: {exc!r}") from None
    finally:
        if bar is not None:
            bar.close()
    if total is not None and size != total:
        raise DataError(f"{url}: the connection closed after {size} of {total} bytes")
    return digest.hexdigest(), size


def _content_length(response) -> int | None:
    """The announced body size, or None when the server does not say."""
    value = response.headers.get("Content-Length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
