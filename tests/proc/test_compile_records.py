"""``hogwild.compile_records.compile_once`` against numba's real on-disk cache.

Each run is a fresh interpreter (numba reads ``NUMBA_CACHE_DIR`` once, at import) that compiles
a small ``cache=True`` kernel through ``compile_once`` into a cache directory of the test's own.
The first run compiles and writes the record, the second skips (numba's cache holds the kernel).
Once the kernel's cache files are gone the record no longer counts: the next run compiles again,
and numba writes the kernel back; the last run skips though it first compiles the kernel for other
types (numba rewrites the index with an entry more; the record's entry is still in it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hogwild.compile_records import CACHE_SUFFIXES, RECORDS

pytestmark = pytest.mark.kernel_free

KERNEL = """
from numba import njit

@njit(cache=True)
def twice(x):
    return 2.0 * x
"""

RUN = """
import json
import sys

from hogwild.compile_records import compile_once

import kernel

if sys.argv[1:] == ["other-types"]:  # another job's kernel of the same module, compiled before
    kernel.twice(1)
compiled = compile_once({"kernels": "twice"}, lambda: kernel.twice(1.0))
print(json.dumps({"compiled": compiled}))
"""


def _compile_once(folder: Path, cache: Path, *args: str) -> bool:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", RUN, *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["compiled"]


def _cache_files(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*") if p.suffix in CACHE_SUFFIXES]


def test_a_record_skips_the_compile_until_numbas_cache_files_are_gone(tmp_path):
    (tmp_path / "kernel.py").write_text(textwrap.dedent(KERNEL))
    cache = tmp_path / "cache"

    assert _compile_once(tmp_path, cache) is True
    (record,) = (cache / RECORDS).glob("*.json")
    kept = json.loads(record.read_text())["cache_files"]
    assert any(name.endswith(".nbi") for name in kept)  # the kernel's index is in the record
    assert _compile_once(tmp_path, cache) is False

    for path in _cache_files(cache):
        path.unlink()
    assert _compile_once(tmp_path, cache) is True
    assert _cache_files(cache)  # numba wrote the kernel back
    (index,) = cache.rglob("*.nbi")
    before = index.stat().st_mtime_ns
    assert _compile_once(tmp_path, cache, "other-types") is False  # the new record counts
    assert index.stat().st_mtime_ns != before  # though numba added the int entry to the index
