"""``bench/figures/adam_fig10_partitions.py --quick``: the shape and the sanity of its JSON line
and plot, not speed.

The quick run trains the smallest size of the MNIST model (a larger size runs the same code) with 1
and 2 partitions and the control (two independent processes), the tiny wide fully connected model
with 2 partitions and with 2 replicas through one parameter server, in two races (the A B B A
order's first two, each at its own seed); its sweep of examples in flight
is 1, the size rows' own, whose run it takes from the first size's row, and a size's 1-partition
row is its control's first run (the same command). Checks: every field is present, rates are
positive, the connections are the plan's and grow with the size, the bytes crossing are the plan's,
the ratios are the rows' quotients, the wide runs report their learning curves (three short epochs
each, evaluated after each) and the seconds to their first point at the common accuracy, and every
row and sweep entry says whether its runs learned (reached the stated accuracy floor).
"""

from __future__ import annotations

import sys

import pytest

from bench.support.grown_model import grown_plan
from hogwild.config import load_config
from hogwild.model.network import model_network
from hogwild.partition.plan import plan_partitions
from tests.bench_runs import run_bench, small_mnist

SCRIPT = "bench/figures/adam_fig10_partitions.py"
ROW_FIELDS = {"connections", "partitions", "examples_per_s", "ratio_to_control",
              "bytes_per_example"}  # fmt: skip


@pytest.mark.slow
def test_quick_run_prints_every_field(tmp_path, mnist_dir, tmp_path_factory, repo_root):
    pytest.importorskip("matplotlib")
    data = small_mnist(mnist_dir, tmp_path_factory)  # what a smoke run needs of MNIST
    out, plot = tmp_path / "fig10.json", tmp_path / "fig10.png"
    command = [sys.executable, str(repo_root / SCRIPT), "--quick", "--data", str(data)]
    command += ["--wide-repeats", "2", "--wide-seed", "5"]
    command += ["--out", str(out), "--plot", str(plot)]
    record = run_bench(command, out, timeout=600, cwd=repo_root)
    assert plot.stat().st_size > 1000
    assert record["benchmark"] == "partitions"
    assert record["command"].startswith(f"python {SCRIPT} --quick")

    rows = record["results"]
    assert {(r["factor"], r["partitions"]) for r in rows} == {(1, 1), (1, 2)}
    for row in rows:
        assert ROW_FIELDS <= set(row)
        assert row["examples_per_s"] > 0
        assert row["lr"] == 0.003  # one in flight: the paper job's rate, partitioned or not
        if row["partitions"] == 1:  # --quick: the control's first run, measured beside its second
            assert row["ratio_to_control"] is None
        else:
            assert row["ratio_to_control"] == pytest.approx(
                row["examples_per_s"] / row["control_examples_per_s"]
            )
        floor = record["learned_floor"]
        assert row["learned"] == (min(row["test_accuracy"], row["control_test_accuracy"]) >= floor)
    # --quick: a size's 1-partition run is the first of its control's two, launched once
    assert record["settings"]["one_partition_is_a_control_run"] is True
    default = plan_partitions(model_network(load_config().model), 2)
    two = {r["factor"]: r for r in rows if r["partitions"] == 2}
    assert two[1]["connections"] == default.network.connections
    assert two[1]["bytes_per_example"] == default.bytes_per_example
    # the next size, as a full run's row would have it: twice the feature maps, more connections
    maps = {"model.layers.0.maps": 20, "model.layers.3.maps": 40}
    wider = plan_partitions(model_network(load_config(None, maps).model), 2)
    assert grown_plan(2, 2) == (wider.network.connections, wider.bytes_per_example)
    assert wider.network.connections > default.network.connections
    assert set(record["largest_efficient"]) == {"1", "2"}
    assert record["targets"]["target"] == 0.85
    assert record["learned_floor"] == record["settings"]["learned_floor"] == 0.5
    assert record["targets"]["not_learned"] == []  # no row of the quick run reaches 100 M

    races = record["wide"]["races"]
    assert record["wide"]["repeats"] == record["settings"]["wide_repeats"] == len(races) == 2
    # A B B A: the partitions first, then the replicas; each race at its own seed, both its runs
    assert [r["first"] for r in races] == ["two_partitions", "two_replicas_through_ps"]
    assert [r["seed"] for r in races] == [5, 6]
    for race in races:
        for run in race["runs"].values():
            assert run["trained_as"]["seed"] == race["seed"]
    for race in races:
        partitions = race["runs"]["two_partitions"]
        replicas = race["runs"]["two_replicas_through_ps"]
        default = load_config(None).train.in_flight
        assert partitions["in_flight"] == record["settings"]["wide_in_flight"] == default
        assert partitions["trained_as"]["rule"] == "sgd"
        assert not {"server_rule", "framework"} & set(partitions["trained_as"])  # no servers
        assert partitions["trained_as"]["lr"] == partitions["lr"]
        # the replicas' servers apply the pushed deltas by their own rule, as the job resolves it
        assert replicas["trained_as"]["framework"] == "downpour"
        assert replicas["trained_as"]["server_rule"] in ("sgd", "adagrad")
        assert replicas["trained_as"]["n_push"] >= 1 and replicas["trained_as"]["n_fetch"] >= 1
    ratios = record["wide"]["replicas_over_partitions_seconds"]
    assert ratios == [
        r["runs"]["two_replicas_through_ps"]["seconds_to_common_accuracy"]
        / r["runs"]["two_partitions"]["seconds_to_common_accuracy"]
        for r in races
    ]
    assert sum(record["wide"]["tally"].values()) == 2
    wide = races[0]
    assert wide["common_accuracy"] == min(max(r["test_accuracy"]) for r in wide["runs"].values())
    for run in wide["runs"].values():  # each run evaluated after each of its 3 short epochs
        curve = run["curve"]
        assert run["examples_per_s"] > 0 and len(curve) == record["wide"]["epochs"] == 3
        assert [p["examples"] for p in curve] == [100, 200, 300]
        assert 0 < curve[0]["train_s"] < curve[1]["train_s"] < curve[2]["train_s"]
        # charged its first point at the common accuracy, the point before it still below
        first = next(p for p in curve if p["test_accuracy"] >= wide["common_accuracy"])
        assert run["seconds_to_common_accuracy"] == first["train_s"]
        earlier = [p["train_s"] for p in curve if p["train_s"] < first["train_s"]]
        assert run["below_common_accuracy_at_s"] == (earlier[-1] if earlier else 0.0)
    verdicts = [r["partitions_faster"] for r in races]  # of two races: both must agree
    expected = verdicts[0] if verdicts[0] == verdicts[1] and verdicts[0] is not None else None
    assert record["wide"]["partitions_faster"] == expected
    assert [r["in_flight"] for r in record["in_flight_sweep"]] == [1]
    # the sweep's run at the rows' in flight on the first size is that row's run, not a new one
    assert record["in_flight_sweep"][0]["examples_per_s"] == two[1]["examples_per_s"]
    assert all(r["examples_per_s"] > 0 for r in record["in_flight_sweep"])
    assert all(r["learned"] == (r["test_accuracy"] >= 0.5) for r in record["in_flight_sweep"])
