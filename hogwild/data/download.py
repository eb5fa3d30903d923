"""Downloading one file, checked against a known MD5, with a plain-text progress bar.

Invariant: the destination path either does not exist or holds the complete file with the
expected checksum. The bytes go to a temporary file next to the destination (same directory, so
the final rename is atomic) and are hashed as they arrive; the temporary file is renamed only when
the sum matches and is removed on every other exit path -- a network error, a wrong sum, a full
disk, Ctrl-C. Every network operation (connect, each read) has a timeout, so a dead mirror fails
instead of hanging.

Only the standard library is used (urllib); the progress bar is ``\\r``-redrawn text on stderr.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from hogwild.errors import DataError

DEFAULT_TIMEOUT = 30.0
"""Seconds any single network operation (connect, one read) may take."""

_CHUNK = 1 << 16
_BAR_WIDTH = 30
_REDRAW_INTERVAL = 0.1


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
    bar: _ProgressBar | None = None
    request = urllib.request.Request(url, headers={"User-Agent": "hogwild"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            total = _content_length(response)
            bar = _ProgressBar(name, total) if progress else None
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                if bar is not None:
                    bar.update(size)
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


class _ProgressBar:
    """One line on stderr, redrawn with ``\\r``: name, bar, megabytes and percent."""

    def __init__(self, name: str, total: int | None) -> None:
        self.name, self.total = name, total
        self.done = 0
        self._last_draw = 0.0
        self._last_percent = -1
        self._draw()

    def update(self, done: int) -> None:
        """Record ``done`` bytes received; redraw at most every 0.1 s or per percent."""
        self.done = done
        percent = self._percent()
        now = time.monotonic()
        if percent != self._last_percent or now - self._last_draw >= _REDRAW_INTERVAL:
            self._draw()

    def close(self) -> None:
        """Draw the final state and end the line."""
        self._draw()
        sys.stderr.write("\n")
        sys.stderr.flush()

    def _percent(self) -> int | None:
        if not self.total:
            return None
        return min(100, self.done * 100 // self.total)

    def _draw(self) -> None:
        percent = self._percent()
        mb = self.done / 1e6
        if percent is None:
            text = f"{self.name}: {mb:.1f} MB"
        else:
            filled = percent * _BAR_WIDTH // 100
            bar = "#" * filled + "." * (_BAR_WIDTH - filled)
            text = f"{self.name}: [{bar}] {mb:.1f}/{self.total / 1e6:.1f} MB {percent:3d}%"
        sys.stderr.write("\r" + text)
        sys.stderr.flush()
        self._last_draw = time.monotonic()
        self._last_percent = percent if percent is not None else -1
