"""Where the test suite's time goes: each test's wall and CPU, and the machine's idle cores.

A pytest plugin, loaded only when asked for, and its report::

    HOGWILD_SUITE_PROFILE=/tmp/suite-profile python3 -m pytest -q -n 2 tests \
        -p bench.support.suite_profile
    python3 -m bench.support.suite_profile /tmp/suite-profile

Each pytest process (the xdist workers, or the serial session) appends one JSON line per test to
``<dir>/tests.<pid>.jsonl``: its node id, start and end (``time.time()``), the CPU-seconds of the
test's own process (``self``) and of the children it reaped during the test (``children``: the
processes it started and waited for, with their own reaped children). What no test reaps is not
counted to any test: the kernel warm-up, daemons a fixture keeps for a whole session (a role
server's parameter servers are counted when the role server is reaped), Ray's processes, and a
forkserver's children until the forkserver is reaped, in whichever later test that happens. The
collector also samples ``/proc/stat`` once a second into ``<dir>/stat.<pid>.log`` (one sampler
per process, the first test's), from which the report takes the machine's idle core-seconds.

The report prints the suite's span and the sum of its tests' walls (with two workers the span is
about half the sum plus collection: both workers always hold a test), the idle core-seconds
within the span, and the tests and modules that cost most CPU, wall, and wall beyond their CPU.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

import pytest

VARIABLE = "HOGWILD_SUITE_PROFILE"
SAMPLE_EVERY_S = 1.0
_out = None


def _folder() -> Path:
    folder = Path(os.environ.get(VARIABLE) or "suite-profile")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime


def _sample(path: Path) -> None:
    """``time.time()`` and the first line of ``/proc/stat``, once a second, until the process
    ends (a daemon thread); a second without a free fd is skipped."""
    with path.open("a") as log:
        while True:
            try:
                with open("/proc/stat") as stat:
                    log.write(f"{time.time()} {stat.readline()}")
            except OSError:  # no fd left: a test that exhausts them on purpose; next second
                pass
            log.flush()
            time.sleep(SAMPLE_EVERY_S)


def _start() -> None:
    global _out
    folder = _folder()
    _out = (folder / f"tests.{os.getpid()}.jsonl").open("a")
    if os.path.exists("/proc/stat"):
        path = folder / f"stat.{os.getpid()}.log"
        threading.Thread(target=_sample, args=(path,), name="suite-profile", daemon=True).start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Wraps each test's whole protocol (setup, call, teardown)."""
    if _out is None:
        _start()
    began, (own, reaped) = time.time(), _cpu()
    yield
    ended, (own_after, reaped_after) = time.time(), _cpu()
    record = {"id": item.nodeid, "t0": began, "t1": ended, "self": own_after - own,
              "children": reaped_after - reaped, "pid": os.getpid()}  # fmt: skip
    _out.write(json.dumps(record) + "\n")
    _out.flush()


def _idle(folder: Path, start: float, end: float) -> float:
    """Idle core-seconds of the machine within ``[start, end]``, from the samplers' logs (the
    longest one: every sampler reads the same machine)."""
    logs = sorted(folder.glob("stat.*.log"), key=lambda p: p.stat().st_size)
    if not logs:
        return float("nan")
    samples = []
    for line in logs[-1].read_text().splitlines():
        parts = line.split()
        values = [int(v) for v in parts[2:10]]
        samples.append((float(parts[0]), values[3] + values[4], sum(values)))
    idle = 0.0
    for (t0, idle0, total0), (t1, idle1, total1) in zip(samples, samples[1:], strict=False):
        if t0 >= start and t1 <= end and total1 > total0:
            idle += (idle1 - idle0) / (total1 - total0) * (os.cpu_count() or 1) * (t1 - t0)
    return idle


def report(folder: Path, top: int = 25) -> str:
    """The report of a profiled run's ``folder``."""
    rows = [json.loads(line) for path in sorted(folder.glob("tests.*.jsonl"))
            for line in path.read_text().splitlines()]  # fmt: skip
    if not rows:
        raise SystemExit(f"{folder}: no tests.*.jsonl (was the run made with -p {__name__}?)")
    for row in rows:
        row["cpu"], row["wall"] = row["self"] + row["children"], row["t1"] - row["t0"]
    start, end = min(r["t0"] for r in rows), max(r["t1"] for r in rows)
    lines = [
        f"{len(rows)} tests over {end - start:.0f} s; their walls sum to "
        f"{sum(r['wall'] for r in rows):.0f} s, their CPU to {sum(r['cpu'] for r in rows):.0f} "
        f"CPU-s ({sum(r['self'] for r in rows):.0f} in the test processes); idle core-seconds "
        f"within the span: {_idle(folder, start, end):.0f}",
    ]
    modules: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for row in rows:
        entry = modules[row["id"].split("::")[0]]
        entry[0], entry[1], entry[2] = entry[0] + row["cpu"], entry[1] + row["wall"], entry[2] + 1
    lines.append("\nmodules by CPU (CPU-s, wall s, tests):")
    for name, (cpu, wall, count) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{cpu:8.1f} {wall:8.1f} {count:5d}  {name}")
    orders = (
        ("tests by CPU", lambda r: r["cpu"]),
        ("tests by wall", lambda r: r["wall"]),
        ("tests by wall beyond their CPU", lambda r: r["wall"] - r["cpu"]),
    )
    for title, key in orders:
        lines.append(f"\n{title} (CPU-s, wall s):")
        for row in sorted(rows, key=key, reverse=True)[:top]:
            lines.append(f"{row['cpu']:8.1f} {row['wall']:8.1f}  {row['id']}")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: python3 -m {__spec__.name} PROFILE_DIR")
    print(report(Path(sys.argv[1])))
