"""``bench/figures/adam_fig9_ps.py`` (Adam Fig. 9): a tiny run end to end, its JSON line and its
plot.

The tiny run (0.1 s per measurement, one round, no peers) checks the shape and the sanity of the
record, not the speed: every API and transport has a row for every server core count, the pulls
are measured both ways, every loopback row carries the server's CPU time per request and how it
received (the default decides by its cores), and the ratios are computed from the rows they
name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tiny_run_prints_every_row_and_draws_fig9(tmp_path):
    pytest.importorskip("matplotlib")
    out, plot = tmp_path / "ps.json", tmp_path / "fig9.png"
    command = [sys.executable, "bench/figures/adam_fig9_ps.py", "--seconds", "0.1"]
    command += ["--repeats", "1", "--no-peers", "--out", str(out), "--plot", str(plot)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    record = json.loads(lines[0])
    assert out.read_text().strip() == lines[0]
    assert plot.stat().st_size > 0

    cores = len(os.sched_getaffinity(0))
    rows = record["results"]
    for api in ("deltas", "activations"):
        for transport in ("inproc", "ipc", "tcp"):
            found = [r for r in rows if (r["api"], r["transport"]) == (api, transport)]
            found = [r for r in found if "recv" not in r and "pushes" not in r]
            assert sorted(r["server_cores"] for r in found) == list(range(1, cores + 1))
            assert all(r["updates_per_s"] > 0 for r in found)
    pulls = {r["pulls"]: r for r in rows if r["api"] == "pull"}
    assert set(pulls) == {"direct", "queued"}
    for row in pulls.values():
        assert row["pulls_per_s"] > 0 and row["server_cores"] == cores
        assert row["updates_per_s"] == pytest.approx(row["pulls_per_s"] * 262_144, rel=0.05)
    queued = [r for r in rows if r.get("pushes") == "queued"]
    assert len(queued) == 1 and queued[0]["api"] == "deltas" and queued[0]["pushes_per_s"] > 0
    for row in (r for r in rows if r["transport"] != "inproc"):
        assert row["clients"] == 2 and 0 < row["server_cpu_ms"] < 1_000
    # each server says how it received: "auto" takes pool blocks on two cores or more
    for row in (r for r in rows if r["transport"] != "inproc" and "pulls" not in r):
        if row.get("recv") == "inplace":
            assert row["received"] == "inplace" and row["server_cores"] == cores
        elif "pushes" not in row:
            assert row["received"] == ("pool" if row["server_cores"] >= 2 else "inplace")

    limits, targets = record["limits"], record["targets"]
    assert limits["triad_gb_s"] > 0 and limits["sgemm_gflops"] > 0
    assert record["seconds"] == 0.1 and record["sgemm_s"] == 0.1  # a tiny run's, said so
    assert limits["pyzmq_1mb_gb_s"] > 0 and limits["pyzmq_1mb_tcp_server_cpu_ms"] > 0
    assert limits["pyzmq_1mb_receive_only_gb_s"] > 0
    direct = next(
        r
        for r in rows
        if (r["api"], r["transport"], r["server_cores"]) == ("deltas", "tcp", cores)
        and "recv" not in r
        and "pushes" not in r
    )
    assert targets["push_1mb_direct_vs_queued"] == pytest.approx(
        direct["pushes_per_s"] / queued[0]["pushes_per_s"], rel=1e-2
    )
    assert targets["push_1mb_tcp_vs_pyzmq"] == pytest.approx(
        direct["pushes_per_s"] * 2**20 / (limits["pyzmq_1mb_gb_s"] * 1e9), rel=1e-2
    )
    assert targets["pull_1mb_direct_vs_queued"] == pytest.approx(
        pulls["direct"]["pulls_per_s"] / pulls["queued"]["pulls_per_s"], rel=1e-2
    )
    assert record["peers"] == {} and "torch_rpc" not in targets
    assert record["servers_started_warm"] is True  # forked with their kernels loaded
