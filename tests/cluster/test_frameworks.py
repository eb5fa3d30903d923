"""``hogwild cluster`` with each framework of the topology (SINGA section 5.2), end to end.

* ``--cluster.framework=sandblaster``: real parameter servers (two, the model's shards spread
  over both), and one worker-group role holding the L-BFGS coordinator and two replica threads,
  trains a small network on 1,000 MNIST examples to a stated test accuracy.
* ``--cluster.framework=allreduce``: synchronous SGD through the same worker group, a server
  per worker, trains the same network to a stated test accuracy.
* The frameworks not built yet (``hogwild``, ``hybrid``) resolve, and ``hogwild cluster``
  refuses them before any role starts, naming what is missing.

The model is a 784-64-10 perceptron (50,816 connections) so that the driver's per-epoch
evaluation of the 10,000 test images stays cheap. Sandblaster: one epoch is one full-batch L-BFGS
iteration; AllReduce: one epoch is ten steps on batches of 100.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MLP = """
[model]
input = [1, 28, 28]
[[model.layers]]
type = "fc"
units = 64
[[model.layers]]
type = "relu"
[[model.layers]]
type = "fc"
units = 10
[[model.layers]]
type = "softmax"

[train]
subset = 1000

[ps]
shard_kib = 32           # 50,896 parameters in seven shards, over both servers
"""


def cluster(config: Path, data: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hogwild.cli", "cluster", "--config", str(config),
               "--data", str(data), "--no-progress", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def test_sandblaster_lbfgs_trains_mnist_through_real_parameter_servers(mnist_dir, tmp_path):
    config = tmp_path / "mlp.toml"
    config.write_text(MLP)
    run = tmp_path / "run"
    began = time.monotonic()
    done = cluster(
        config, mnist_dir, "--cluster.framework=sandblaster", "--cluster.workers_per_group=2",
        "--ps", "2", "--epochs", "20", "--checkpoint-dir", str(run),
        "--metrics", str(run / "metrics.jsonl"), timeout=300,
    )  # fmt: skip
    seconds = time.monotonic() - began
    assert done.returncode == 0, done.stderr[-3000:]
    final = json.loads(done.stdout.strip().splitlines()[-1])
    assert (final["framework"], final["optimizer"]) == ("sandblaster", "lbfgs")
    assert final["replicas"] == 1 and final["workers"] == 2 and final["ps_servers"] == 2
    # 20 L-BFGS iterations on 1,000 examples reached 87 % test accuracy here (train loss 0.08)
    assert final["test_accuracy"] >= 0.84, final
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in records if r["event"] == "start")
    assert len(start["ps_servers"]) == 2
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == list(range(20))
    losses = [r["train_loss"] for r in epochs]
    assert losses[-1] < 0.3 and losses[-1] < losses[0] / 5, losses
    assert all(r["train_accuracy"] is None for r in epochs)  # not counted, not made up
    group = epochs[-1]["sandblaster"]["0"]
    assert group["iterations"] == 20 and group["workers"] == 2
    # every iteration's passes covered the batch in portions, both replica threads computing
    assert group["evaluations"] >= 21 and group["portions"] >= 21 * 16  # 16 portions of 63
    assert len(group["kept"]) == 2 and min(group["kept"]) > 0
    log = (run / "logs" / "replica-0.log").read_text()
    assert "L-BFGS iteration 20" in log and "2 replica thread(s)" in log
    servers = [(run / "logs" / f"ps-{i}.log").read_text() for i in range(2)]
    assert all(" of 7 shards" in text and " 0 of 7" not in text for text in servers), servers
    print(f"sandblaster: test accuracy {final['test_accuracy']:.4f} in {seconds:.1f} s")


def test_allreduce_trains_mnist_with_synchronous_sgd_through_a_server_per_worker(
    mnist_dir, tmp_path
):
    config = tmp_path / "mlp.toml"
    config.write_text(MLP)
    run = tmp_path / "run"
    began = time.monotonic()
    done = cluster(
        config, mnist_dir, "--cluster.framework=allreduce", "--cluster.workers_per_group=2",
        "--train.batch=100", "--optim.lr=0.1", "--optim.schedule=constant", "--epochs", "10",
        "--checkpoint-dir", str(run), "--metrics", str(run / "metrics.jsonl"), timeout=300,
    )  # fmt: skip
    seconds = time.monotonic() - began
    assert done.returncode == 0, done.stderr[-3000:]
    final = json.loads(done.stdout.strip().splitlines()[-1])
    assert (final["framework"], final["optimizer"]) == ("allreduce", "sgd")
    assert final["workers"] == 2 and final["ps_servers"] == 2  # a server bound to each worker
    # 100 steps of 100 examples reached 87.6 % test accuracy here (train loss 0.16)
    assert final["test_accuracy"] >= 0.84, final
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["event"] == "epoch"]
    losses = [r["train_loss"] for r in epochs]
    assert losses[-1] < 0.3 and losses[-1] < losses[0] / 5, losses
    group = epochs[-1]["sandblaster"]["0"]
    assert group["iterations"] == group["evaluations"] == 100  # a step per batch pass
    assert min(group["kept"]) > 0  # both replica threads computed portions
    print(f"allreduce: test accuracy {final['test_accuracy']:.4f} in {seconds:.1f} s")


@pytest.mark.parametrize(
    ("framework", "missing"),
    [
        ("hogwild", "not built: several server groups synchronising"),
        ("hybrid", "not built: worker groups whose workers compute each step synchronously"),
    ],
)
def test_frameworks_not_built_are_refused_before_any_role_starts(
    mnist_dir, tmp_path, framework, missing
):
    config = tmp_path / "mlp.toml"
    config.write_text(MLP)
    done = cluster(config, mnist_dir, f"--cluster.framework={framework}", timeout=120)
    assert done.returncode != 0
    assert f"cluster.framework = '{framework}'" in done.stderr and missing in done.stderr
    assert "valid topology but hogwild cluster does not run it yet" in done.stderr
    assert "hogwild ps: serving" not in done.stderr  # nothing was started
