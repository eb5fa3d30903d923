"""``hogwild.compile_records``: when a record lets a start skip the parent's compile, and when not.

The compile here is a counter (what ``compile_once`` runs is its caller's business); numba's real
cache files are in ``tests/proc/test_compile_records.py``. The sources whose stamps a record keeps
are a folder of the test's own, so that editing one does not touch the checkout.
"""

from __future__ import annotations

import os
import pickle
from importlib import metadata

import pytest

from hogwild import compile_records
from hogwild.compile_records import RECORDS, compile_once


@pytest.fixture
def cache(tmp_path, monkeypatch):
    sources = tmp_path / "package"
    sources.mkdir()
    (sources / "kernels.py").write_text("# kernels\n")
    monkeypatch.setattr(compile_records, "_packages", lambda: [sources])
    cache = tmp_path / "cache"
    (cache / "model").mkdir(parents=True)
    _write_index(cache / "model" / "kernels.train-10.py311.nbi", ["kernels.train-10.py311.1.nbc"])
    (cache / "model" / "kernels.train-10.py311.1.nbc").write_bytes(b"machine code")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))
    return cache


def _write_index(path, data_files, numba_version=None):
    """An index as numba writes one: its version (this numba's unless given), then its source's
    stamp and its entries (a key, here a tuple of strings where numba's holds types, and a
    machine-code file's name)."""
    entries = {(f"signature {number}", "magic"): name for number, name in enumerate(data_files)}
    written_by = numba_version or metadata.version("numba")
    path.write_bytes(pickle.dumps(written_by) + pickle.dumps(((1.0, 10), entries)))


def _counting():
    calls = []
    return calls, lambda: calls.append(1)


def test_the_second_start_skips_and_another_description_compiles(cache):
    calls, compile = _counting()
    assert compile_once({"batch": 32}, compile) is True
    assert compile_once({"batch": 32}, compile) is False
    assert compile_once({"batch": 64}, compile) is True
    assert len(calls) == 2
    assert len(list((cache / RECORDS).glob("*.json"))) == 2


def test_an_edited_source_or_a_missing_cache_file_compiles_again(cache, tmp_path):
    calls, compile = _counting()
    compile_once({"batch": 32}, compile)
    source = tmp_path / "package" / "kernels.py"
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert compile_once({"batch": 32}, compile) is True  # numba forgets the file's kernels too
    assert compile_once({"batch": 32}, compile) is False
    (cache / "model" / "kernels.train-10.py311.nbi").unlink()
    assert compile_once({"batch": 32}, compile) is True
    assert len(calls) == 3


def test_an_index_with_an_entry_more_still_counts_and_one_without_ours_compiles(cache):
    calls, compile = _counting()
    compile_once({"batch": 32}, compile)
    index = cache / "model" / "kernels.train-10.py311.nbi"
    ours, other = "kernels.train-10.py311.1.nbc", "kernels.train-10.py311.2.nbc"
    _write_index(index, [ours, other])  # another job compiled the kernel for other types
    (cache / "model" / other).write_bytes(b"other machine code")
    assert compile_once({"batch": 32}, compile) is False
    _write_index(index, [other])  # an index started afresh, which no longer lists ours
    assert compile_once({"batch": 32}, compile) is True
    assert compile_once({"batch": 32}, compile) is False
    assert len(calls) == 2


def test_an_index_another_numba_started_afresh_compiles_though_it_lists_our_names(cache):
    """Another numba (another environment sharing the cache) starts the index afresh from the
    same file names, and its machine code may have the same sizes: nothing of it is ours."""
    calls, compile = _counting()
    compile_once({"batch": 32}, compile)
    index = cache / "model" / "kernels.train-10.py311.nbi"
    _write_index(index, ["kernels.train-10.py311.1.nbc"], numba_version="0.67.0")
    assert compile_once({"batch": 32}, compile) is True
    assert len(calls) == 2


def test_rewritten_machine_code_or_an_unreadable_index_compiles_again(cache):
    calls, compile = _counting()
    compile_once({"batch": 32}, compile)
    (cache / "model" / "kernels.train-10.py311.1.nbc").write_bytes(b"machine code, compiled again")
    assert compile_once({"batch": 32}, compile) is True  # not what the record saw
    assert compile_once({"batch": 32}, compile) is False
    index = cache / "model" / "kernels.train-10.py311.nbi"
    index.write_bytes(b"index, torn")
    assert compile_once({"batch": 32}, compile) is True
    assert compile_once({"batch": 32}, compile) is False  # the torn index is the record's now
    index.unlink()
    assert compile_once({"batch": 32}, compile) is True  # no index at all: nothing to trust
    assert compile_once({"batch": 32}, compile) is True
    assert len(calls) == 5


def test_a_damaged_record_compiles_and_is_replaced(cache):
    calls, compile = _counting()
    compile_once({"batch": 32}, compile)
    (record,) = (cache / RECORDS).glob("*.json")
    record.write_text("{not json")
    assert compile_once({"batch": 32}, compile) is True
    assert compile_once({"batch": 32}, compile) is False
    assert len(calls) == 2


def test_a_failed_compile_leaves_no_record(cache):
    def broken():
        raise RuntimeError("numba failed")

    with pytest.raises(RuntimeError, match="numba failed"):
        compile_once({"batch": 32}, broken)
    assert not list(cache.rglob("*.json"))


def test_without_a_cache_directory_it_always_compiles(cache, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    calls, compile = _counting()
    assert compile_once({"batch": 32}, compile) is True
    assert compile_once({"batch": 32}, compile) is True
    assert len(calls) == 2


def test_a_dangling_link_among_the_sources_is_no_error(cache, tmp_path):
    (tmp_path / "package" / ".#kernels.py").symlink_to(tmp_path / "gone")  # an editor's lock
    calls, compile = _counting()
    assert compile_once({"batch": 32}, compile) is True
    assert compile_once({"batch": 32}, compile) is False
    assert len(calls) == 1
