"""The suite profile (bench/support/suite_profile.py): each test's record, and the report."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from bench.support import suite_profile


def test_a_test_is_recorded_with_its_wall_and_its_processs_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv(suite_profile.VARIABLE, str(tmp_path))
    monkeypatch.setattr(suite_profile, "_out", None)
    monkeypatch.setattr(suite_profile, "_start", lambda: _open(tmp_path))
    for name, work in (("sleeps", lambda: time.sleep(0.2)), ("spins", _spin)):
        protocol = suite_profile.pytest_runtest_protocol(SimpleNamespace(nodeid=name), None)
        next(protocol)
        work()
        for _ in protocol:  # pytest resumes a hookwrapper once the test ran
            pass
    suite_profile._out.close()
    (path,) = tmp_path.glob("tests.*.jsonl")
    sleeps, spins = (json.loads(line) for line in path.read_text().splitlines())
    assert (sleeps["id"], spins["id"]) == ("sleeps", "spins")
    assert sleeps["t1"] - sleeps["t0"] >= 0.2 and sleeps["self"] < 0.2
    assert spins["self"] > 0.05 and spins["children"] == 0.0


def _open(folder):
    suite_profile._out = (folder / "tests.1.jsonl").open("a")


def _spin() -> None:
    began = time.process_time()
    while time.process_time() - began < 0.1:
        pass


def test_the_report_sums_the_tests_and_counts_the_idle_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(suite_profile.os, "cpu_count", lambda: 2)
    rows = [
        {"id": "tests/a.py::one", "t0": 100.0, "t1": 104.0, "self": 1.0, "children": 2.0},
        {"id": "tests/a.py::two", "t0": 104.0, "t1": 105.0, "self": 0.5, "children": 0.0},
        {"id": "tests/b.py::three", "t0": 100.0, "t1": 105.0, "self": 0.0, "children": 0.5},
    ]
    (tmp_path / "tests.1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # /proc/stat's cpu line: user nice system idle iowait irq softirq steal; a quarter idle
    stat = [f"{100.0 + t} cpu {100 * t} 0 {50 * t} {50 * t} 0 0 0 0 0 0\n" for t in range(5)]
    (tmp_path / "stat.1.log").write_text("".join(stat))
    report = suite_profile.report(tmp_path)
    first = report.splitlines()[0]
    assert first.startswith("3 tests over 5 s; their walls sum to 10 s, their CPU to 4 CPU-s")
    # a quarter of 2 cores over the 4 s sampled
    assert first.endswith("idle core-seconds within the span: 2")
    assert "     3.5      5.0     2  tests/a.py" in report
