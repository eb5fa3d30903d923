"""``bench/figures/distbelief_fig4_frameworks.py --quick``: the shape of its JSON line, not its
speed or its accuracy.

The benchmark's contenders are every line of DistBelief's Fig. 4 (single-replica SGD, Downpour with
SGD and with Adagrad, Sandblaster L-BFGS, and SINGA's AllReduce, hybrid and distributed Hogwild),
each a ``hogwild cluster`` job. Every contender costs a cluster's start and stop, and
``test_frameworks.py`` trains the frameworks themselves, so the quick run here trains three, one
per path the benchmark takes (an asynchronous job, Sandblaster's L-BFGS iterations after its SGD
warm start, a synchronous job), on 500 MNIST examples for one epoch (Sandblaster: its two L-BFGS
iterations, an epoch each, on batches of 250: the full run's path on less data, the L-BFGS job
having been most of the test's CPU). Checks: one JSON line, the same as the ``--out`` file; each
contender run drew a non-empty curve of accuracies in [0, 1] against increasing seconds within the
budget and left nothing behind, and none was skipped (``hogwild cluster`` runs every contender's
topology); ``time_to_target_s`` agrees with the curve; the figure is drawn. The contender list
itself covers all five frameworks, and an unknown name is refused with the list.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.bench_runs import run_bench, small_mnist

SCRIPT = "bench/figures/distbelief_fig4_frameworks.py"
FRAMEWORKS = {"downpour", "sandblaster", "allreduce", "hybrid", "hogwild"}
RUN = {"sgd": "downpour", "sandblaster-lbfgs": "sandblaster", "hybrid-sgd": "hybrid"}
LEAK_KINDS = ("segments", "processes", "ports")


@pytest.mark.slow
def test_quick_run_draws_a_curve_for_each_contender_it_trains(
    tmp_path, mnist_dir, tmp_path_factory, repo_root
):
    data = small_mnist(mnist_dir, tmp_path_factory)  # what a smoke run needs of MNIST
    out, png = tmp_path / "frameworks.json", tmp_path / "fig4.png"
    command = [sys.executable, str(repo_root / SCRIPT), "--quick"]
    command += ["--data", str(data), "--out", str(out), "--plot", str(png)]
    command += ["--only", ",".join(RUN)]
    record = run_bench(command, out, timeout=240, cwd=repo_root)
    assert png.stat().st_size > 10_000

    assert record["benchmark"] == "frameworks"
    assert record["command"].startswith(f"python {SCRIPT} --quick")
    assert record["target"] == 0.985 and record["budget_s"] > 0
    assert {"cpu_model", "logical_cores", "memory_gib"} <= set(record["machine"])
    assert {"python", "numpy", "hogwild"} <= set(record["versions"])
    assert record["failed"] == []

    results = record["results"]
    assert {r["name"]: r["framework"] for r in results} == RUN
    pairs = {(r["framework"], r["optimizer"]) for r in results}
    assert {("downpour", "sgd"), ("sandblaster", "lbfgs"), ("hybrid", "sgd")} == pairs
    assert any(r["name"] == "sgd" and r["replicas"] == 1 for r in results)
    lbfgs = next(r for r in results if r["name"] == "sandblaster-lbfgs")
    assert "--cluster.lbfgs_batch=250" in lbfgs["command"]  # quick: mini-batches of the 500
    assert lbfgs["settings"]["cluster"]["lbfgs_iterations"] == 2
    # quick: the first 250 examples are the warm start's, SGD steps of 50
    assert lbfgs["settings"]["cluster"]["lbfgs_warm_start"] == 250
    assert lbfgs["settings"]["train"]["batch"] == 50
    group = lbfgs["sandblaster"]["0"]
    assert group["warm_steps"] == 5
    batches = lbfgs["epochs_done"] * 2 - 1  # 2 batches of 250 an epoch, but the first's
    assert group["iterations"] == batches * 2  # 2 iterations each
    # a pass per SGD step; every batch evaluated afresh, then at least a pass per iteration
    assert group["evaluations"] >= 5 + batches * 3

    assert not any(r["skipped"] for r in results) and record["skipped"] == []
    for r in results:
        assert r["error"] is None, r
        assert r["command"].startswith("python -m hogwild.cli cluster ")
        assert f"--cluster.framework={r['framework']}" in r["command"]
        assert r["settings"]["cluster"]["framework"] == r["framework"]
        assert r["curve"], r["name"]
        seconds = [point[0] for point in r["curve"]]
        assert seconds == sorted(seconds) and seconds[0] > 0, r["curve"]
        assert all(0.0 <= accuracy <= 1.0 for _, accuracy in r["curve"]), r["curve"]
        assert r["final_test_accuracy"] == r["curve"][-1][1]
        assert r["examples_per_s"] > 0 and r["epochs_done"] == len(r["curve"])
        hits = [w for w, a in r["curve"] if a >= record["target"] and w <= record["budget_s"]]
        assert r["time_to_target_s"] == (hits[0] if hits else None)
        assert r["reached_target"] is (r["time_to_target_s"] is not None)
        assert {k: r["leaked"][k] for k in LEAK_KINDS} == dict.fromkeys(LEAK_KINDS, 0), r


def test_the_contenders_are_every_line_of_fig_4_and_an_unknown_one_is_refused(repo_root):
    from bench.figures.distbelief_fig4_frameworks import CONTENDERS

    pairs = {(c.framework, c.optimizer) for c in CONTENDERS}
    assert {framework for framework, _ in pairs} == FRAMEWORKS
    assert {("downpour", "sgd"), ("downpour", "adagrad"), ("sandblaster", "lbfgs")} <= pairs
    command = [sys.executable, str(repo_root / SCRIPT), "--only", "sgd,nope"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=repo_root)
    assert done.returncode == 2 and done.stdout == ""
    assert "--only: unknown contender(s) nope" in done.stderr
    assert all(c.name in done.stderr for c in CONTENDERS)  # the known ones, listed
