"""The host's advisory locks (:mod:`hogwild.locks`): one compile lock per numba cache, so jobs
that compile into different caches never wait for each other, and jobs sharing one take turns."""

from __future__ import annotations

import fcntl
import os
import tempfile

from hogwild import locks


def _held_elsewhere(step: str) -> bool:
    """Whether ``step``'s lock file is locked by an open description other than ours."""
    fd = os.open(locks.lock_path(step), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock this description took
    return False


def test_each_numba_cache_has_its_own_compile_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # lock files of this test's own
    first, second = tmp_path / "cache-a", tmp_path / "cache-b"
    first.mkdir()
    second.mkdir()
    (tmp_path / "link").symlink_to(first)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(first))
    key = locks.numba_cache_key()
    with locks.compile_lock(timeout_s=5) as held:
        assert held and _held_elsewhere(f"kernels-{key}")
        assert not _held_elsewhere(f"ps-kernels-{key}")  # the servers' kernels: another lock
        monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "link"))  # the same cache
        assert locks.numba_cache_key() == key
        monkeypatch.setenv("NUMBA_CACHE_DIR", str(second))
        assert locks.numba_cache_key() != key
        with locks.compile_lock(timeout_s=5) as other:  # another cache's: not waited for
            assert other
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    assert locks.numba_cache_key() == "sources"  # numba's default, beside the sources
