"""A benchmark's record (bench/support/record.py): the line it prints and writes, the command, wall
time and source stamped on it, and the fresh numba cache a timed run compiles into."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from bench.support.record import (
    command_line,
    emit_record,
    fresh_numba_cache,
    measured,
    measured_and_emitted,
    source,
    stamp,
)


def test_the_record_is_one_line_on_stdout_and_the_same_line_in_the_out_file(tmp_path, capsys):
    out = tmp_path / "made" / "here.json"
    emit_record({"benchmark": "x", "rate": 1.5}, out)
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1 and json.loads(printed) == {"benchmark": "x", "rate": 1.5}
    assert out.read_text() == printed


def test_a_stamp_names_the_command_the_wall_time_and_the_commit(repo_root):
    started = time.perf_counter() - 2.04
    script = repo_root / "bench" / "figures" / "x.py"  # a figure's __file__
    record = stamp({"benchmark": "x"}, script, ["--out", "a b.json"], started)
    assert record["command"] == "python bench/figures/x.py --out 'a b.json'"  # as a shell reads it
    assert 2.0 <= record["wall_s"] <= 60 and record["wall_s"] == round(record["wall_s"], 1)
    try:
        head = subprocess.run(["git", "-C", str(repo_root), "rev-parse", "HEAD"],
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
    except FileNotFoundError:  # no git here
        head = ""
    assert record["source"]["commit"] == (head or None)  # None where this is no git checkout
    assert record["source"]["commit"] == source()["commit"]
    assert "wall_s" not in stamp({}, script, [])


def test_a_script_outside_the_repository_is_named_by_its_full_path(tmp_path):
    assert command_line(tmp_path / "x.py", ["--quick"]) == f"python {tmp_path / 'x.py'} --quick"


def test_a_run_compiles_into_a_cache_of_its_own_removed_after_it(monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    with fresh_numba_cache():
        cache = Path(os.environ["NUMBA_CACHE_DIR"])
        assert cache.is_dir() and not any(cache.iterdir())
    assert not cache.exists() and "NUMBA_CACHE_DIR" not in os.environ


def test_a_cache_the_caller_chose_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    with fresh_numba_cache():
        assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path)
    assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path) and tmp_path.is_dir()


def test_a_measured_record_is_stamped_and_made_inside_what_the_figure_asks(repo_root):
    script = repo_root / "bench" / "figures" / "x.py"
    seen = []

    @contextlib.contextmanager
    def within():
        seen.append("in")
        yield
        seen.append("out")

    record = measured(
        script, ["--quick"], lambda: {"benchmark": "x", "inside": list(seen)}, within()
    )
    assert record["inside"] == ["in"] and seen == ["in", "out"]
    assert record["command"] == "python bench/figures/x.py --quick" and "wall_s" in record


def test_a_failed_job_is_said_on_stderr_and_no_record_is_made(repo_root, capsys):
    script = repo_root / "bench" / "figures" / "x.py"

    def fails() -> dict:
        raise RuntimeError("the cluster job exited with status 1")

    assert measured(script, [], fails) is None
    err = capsys.readouterr().err
    assert err == "python bench/figures/x.py: error: the cluster job exited with status 1\n"
    with pytest.raises(ValueError):  # not a job's failure: a bug, raised
        measured(script, [], lambda: int("x"))


def test_a_figure_ends_with_its_line_the_machine_and_the_versions(repo_root, tmp_path, capsys):
    script = repo_root / "bench" / "figures" / "x.py"
    out = tmp_path / "x.json"
    said = {"benchmark": "x", "versions": {"numba": "given"}}  # what the figure said is kept
    assert measured_and_emitted(script, ["--out", str(out)], lambda: dict(said), out) == 0
    record = json.loads(capsys.readouterr().out)
    assert record == json.loads(out.read_text())
    assert record["versions"] == {"numba": "given"} and record["machine"]["logical_cores"] >= 1
    assert record["command"].startswith("python bench/figures/x.py --out ")


def test_a_child_past_its_bound_ends_the_figure_with_status_2(repo_root, tmp_path, capsys):
    def hangs() -> dict:
        raise subprocess.TimeoutExpired(["python", "child"], 1800)

    out = tmp_path / "x.json"
    assert measured_and_emitted(repo_root / "bench" / "figures" / "x.py", [], hangs, out) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()
    assert captured.err.startswith("python bench/figures/x.py: error: Command ")
