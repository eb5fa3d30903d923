"""Config overrides on the command line reach the command whole, spaces and all.

argparse reads an option whose value holds a space as a positional argument; ``hogwild cluster``
has a positional of its own (``status``, ``replica``) which then swallowed an inline TOML array of
layers. The parser of the real CLI runs here; only the step after parsing (starting a job) is
replaced by one that records what it was given.
"""

from __future__ import annotations

import pytest

import hogwild.cli as cli

LAYERS = '[{type = "fc", units = 10}, {type = "softmax"}]'


@pytest.mark.parametrize("command", ["cluster", "train"])
def test_an_override_with_spaces_reaches_the_command(monkeypatch, command):
    seen = {}

    def record(args, overrides):
        seen.update(overrides)
        return 0

    monkeypatch.setattr(cli, f"{command}_command", record)
    argv = [command, "--epochs", "1", f"--model.layers={LAYERS}", "--optim.lr=0.01"]
    assert cli._dispatch(argv) == 0
    assert seen == {"model.layers": LAYERS, "optim.lr": "0.01"}


def test_an_override_to_a_command_without_config_is_refused(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli._dispatch(["shm", "ls", "--optim.lr=0.01"])
    assert stopped.value.code == 2
    assert "--optim.lr=0.01" in capsys.readouterr().err
