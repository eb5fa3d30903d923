"""The ``hogwild train`` process under signals and bad input, driven as a user would drive it.

Proves that Ctrl-C of the parent, SIGKILL of a worker and SIGKILL of the parent each leave no
shared-memory segment and no process behind, that a dead worker stops the job with an error naming
it and its signal while the last checkpoint stays loadable, and that bad inputs (config, data,
too little shared memory) end with exit status 2 and one clear line.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hogwild.train.checkpoint import latest_checkpoint, load_checkpoint

START_TIMEOUT_S = 120.0
EXIT_TIMEOUT_S = 30.0


def hogwild_cli(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hogwild.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def run_cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hogwild.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def workers_of(pid: int) -> list[psutil.Process]:
    """The trainer's worker processes (spawned children, not multiprocessing's helpers)."""
    workers = []
    for child in psutil.Process(pid).children():
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "spawn_main" in cmdline or "forkserver" in cmdline and "resource_tracker" not in cmdline:
            if "resource_tracker" not in cmdline:
                workers.append(child)
    return workers


def started(metrics: Path) -> bool:
    """True once the trainer wrote its start line, i.e. every worker is up."""
    return metrics.exists() and '"event": "start"' in metrics.read_text()


def segments_of(pid: int) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"hogwild-train-{pid}-")]


def stop(process: subprocess.Popen) -> tuple[str, str]:
    try:
        return process.communicate(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise


@pytest.fixture
def long_job(tmp_path, shared_mnist_dir):
    """A job that trains long enough to be interrupted, with its metrics file."""
    metrics = tmp_path / "metrics.jsonl"
    args = [
        "train",
        "--data",
        str(shared_mnist_dir),
        "--workers",
        "2",
        "--epochs",
        "50",
        "--subset",
        "600",
        "--metrics",
        str(metrics),
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--no-progress",
    ]
    return args, metrics, tmp_path / "ck"


def test_ctrl_c_stops_workers_and_removes_the_arena(long_job):
    args, metrics, _ = long_job
    process = hogwild_cli(*args)
    wait_until(lambda: started(metrics), START_TIMEOUT_S, "the workers to start")
    workers = workers_of(process.pid)
    assert len(workers) == 2
    assert segments_of(process.pid)
    process.send_signal(signal.SIGINT)
    _, err = stop(process)
    assert process.returncode == 130, err
    assert "interrupted" in err
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive
    assert segments_of(process.pid) == []


def test_sigkill_of_a_worker_stops_the_job_and_keeps_the_checkpoint(long_job):
    args, metrics, checkpoints = long_job
    process = hogwild_cli(*args)
    wait_until(lambda: latest_checkpoint(checkpoints), START_TIMEOUT_S, "a first checkpoint")
    workers = workers_of(process.pid)
    victim = workers[1]
    victim.kill()
    _, err = stop(process)
    assert process.returncode == 1, err
    assert "worker" in err and "SIGKILL" in err and str(victim.pid) in err
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive
    assert segments_of(process.pid) == []
    assert load_checkpoint(checkpoints).weights["conv1.weight"].shape == (10, 1, 5, 5)


def test_sigkill_of_the_parent_leaves_no_worker_and_no_segment(long_job):
    args, metrics, _ = long_job
    process = hogwild_cli(*args)
    wait_until(lambda: started(metrics), START_TIMEOUT_S, "the workers to start")
    workers = workers_of(process.pid)
    assert len(workers) == 2 and segments_of(process.pid)
    process.kill()
    process.communicate()
    _, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive, "workers outlived their parent"
    # The orphaned workers remove the arena themselves; no sweep is needed.
    wait_until(lambda: not segments_of(process.pid), 30, "the orphaned arena to be removed")


def test_unknown_config_key_is_a_clear_error(tmp_path, shared_mnist_dir):
    config = tmp_path / "job.toml"
    config.write_text("[optim]\nlearning_rate = 0.1\n")
    result = run_cli("train", "--config", str(config), "--data", str(shared_mnist_dir))
    assert result.returncode == 2
    assert "optim.learning_rate" in result.stderr and str(config) in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_override_value_is_a_clear_error(shared_mnist_dir):
    result = run_cli("train", "--data", str(shared_mnist_dir), "--train.epochs=many")
    assert result.returncode == 2
    assert "train.epochs must be int" in result.stderr


def test_truncated_data_file_is_a_clear_error(tmp_path, shared_mnist_dir):
    for name in os.listdir(shared_mnist_dir):
        if name.endswith(".gz"):
            (tmp_path / name).write_bytes((shared_mnist_dir / name).read_bytes())
    labels = tmp_path / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(gzip.decompress(labels.read_bytes())[:5000]))
    result = run_cli("train", "--data", str(tmp_path), "--epochs", "1")
    assert result.returncode == 2
    assert "t10k-labels-idx1-ubyte.gz" in result.stderr
    assert "Traceback" not in result.stderr


def test_too_little_shared_memory_says_how_much(shared_mnist_dir):
    # A 10-million-unit layer needs about 26 GB of parameters and momentum.
    result = run_cli(
        "train",
        "--data",
        str(shared_mnist_dir),
        "--model.layers.6.units=10000000",
        "--epochs",
        "1",
    )
    assert result.returncode == 2, result.stderr
    assert "/dev/shm" in result.stderr and "free" in result.stderr
    assert "Traceback" not in result.stderr


def test_eval_of_a_missing_checkpoint_is_a_clear_error(tmp_path, shared_mnist_dir):
    result = run_cli("eval", str(tmp_path / "nothing"), "--data", str(shared_mnist_dir))
    assert result.returncode == 2
    assert "nothing" in result.stderr


def test_train_then_eval_prints_the_same_accuracy(tmp_path, shared_mnist_dir):
    result = run_cli(
        "train",
        "--data",
        str(shared_mnist_dir),
        "--workers",
        "2",
        "--epochs",
        "1",
        "--subset",
        "400",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    evaluation = run_cli("eval", str(tmp_path / "ck"), "--data", str(shared_mnist_dir), "--json")
    assert evaluation.returncode == 0, evaluation.stderr
    assert json.loads(evaluation.stdout)["test_accuracy"] == pytest.approx(
        summary["test_accuracy"], abs=1e-4
    )
