"""``bench/figures/adam_fig11_replicas.py --quick``: the shape and the sanity of its JSON line and
plot, not speed.

The quick run trains a tiny budget through ``hogwild cluster`` (2 replicas, one server; the
quick run's default adds 1 replica, running the same code), as independent ``hogwild train``
processes, races ours and the PyTorch RPC peer for a few seconds (the Ray peer's start-up alone
would take most of the time budget; it is run by the full benchmark), and draws Fig. 11. Its
race is the row of 2 replicas through the server (the same one-epoch job, launched once).
Checks: every field is present, rates are positive, accuracies lie in [0, 1], the target ratios
are the rows' quotients (at the job's cadence and at an extra one, ``--cadences``), and a racer
that missed the target reports null with its best accuracy.
"""

from __future__ import annotations

import sys

import pytest

from tests.bench_runs import run_bench, small_mnist

SCRIPT = "bench/figures/adam_fig11_replicas.py"
ROW_FIELDS = {"replicas", "ps", "examples_per_s", "examples_per_s_range", "test_accuracy"}
PEER_FIELDS = {"examples_per_s", "seconds_to_target", "test_accuracy"}


def _sane_race(entry: dict) -> None:
    assert PEER_FIELDS <= set(entry)
    assert entry["examples_per_s"] > 0
    assert 0.0 <= entry["test_accuracy"] <= 1.0
    seconds = entry["seconds_to_target"]
    assert seconds is None or seconds > 0


@pytest.mark.slow
def test_quick_run_prints_every_field(tmp_path, mnist_dir, tmp_path_factory, repo_root):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    data = small_mnist(mnist_dir, tmp_path_factory)  # what a smoke run needs of MNIST
    out, plot = tmp_path / "replicas.json", tmp_path / "fig11.png"
    command = [sys.executable, str(repo_root / SCRIPT), "--quick"]
    # two replicas only: the ratios need no other row, and a row of one replica runs the same
    # code (a job through the server, independent trainers) as a row of two
    command += ["--replicas", "2", "--peers", "torch_rpc", "--data", str(data)]
    command += ["--cadences", "256"]
    command += ["--out", str(out), "--plot", str(plot)]
    record = run_bench(command, out, timeout=240, cwd=repo_root)
    assert plot.stat().st_size > 1000

    assert record["benchmark"] == "replicas"
    assert record["command"].startswith(f"python {SCRIPT} --quick")
    assert {"cpu_model", "logical_cores", "memory_gib"} <= set(record["machine"])
    assert record["versions"]["torch"] and record["versions"]["python"]

    rows = record["results"]
    assert {(row["replicas"], row["ps"], row.get("n_push")) for row in rows} == {
        (2, True, None), (2, False, None), (2, True, 256),
    }  # fmt: skip
    assert record["settings"]["replicas"] == [2]
    for row in rows:
        assert ROW_FIELDS <= set(row)
        assert row["examples_per_s"] > 0
        low, high = row["examples_per_s_range"]
        assert low <= row["examples_per_s"] <= high
        assert 0.0 <= row["test_accuracy"] <= 1.0
    rate = {(row["replicas"], row["ps"], row.get("n_push")): row["examples_per_s"] for row in rows}
    ratio = record["targets"]["ps_2_vs_independent_2"]
    assert ratio == pytest.approx(rate[(2, True, None)] / rate[(2, False, None)])
    by_cadence = record["targets"]["by_cadence"]
    assert by_cadence == {"256": pytest.approx(rate[(2, True, 256)] / rate[(2, False, None)])}
    assert record["targets"]["minimum"] == 0.85
    assert record["targets"]["met"] == (ratio >= 0.85)

    assert record["target"] == 0.3  # --quick: every racer passes it at its first evaluation
    assert set(record["peers"]) == {"torch_rpc"}
    _sane_race(record["peers"]["torch_rpc"])
    _sane_race(record["ours_race"])
    _sane_race(record["ours_race_evaluating_beside"])
    assert record["seconds_to_target"] == record["ours_race"]["seconds_to_target"]
    assert record["settings"]["race_repeats"] == 1  # --quick
    # --quick's race is the row of 2 replicas through the server: one launch, not two
    assert record["settings"]["race_is_a_row"] is True
    assert rate[(2, True, None)] == record["ours_race"]["examples_per_s"]
    for entry in (record["ours_race"], record["peers"]["torch_rpc"]):
        assert entry["runs_seconds_to_target"] == [entry["seconds_to_target"]]
    race = record["race_targets"]
    assert race["minimum"] == 3.0
    ours, theirs = record["seconds_to_target"], record["peers"]["torch_rpc"]["seconds_to_target"]
    ratio = race["peers_over_ours"]["torch_rpc"]
    assert ratio == (pytest.approx(theirs / ours) if ours and theirs else None)
