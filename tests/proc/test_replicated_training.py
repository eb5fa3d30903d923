"""Training with the shared parameters replicated per NUMA node, on a two-node plan.

This machine has one node, so ``$HOGWILD_SYSFS`` points the job at a fake sysfs tree that puts
each of two real CPUs on a node of its own: the workers are pinned to real CPUs, the arena holds
a copy of the parameters per node plus the home copy, and each node's worker exchanges progress
with the home copy while it trains. The job must learn, and the checkpoint (the home copy after
the epoch-end merge) must score what the workers measured on their own copies.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import hogwild
from hogwild.data.mnist import load_mnist
from hogwild.train.metrics import read_metrics
from hogwild.train.placement import SYSFS_ENV
from tests.fake_sysfs import split_this_machine

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to split into two nodes"
)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    cpus = sorted(os.sched_getaffinity(0))[:2]
    return split_this_machine(tmp_path_factory.mktemp("sysfs"), cpus)


@pytest.fixture(scope="module")
def mnist(shared_mnist_dir):
    return load_mnist(shared_mnist_dir)


def test_replicated_job_learns_and_its_checkpoint_is_the_merged_model(
    tmp_path, two_nodes, mnist, monkeypatch
):
    monkeypatch.setenv(SYSFS_ENV, str(two_nodes))
    result = hogwild.train(
        data=mnist,
        workers=2,
        epochs=2,
        subset=5000,
        checkpoint_dir=tmp_path / "ckpt",
        metrics=tmp_path / "metrics.jsonl",
        progress=False,
        overrides={"train.parameters": "replicate", "train.exchange_every": 32},
    )
    assert result.metrics["test_accuracy"] >= 0.90
    start = next(r for r in read_metrics(tmp_path / "metrics.jsonl") if r["event"] == "start")
    assert start["parameters"]["mode"] == "replicate"
    assert start["parameters"]["copies"] == 2 and start["parameters"]["nodes"] == [0, 1]
    evaluation = hogwild.evaluate(tmp_path / "ckpt", data=mnist)
    assert evaluation["test_accuracy"] == pytest.approx(result.metrics["test_accuracy"], abs=1e-4)


def test_interleaved_job_on_two_nodes_keeps_one_copy(two_nodes, mnist, monkeypatch, tmp_path):
    monkeypatch.setenv(SYSFS_ENV, str(two_nodes))
    result = hogwild.train(
        data=mnist,
        workers=2,
        epochs=1,
        subset=2000,
        metrics=tmp_path / "metrics.jsonl",
        progress=False,
    )
    start = next(r for r in read_metrics(tmp_path / "metrics.jsonl") if r["event"] == "start")
    assert start["parameters"] == {
        "mode": "interleave",
        "per": "node",
        "copies": 1,
        "nodes": [0, 1],
        "placed_by_libnuma": start["parameters"]["placed_by_libnuma"],
    }
    assert result.history[0]["examples"] == 2000


def test_one_copy_per_worker_on_this_machine(mnist, tmp_path, monkeypatch):
    monkeypatch.delenv(SYSFS_ENV, raising=False)
    result = hogwild.train(
        data=mnist,
        workers=2,
        epochs=1,
        subset=3000,
        metrics=tmp_path / "metrics.jsonl",
        progress=False,
        overrides={"train.parameters": "replicate", "train.replicas": "worker"},
    )
    start = next(r for r in read_metrics(tmp_path / "metrics.jsonl") if r["event"] == "start")
    assert start["parameters"]["per"] == "worker" and start["parameters"]["copies"] == 2
    assert result.history[0]["examples"] == 3000
    assert result.metrics["test_accuracy"] >= 0.85


def test_info_prints_the_plan_for_the_configured_placement(two_nodes):
    env = {**os.environ, SYSFS_ENV: str(two_nodes)}
    command = [sys.executable, "-m", "hogwild.cli", "info", "--train.parameters=replicate"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "NUMA nodes: 2" in out.stdout
    assert "worker 1: CPU" in out.stdout and "(node 1," in out.stdout
    assert "replicated, one copy per node (0,1)" in out.stdout
    bad = subprocess.run(
        [*command[:-1], "--train.parameters=mirror"], env=env, capture_output=True, text=True
    )
    assert bad.returncode != 0 and "train.parameters must be one of interleave, replicate" in (
        bad.stderr
    )
