"""Training through each parameter store: per-node copies on a two-node plan, the one shared copy,
copies per worker (the default) with deltas or with activation and error vectors.

This machine has one node, so ``$HOGWILD_SYSFS`` points some jobs at a fake sysfs tree that puts
each of two real CPUs on a node of its own: the workers are pinned to real CPUs, the arena holds
a copy of the parameters per node plus the home copy, and each node's worker exchanges progress
with the home copy on its communication thread while it trains. Every job must learn, and the
checkpoint (the home copy after the epoch-end merge) must score what the workers measured.
"""

from __future__ import annotations

import os

import pytest

import hogwild
from bench.support.paper_job import PAPER_OVERRIDES  # Adam's model on the old schedule: learns fast
from hogwild.data.mnist import load_mnist
from hogwild.training.metrics import read_metrics
from hogwild.training.placement import SYSFS_ENV
from tests.cli_in_process import hogwild_cli
from tests.fake_sysfs import split_this_machine

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to split into two nodes"
)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    cpus = sorted(os.sched_getaffinity(0))[:2]
    return split_this_machine(tmp_path_factory.mktemp("sysfs"), cpus)


@pytest.fixture(scope="module")
def mnist(mnist_dir):
    return load_mnist(mnist_dir)


def test_replicated_job_learns_and_its_checkpoint_is_the_merged_model(
    tmp_path, two_nodes, mnist, monkeypatch
):
    monkeypatch.setenv(SYSFS_ENV, str(two_nodes))
    result = hogwild.train(
        data=mnist,
        workers=2,
        epochs=2,
        subset=5000,
        evaluate_every=0,  # the final figures only
        checkpoint_dir=tmp_path / "ckpt",
        metrics=tmp_path / "metrics.jsonl",
        progress=False,
        overrides={
            **PAPER_OVERRIDES,
            "train.replicas": "node",
            "train.n_push": 32,
            "train.n_fetch": 32,
        },
    )
    assert result.metrics["test_accuracy"] >= 0.90
    start = next(r for r in read_metrics(tmp_path / "metrics.jsonl") if r["event"] == "start")
    assert start["parameters"]["store"] == "replicate" and start["parameters"]["per"] == "node"
    assert start["parameters"]["copies"] == 2 and start["parameters"]["nodes"] == [0, 1]
    evaluation = hogwild.evaluate(tmp_path / "ckpt", data=mnist)
    assert evaluation["test_accuracy"] == pytest.approx(result.metrics["test_accuracy"], abs=1e-4)


def test_shared_store_on_two_nodes_keeps_one_copy(two_nodes, mnist, monkeypatch, tmp_path):
    monkeypatch.setenv(SYSFS_ENV, str(two_nodes))
    result = hogwild.train(
        data=mnist,
        workers=2,
        epochs=1,
        subset=2000,
        metrics=tmp_path / "metrics.jsonl",
        progress=False,
        overrides={"train.parameters": "shared"},
    )
    start = next(r for r in read_metrics(tmp_path / "metrics.jsonl") if r["event"] == "start")
    assert start["parameters"] == {
        "store": "shared",
        "per": "job",
        "copies": 1,
        "nodes": [0, 1],
        "placed_by_libnuma": start["parameters"]["placed_by_libnuma"],
    }
    assert result.history[0]["examples"] == 2000


@pytest.mark.parametrize("fc_push", ["deltas", "vectors"])
def test_the_default_store_gives_each_worker_a_copy(mnist, tmp_path, monkeypatch, fc_push):
    monkeypatch.delenv(SYSFS_ENV, raising=False)
    result = hogwild.train(
        data=mnist,
        workers=2,
        epochs=1,
        subset=3000,
        metrics=tmp_path / "metrics.jsonl",
        progress=False,
        overrides={**PAPER_OVERRIDES, "train.fc_push": fc_push},
    )
    start = next(r for r in read_metrics(tmp_path / "metrics.jsonl") if r["event"] == "start")
    assert start["parameters"]["store"] == "replicate"
    assert start["parameters"]["per"] == "worker" and start["parameters"]["copies"] == 2
    assert start["parameters"]["fc_push"] == fc_push
    assert result.history[0]["examples"] == 3000
    assert result.metrics["store_wait_s"] >= 0.0
    assert result.metrics["test_accuracy"] >= 0.80


def test_info_prints_the_plan_for_the_configured_placement(two_nodes, monkeypatch, capsys):
    """``hogwild info`` starts no process: it runs through the command line's entry in this
    process (:mod:`tests.cli_in_process`), the fake sysfs in its environment."""
    monkeypatch.setenv(SYSFS_ENV, str(two_nodes))
    code, out, err = hogwild_cli(capsys, "info", "--train.replicas=node")
    assert code == 0, err
    assert "NUMA nodes: 2" in out
    assert "worker 1: CPU" in out and "(node 1," in out
    assert "replicated, one copy per node (0,1)" in out
    assert "Parameter store 'replicate': parameters: a copy per NUMA node" in out
    code, _, err = hogwild_cli(capsys, "info", "--train.parameters=mirror")
    assert code != 0 and "train.parameters must be a parameter store, one of" in err
