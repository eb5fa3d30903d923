"""The ``hogwild train`` process under signals and bad input, driven as a user would drive it.

Proves that Ctrl-C of the job's process group, SIGTERM or SIGKILL of the parent and SIGKILL of a
worker each leave no shared-memory segment and no process (worker, forkserver) behind, that a
dead worker stops the job with an error naming it and its signal while the last checkpoint stays
loadable, and that bad inputs (config, data, too little shared memory) end with exit status 2
and one clear line.

The bad config, data and checkpoint are refused before any process or segment exists: those
commands run through the command line's entry inside the test's process
(:mod:`tests.cli_in_process`), the same code a ``hogwild`` process runs, without an interpreter
start and hogwild's imports each. Too little shared memory is found where the job sizes its
arena, and runs as a process, as do the jobs.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from hogwild.locks import lock_path, numba_cache_key
from hogwild.training.checkpoint import latest_checkpoint, load_checkpoint
from hogwild.training.zygote import FORKED_TITLE
from tests.cli_in_process import hogwild_cli as hogwild_here

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
    """The trainer's worker processes (its children, or its forkserver's: named by the worker)."""
    workers = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if child.name().startswith("hogwild-w"):
                workers.append(child)
        except psutil.Error:
            continue
    return workers


def forkserver_of(pid: int) -> psutil.Process:
    """The trainer's forkserver (the default start method's)."""
    for child in psutil.Process(pid).children():
        try:
            if "multiprocessing.forkserver" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"process {pid} has no forkserver")


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
def long_job(tmp_path, mnist_dir):
    """A job that trains long enough to be interrupted, with its metrics file."""
    metrics = tmp_path / "metrics.jsonl"
    args = [
        "train",
        "--data",
        str(mnist_dir),
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
    process = hogwild_cli(*args, start_new_session=True)  # its own group, as a terminal's job
    wait_until(lambda: started(metrics), START_TIMEOUT_S, "the workers to start")
    workers = workers_of(process.pid)
    assert len(workers) == 2
    server = forkserver_of(process.pid)
    # forked from the trainer (no second interpreter importing numba), the workers from it
    assert f"{FORKED_TITLE}, for pid {process.pid}, hogwild train" in " ".join(server.cmdline())
    assert server.num_threads() == 1  # OpenBLAS's pool ended in the fork, not started again
    assert {worker.ppid() for worker in workers} == {server.pid}
    assert segments_of(process.pid)
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the whole group, workers and server too
    _, err = stop(process)
    assert process.returncode == 130, err
    assert "interrupted" in err
    assert not server.is_running()  # the trainer waited for it at its exit
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
    server = forkserver_of(process.pid)
    process.kill()
    process.communicate()
    _, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive, "workers outlived their parent"
    _, alive = psutil.wait_procs([server], timeout=15)
    assert not alive, "the forkserver outlived the trainer and its workers"
    # The orphaned workers remove the arena themselves; no sweep is needed.
    wait_until(lambda: not segments_of(process.pid), 30, "the orphaned arena to be removed")


def test_unknown_config_key_is_a_clear_error(tmp_path, mnist_dir, capsys):
    config = tmp_path / "job.toml"
    config.write_text("[optim]\nlearning_rate = 0.1\n")
    code, _, err = hogwild_here(capsys, "train", "--config", config, "--data", mnist_dir)
    assert code == 2
    assert "optim.learning_rate" in err and str(config) in err
    assert "Traceback" not in err


def test_bad_override_value_is_a_clear_error(mnist_dir, capsys):
    code, _, err = hogwild_here(capsys, "train", "--data", mnist_dir, "--train.epochs=many")
    assert code == 2
    assert "train.epochs must be int" in err


def test_truncated_data_file_is_a_clear_error(tmp_path, published_mnist_dir, capsys):
    for name in os.listdir(published_mnist_dir):
        if name.endswith(".gz"):
            (tmp_path / name).write_bytes((published_mnist_dir / name).read_bytes())
    labels = tmp_path / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(gzip.decompress(labels.read_bytes())[:5000]))
    code, _, err = hogwild_here(capsys, "train", "--data", tmp_path, "--epochs", "1")
    assert code == 2
    assert "t10k-labels-idx1-ubyte.gz" in err
    assert "Traceback" not in err


def test_too_little_shared_memory_says_how_much(mnist_dir):
    # A 10-million-unit layer needs about 26 GB of parameters and momentum.
    result = run_cli(
        "train",
        "--data",
        str(mnist_dir),
        "--model.layers.7.units=10000000",
        "--epochs",
        "1",
    )
    assert result.returncode == 2, result.stderr
    assert "/dev/shm" in result.stderr and "free" in result.stderr
    assert "Traceback" not in result.stderr


def test_eval_of_a_missing_checkpoint_is_a_clear_error(tmp_path, mnist_dir, capsys):
    code, _, err = hogwild_here(capsys, "eval", tmp_path / "nothing", "--data", mnist_dir)
    assert code == 2
    assert "nothing" in err


def test_train_then_eval_prints_the_same_accuracy(tmp_path, mnist_dir):
    result = run_cli(
        "train",
        "--data",
        str(mnist_dir),
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
    evaluation = run_cli("eval", str(tmp_path / "ck"), "--data", str(mnist_dir), "--json")
    assert evaluation.returncode == 0, evaluation.stderr
    assert json.loads(evaluation.stdout)["test_accuracy"] == pytest.approx(
        summary["test_accuracy"], abs=1e-4
    )


def test_sigterm_stops_the_job_as_ctrl_c_does_with_status_143(long_job):
    args, metrics, _ = long_job
    process = hogwild_cli(*args)
    wait_until(lambda: started(metrics), START_TIMEOUT_S, "the workers to start")
    workers = workers_of(process.pid)
    assert len(workers) == 2 and segments_of(process.pid)
    server = forkserver_of(process.pid)
    process.send_signal(signal.SIGTERM)
    _, err = stop(process)
    assert process.returncode == 143, err
    assert "terminated" in err and "Traceback" not in err
    assert not server.is_running()  # the trainer waited for it at its exit
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive
    assert segments_of(process.pid) == []


def test_a_stalled_worker_is_named_and_stops_the_job(long_job):
    args, metrics, _ = long_job
    process = hogwild_cli(*args, "--train.stall_s=3")
    wait_until(lambda: started(metrics), START_TIMEOUT_S, "the workers to start")
    workers = workers_of(process.pid)
    victim = next(w for w in workers if w.name() == "hogwild-w1")
    victim.suspend()  # alive, but it will never show progress again
    try:
        started_waiting = time.monotonic()
        _, err = stop(process)
        assert time.monotonic() - started_waiting < EXIT_TIMEOUT_S
    finally:
        if victim.is_running():
            victim.kill()
    assert process.returncode == 1, err
    assert f"worker 1 (pid {victim.pid}) is alive but showed no progress" in err
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive
    assert segments_of(process.pid) == []


@pytest.mark.alone  # counts on every core: another job's pinned workers would take them
def test_two_jobs_started_at_once_pin_their_workers_to_different_cores(tmp_path, mnist_dir):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    jobs = []
    for name in ("a", "b"):
        metrics = tmp_path / f"{name}.jsonl"
        args = ["train", "--data", str(mnist_dir), "--workers", "1", "--epochs", "2"]
        args += ["--subset", "6000", "--metrics", str(metrics)]  # start-up lines on stderr
        jobs.append((hogwild_cli(*args), metrics))
    outputs = [stop(process) for process, _ in jobs]
    for (process, _), (_, err) in zip(jobs, outputs, strict=True):
        assert process.returncode == 0, err
    cpus = []
    for _, metrics in jobs:
        start = json.loads(metrics.read_text().splitlines()[0])
        cpus.append(start["cpus"])
    assert len({cpu for job in cpus for cpu in job}) == 2, (cpus, outputs)  # one core each
    # the second to plan says which CPU was taken, by whom
    assert any("taken by another hogwild job's workers" in err for _, err in outputs), outputs


def test_a_job_pins_its_workers_while_another_compiles_and_compiles_after_it(
    tmp_path, mnist_dir, monkeypatch
):
    """The placement lock is let go once the workers are pinned; compiling takes its own lock.

    The test holds the compile lock as a job compiling beside would: the job must still plan and
    pin its worker (the placement lock is not held across compiling), and must not start
    training until the lock is let go (a second compiler waits, then loads numba's cache).

    The locks are files in the temporary directory (:mod:`hogwild.locks`): the test and its job
    take theirs in one of their own, so that the lock the test holds stops no other test's job.
    """
    from hogwild.model.compile import compile_lock

    locks = tmp_path / "locks"
    locks.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(locks))  # this process's compile_lock()
    metrics = tmp_path / "m.jsonl"
    args = ["train", "--data", str(mnist_dir), "--workers", "1", "--epochs", "1"]
    args += ["--subset", "2000", "--metrics", str(metrics)]
    with compile_lock(timeout_s=START_TIMEOUT_S) as held:
        assert held and lock_path(f"kernels-{numba_cache_key()}").parent == locks  # its file
        assert lock_path(f"kernels-{numba_cache_key()}").is_file()
        process = hogwild_cli(*args, env={**os.environ, "TMPDIR": str(locks)})
        try:
            worker = wait_until(
                lambda: next((w for w in workers_of(process.pid) if _pinned(w)), None),
                START_TIMEOUT_S,
                "the job's worker pinned while the compile lock is held",
            )
            time.sleep(1.0)  # would the job go on without the lock?
            assert process.poll() is None
            assert not started(metrics)  # it waits for the compile lock, worker pinned
            assert worker.is_running()
        except BaseException:
            process.kill()
            process.communicate()
            raise
    try:
        _, err = process.communicate(timeout=START_TIMEOUT_S)  # a cold cache compiles first
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    assert process.returncode == 0, err
    assert started(metrics)


def _pinned(process: psutil.Process) -> bool:
    try:
        return process.name().startswith("hogwild-w") and len(process.cpu_affinity()) == 1
    except psutil.Error:
        return False
