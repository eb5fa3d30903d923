"""The README's quick start, run as written, twice.

The commands are read from README.md (the fenced block after the ``quick-start`` marker) and run
with the installed package, in a fresh directory, with ``HOGWILD_DATA`` pointing at the local
MNIST files (so nothing is downloaded). The install steps above them are not run here: a fresh
virtual environment with PyTorch, Ray and the rest takes minutes and the network; ``.ci/run``
installs from scratch as the README says, then runs the suite, this test included.

The second run checks that the commands can be run again (the checkpoint directory and the
metrics file of the first run must not stop it); it adds ``--subset 1000`` to the training
command, since what it tests is decided before training starts.

``hogwild train`` runs as a process of its own, as a user's would (its workers are processes);
``hogwild eval`` and ``hogwild plot`` start none, and run through the same entry inside the test's
process (:mod:`tests.cli_in_process`), in the same directory and environment: as processes, each
cost an interpreter start and hogwild's imports, more than the work itself.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hogwild.training.metrics import read_metrics
from tests.cli_in_process import hogwild_cli

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- quick-start"


def quick_start_commands() -> list[list[str]]:
    """The ``hogwild ...`` lines of the README's quick-start block, split as a shell would."""
    text = README.read_text()
    assert MARKER in text, "README.md lost its quick-start marker"
    block = text.split(MARKER, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line, comments=True) for line in block.splitlines()]
    commands = [c for c in commands if c]
    assert commands and all(c[0] == "hogwild" for c in commands), commands
    return commands


def run(command: list[str], cwd: Path, env: dict, capsys) -> None:
    """``command`` run in ``cwd`` with ``env``: ``hogwild train`` as a process, the others in
    this process (``cwd`` and ``env`` already this process's: see the test); it must exit 0."""
    if command[1] == "train":
        done = subprocess.run(
            [sys.executable, "-m", "hogwild.cli", *command[1:]],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, f"{shlex.join(command)}:\n{done.stderr[-3000:]}"
        return
    assert Path.cwd() == cwd.resolve() and os.environ["HOGWILD_DATA"] == env["HOGWILD_DATA"]
    code, _, err = hogwild_cli(capsys, *command[1:])
    assert code == 0, f"{shlex.join(command)}:\n{err[-3000:]}"


def test_the_quick_start_is_two_epochs_with_a_checkpoint_and_a_plot():
    commands = quick_start_commands()
    train = next(c for c in commands if c[1] == "train")
    assert train[train.index("--epochs") + 1] == "2"
    assert "--overwrite" in train  # what lets it run twice
    assert [c[1] for c in commands] == ["train", "eval", "plot"]


@pytest.mark.slow
def test_the_quick_start_runs_as_written_and_again(tmp_path, mnist_dir, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="hogwild plot: the bench extra")
    monkeypatch.setenv("HOGWILD_DATA", str(mnist_dir))
    monkeypatch.chdir(tmp_path)  # the commands' relative paths, for those run in this process
    env = dict(os.environ)
    commands = quick_start_commands()
    for command in commands:
        run(command, tmp_path, env, capsys)
    records = read_metrics(tmp_path / "runs" / "quick" / "metrics.jsonl")
    final = records[-1]
    assert final["event"] == "final" and final["epochs"] == 2
    assert final["test_accuracy"] > 0.9
    assert (tmp_path / "runs" / "quick" / "curves.png").read_bytes().startswith(b"\x89PNG")

    for command in commands:  # again, in the same directory
        again = [*command, "--subset", "1000"] if command[1] == "train" else command
        run(again, tmp_path, env, capsys)
    records = read_metrics(tmp_path / "runs" / "quick" / "metrics.jsonl")
    assert [r["event"] for r in records].count("start") == 1  # the second run replaced the first
    assert records[0]["config"]["train"]["subset"] == 1000
