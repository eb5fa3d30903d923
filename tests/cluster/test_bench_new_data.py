"""``bench/figures/new_data.py --quick``: the shape of its JSON line, not its accuracies.

The quick run trains the bundled job on scikit-learn's digits (1,347 training images) for one
epoch twice: ``hogwild train`` and ``hogwild cluster``, the cluster's job with a variant of its
defaults through ``--cluster-args``. Checks: one JSON line, the same as the ``--out`` file; each
job's summary accuracy is its last epoch's, in [0, 1]; the variant reaches the cluster's job
and not the single-node one; the gap is the difference in points and ``met`` says whether it is
within the target; a dataset the script does not know is refused with the list; and, without a
process, the gap's spread over several seeds (its standard deviation and Student's interval, none
where a job ended without an accuracy) and the refusal of a variant that would set what the
script sets (a second seed or epoch count would break the pairs).
"""

from __future__ import annotations

import shlex
import statistics
import subprocess
import sys

import pytest

from tests.bench_runs import run_bench

SCRIPT = "bench/figures/new_data.py"


@pytest.mark.slow
def test_quick_run_compares_the_cluster_with_the_single_node_job(tmp_path, repo_root):
    out = tmp_path / "new_data.json"
    command = [sys.executable, str(repo_root / SCRIPT), "--quick", "--epochs", "1"]
    command += ["--cluster-args=--ps.rule=sgd --train.n_push=128"]  # a variant of the defaults
    record = run_bench([*command, "--out", str(out)], out, timeout=300, cwd=repo_root)
    assert record["benchmark"] == "new_data"
    assert record["command"].startswith(f"python {SCRIPT} --quick")
    assert record["settings"]["epochs"] == 1 and record["settings"]["seeds"] == [1]
    assert record["settings"]["cluster_args"] == ["--ps.rule=sgd", "--train.n_push=128"]
    (row,) = record["results"]
    assert row["dataset"] == "digits"
    assert (row["data"]["train"], row["data"]["test"]) == (1347, 450)
    (run,) = row["runs"]
    assert run["seed"] == 1
    for kind in ("single", "cluster"):
        job = run[kind]
        assert len(job["curve"]) == 1 and job["curve"][-1] == job["test_accuracy"], job
        assert 0.0 <= job["test_accuracy"] <= 1.0
        assert row[f"{kind}_mean"] == pytest.approx(job["test_accuracy"], abs=1e-4)
        assert job["command"].startswith(f"hogwild {'cluster' if kind == 'cluster' else 'train'} ")
        written = shlex.split(job["command"])
        assert written[written.index("--data") + 1] == "TMP/digits/data"  # no dead /tmp path
        variant = " --ps.rule=sgd --train.n_push=128 " in f"{job['command']} "
        assert variant is (kind == "cluster"), job["command"]  # the cluster's jobs only
    gap = 100 * (run["single"]["test_accuracy"] - run["cluster"]["test_accuracy"])
    assert row["gap_points"] == pytest.approx(gap, abs=0.02)
    assert row["met"] is (row["gap_points"] <= record["target_gap_points"])
    assert record["met"] is row["met"]


def test_an_unknown_dataset_is_refused_with_the_list(repo_root):
    done = subprocess.run(
        [sys.executable, str(repo_root / SCRIPT), "--datasets", "digits,cifar"],
        capture_output=True, text=True, timeout=60, cwd=repo_root,
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown cifar; known: digits, mnist" in done.stderr


def test_the_gap_comes_with_its_spread_over_the_seeds():
    from bench.figures.new_data import _row

    pairs = [(0.9756, 0.9689), (0.9667, 0.9533), (0.9778, 0.9689), (0.9578, 0.9711)]
    runs = [
        {"seed": s, "single": {"test_accuracy": a}, "cluster": {"test_accuracy": b}}
        for s, (a, b) in enumerate(pairs, start=1)
    ]
    row = _row("digits", {}, runs, target=1.0)
    gaps = [100 * (a - b) for a, b in pairs]  # 0.67, 1.34, 0.89, -1.33 points
    assert row["gap_points"] == pytest.approx(statistics.fmean(gaps), abs=0.01)
    assert row["gap_sd_points"] == pytest.approx(statistics.stdev(gaps), abs=0.01)
    assert row["single_sd_points"] == pytest.approx(
        statistics.stdev(100 * a for a, _ in pairs), abs=0.01
    )
    low, high = row["gap_ci95_points"]
    # Student's t with 3 degrees of freedom: 3.182 standard errors either side
    half = 3.182 * statistics.stdev(gaps) / 2
    assert (low, high) == pytest.approx(
        (row["gap_points"] - half, row["gap_points"] + half), abs=0.02
    )
    assert row["met"] is True  # the point estimate within the target, whatever the interval

    alone = _row("digits", {}, runs[:1], target=1.0)
    assert alone["gap_sd_points"] is None and alone["gap_ci95_points"] is None
    assert alone["gap_points"] == pytest.approx(0.67, abs=0.005)

    runs[1]["cluster"]["test_accuracy"] = None  # a job that ended without a test accuracy
    failed = _row("digits", {}, runs, target=1.0)
    assert failed["cluster_mean"] is None and failed["gap_points"] is None
    assert failed["gap_ci95_points"] is None and failed["met"] is False


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("--cluster-args=--seed=3 --ps.rule=sgd", "--seed=3 is the script's to set"),
        ("--cluster-args=--ps.rule=sgd --train.epochs=2", "--train.epochs=2 is the script's"),
        ("--cluster-args=ps.rule=sgd", "expected hogwild cluster's flags"),
    ],
)
def test_cluster_args_that_would_break_the_pairs_are_refused(given, said, capsys):
    from bench.figures.new_data import parse_args

    with pytest.raises(SystemExit) as refused:
        parse_args(["--datasets", "digits", given])
    assert refused.value.code == 2
    assert said in capsys.readouterr().err
    args = parse_args(["--datasets", "digits", "--cluster-args=--ps.rule=sgd --train.n_push=32"])
    assert args.cluster_args == ["--ps.rule=sgd", "--train.n_push=32"]
