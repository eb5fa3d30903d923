"""``bench/figures/adam_table1.py``: its runs, its JSON line and its markdown, on a small slice of
MNIST.

Two seeds of two modes, 1,000 training examples, one epoch: every run is a real ``hogwild
train`` (synchronous with ``--sync``, one worker) or ``hogwild cluster`` (two replicas through a
parameter server). Checks: one JSON line, the same as the ``--out`` file; four runs, interleaved
by seed; each run's final accuracy is the last epoch of its metrics file; the summary's mean and
range are those of the runs; the asynchronous mode's paired comparison is that of its runs with
the synchronous ones of the same seed; the markdown has a row per run, the comparison and the
notes at the end; then resumed from its log with a third seed of one mode: only that run
trains, the logged ones are taken as they were. Not its accuracy: that is what the committed
table is for. (``async`` is ``hogwild train`` without ``--sync``, through the same code of the
script as ``sync``, and ``cluster4`` differs from ``cluster2`` only in the replica count it
passes: neither is run here.)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from bench.support.paper_job import PAPER_JOB  # Adam's model on the old schedule: learns fast
from tests.bench_runs import run_bench, small_mnist

SCRIPT = "bench/figures/adam_table1.py"


@pytest.mark.slow
def test_two_seeds_of_each_mode_make_the_table(tmp_path, mnist_dir, tmp_path_factory, repo_root):
    data = small_mnist(mnist_dir, tmp_path_factory)  # what a smoke run needs of MNIST
    out, page, notes = tmp_path / "table1.json", tmp_path / "table1.md", tmp_path / "notes.md"
    log = tmp_path / "runs.jsonl"
    notes.write_text("## What the runs show\n\nNotes of the person who ran it.\n")
    command = [sys.executable, str(repo_root / SCRIPT), "--data", str(data)]
    command += ["--metrics-dir", str(tmp_path / "runs"), "--out", str(out)]
    command += ["--markdown", str(page), "--notes", str(notes), "--log", str(log)]
    extra = ["--train.subset=1000", "--train.epochs=1", "--train.workers=2", *PAPER_JOB]
    first = [*command, "--seeds", "1", "2", "--modes", "sync", "cluster2", *extra]
    record = run_bench(first, out, timeout=300, cwd=repo_root)

    assert record["benchmark"] == "table1"
    assert record["overrides"] == extra
    runs = record["results"]
    assert [(r["mode"], r["seed"]) for r in runs] == [
        ("sync", 1),
        ("cluster2", 1),
        ("sync", 2),
        ("cluster2", 2),
    ]
    for run in runs:
        assert f"--train.seed={run['seed']}" in run["command"]
        assert ("--sync" in run["command"].split()) == (run["mode"] == "sync")
        cluster = run["mode"] == "cluster2"
        assert run["command"].startswith("hogwild cluster " if cluster else "hogwild train ")
        assert ("--cluster.replicas=2" in run["command"].split()) == cluster
        epochs = [json.loads(line) for line in open(run["metrics"], encoding="utf-8")]
        last = [e for e in epochs if e.get("event") == "epoch"][-1]
        assert run["epochs"] == 1 and run["per_epoch"] == [last["test_accuracy"]]
        assert 0.5 < run["test_accuracy"] <= 1.0  # 1,000 examples learn something
        assert run["wall_s"] > 0
    for mode in ("sync", "cluster2"):
        values = [r["test_accuracy"] for r in runs if r["mode"] == mode]
        summary = record["summary"][mode]
        assert summary["mean"] == pytest.approx(statistics.fmean(values))
        assert (summary["min"], summary["max"]) == (min(values), max(values))

    assert set(record["paired"]) == {"cluster2"}
    mine = {r["seed"]: r["test_accuracy"] for r in runs if r["mode"] == "cluster2"}
    sync = {r["seed"]: r["test_accuracy"] for r in runs if r["mode"] == "sync"}
    compared = record["paired"]["cluster2"]
    assert compared["seeds"] == [1, 2]
    assert compared["mean_difference"] == pytest.approx(
        statistics.fmean(mine[s] - sync[s] for s in (1, 2))
    )

    text = page.read_text()
    assert text.count("| sync | ") == 3  # summary, 2 runs
    assert text.count("| cluster2 | ") == 4  # summary, comparison, 2 runs
    assert "| async | " not in text
    assert "Goodfellow" in text and "99.63 %" in text
    assert text.rstrip().endswith("Notes of the person who ran it.")

    # Resumed from the log: a third seed of sync trains only what the log lacks (sync seed 3);
    # seeds 1 and 2 are the logged runs, their metrics untouched, and the table pairs them all.
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["mode"], r["seed"]) for r in logged] == [(r["mode"], r["seed"]) for r in runs]
    for r in logged:
        assert r["commit"] == record["source"]["commit"] and r["overrides"] == extra
        assert r["data"] == str(data)
        # other settings than the bundled job's: the file's name carries their digest
        assert Path(r["metrics"]).name.startswith(f"{r['mode']}_seed{r['seed']}_")
    untouched = {r["metrics"]: open(r["metrics"], "rb").read() for r in runs}
    more = [*command, "--seeds", "1", "2", "3", "--modes", "sync", *extra]
    again = run_bench(more, out, timeout=300, cwd=repo_root)
    assert [(r["mode"], r["seed"]) for r in again["results"]] == [("sync", s) for s in (1, 2, 3)]
    assert again["results"][:2] == [r for r in logged if r["mode"] == "sync"]
    assert {m: open(m, "rb").read() for m in untouched} == untouched
    assert len(log.read_text().splitlines()) == 5  # the new run only, appended
    assert again["summary"]["sync"]["runs"] == 3
