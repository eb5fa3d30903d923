"""The command line's flags: one meaning each, old spellings still parsed, errors naming them.

The real parser of ``hogwild`` runs here and the job it resolves is compared with the config
keys each flag promises; nothing is trained (the step after resolving is not called).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import hogwild.cli as cli
from hogwild.cli_commands import resolve_job
from hogwild.cli_parser import OVERRIDE, build_parser, split_overrides
from hogwild.config import OptimConfig, default_config_path, load_config
from hogwild.config.toml_text import config_to_toml
from hogwild.errors import ConfigError


def resolved(*argv: str):
    """The config ``hogwild ARGV`` would run (train or cluster), and the parsed arguments."""
    parser = build_parser()
    given = [a for a in argv if OVERRIDE.match(a)]
    args, extra = parser.parse_known_args([a for a in argv if not OVERRIDE.match(a)])
    overrides = split_overrides(extra + given, parser)
    return resolve_job(args, overrides, args.command), args


def test_batch_size_and_its_old_spelling_set_the_same_key():
    assert resolved("train", "--batch-size", "16")[0].train.batch == 16
    assert resolved("train", "--batch", "8")[0].train.batch == 8
    assert resolved("cluster", "--batch-size", "4")[0].train.batch == 4


def test_train_ps_servers_are_addresses_and_old_ps_still_means_them():
    for flag in ("--ps-servers", "--ps"):
        config, _ = resolved("train", flag, "127.0.0.1:5570,127.0.0.1:5571")
        assert config.ps.servers == ("127.0.0.1:5570", "127.0.0.1:5571")
        assert config.train.parameters == "ps"


def test_cluster_ps_count_is_a_count_and_old_ps_still_means_it():
    assert resolved("cluster", "--ps-count", "3")[0].cluster.ps == 3
    assert resolved("cluster", "--ps", "2")[0].cluster.ps == 2


def test_cluster_takes_the_common_training_flags():
    config, _ = resolved(
        "cluster", "--lr", "0.01", "--batch-size", "8", "--seed", "7", "--workers", "2",
        "--subset", "500", "--epochs", "3", "--replicas", "3",
    )  # fmt: skip
    assert config.optim.lr == 0.01
    assert (config.train.batch, config.train.seed, config.train.subset) == (8, 7, 500)
    assert config.train.epochs == 3
    assert config.cluster.workers_per_replica == 2  # cluster's workers are per replica
    assert config.cluster.replicas == 3
    assert resolved("cluster", "--workers-per-replica", "4")[0].cluster.workers_per_replica == 4


def test_flags_left_out_keep_the_jobs_values():
    config, _ = resolved("train")
    assert config.to_dict() == load_config().to_dict()


@pytest.mark.parametrize("command", ["train", "cluster"])
def test_prefixes_of_flags_are_not_accepted(command, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli._dispatch([command, "--epoch", "2"])
    assert stopped.value.code == 2
    assert "--epoch" in capsys.readouterr().err


def test_cluster_workers_no_longer_abbreviates_workers_per_replica():
    config, _ = resolved("cluster", "--workers", "5")
    assert config.cluster.workers_per_replica == 5  # what the user typed, not a prefix match
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cluster", "--workers-per", "5"])


def test_version(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli._dispatch(["--version"])
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("hogwild ") and out.split()[1][0].isdigit()


def test_help_shows_the_defaults_and_hides_old_spellings(capsys):
    with pytest.raises(SystemExit):
        cli._dispatch(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--batch-size B examples per update (default: the job's train.batch, 1 in the" in text
    assert f"train.epochs, {load_config().train.epochs} in the bundled job" in text
    assert "--log-level {debug,info,warning,error} messages of this level" in text
    assert "(default: info)" in text
    assert "--batch " not in text and "--ps " not in text


def test_cluster_help_does_not_list_the_internal_replica_command(capsys):
    with pytest.raises(SystemExit):
        cli._dispatch(["cluster", "--help"])
    out = capsys.readouterr().out
    assert "{status}" in out and "{status," not in out
    assert not [line for line in out.splitlines() if line.strip().startswith("replica ")]
    args = build_parser().parse_args(["cluster", "replica", "--index", "1"])  # still parses
    assert (args.cluster_command, args.index) == ("replica", 1)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["train", "--epochs", "0"], "--epochs 0"),
        (["train", "--batch", "0"], "--batch 0"),
        (["train", "--batch-size", "0"], "--batch-size 0"),
        (["cluster", "--lr", "-1"], "--lr -1.0"),
        (["train", "--train.epochs=0"], "--train.epochs=0"),
    ],
)
def test_a_value_out_of_range_is_blamed_on_the_flag_typed(argv, named):
    with pytest.raises(ConfigError) as failed:
        resolved(*argv)
    message = str(failed.value)
    assert message.startswith(f"{named}: ")
    assert str(default_config_path()) not in message


def test_a_partial_config_is_laid_over_the_bundled_job(tmp_path):
    partial = tmp_path / "short.toml"
    partial.write_text("[train]\nepochs = 2\n[optim]\nlr = 0.01\n")
    config = load_config(partial)
    bundled = load_config().to_dict()
    assert config.train.epochs == 2 and config.optim.lr == 0.01
    assert config.to_dict()["model"] == bundled["model"]
    assert config.optim.schedule == bundled["optim"]["schedule"]
    assert resolved("train", "--config", str(partial), "--epochs", "3")[0].train.epochs == 3


def test_a_partial_config_with_an_unknown_key_names_the_file(tmp_path):
    partial = tmp_path / "typo.toml"
    partial.write_text("[train]\nepoch = 2\n")
    with pytest.raises(ConfigError, match=r"typo\.toml: unknown key\(s\) train\.epoch"):
        load_config(partial)


def test_a_config_with_layers_is_a_whole_job_as_before(tmp_path):
    whole = tmp_path / "mlp.toml"
    whole.write_text(
        '[model]\ninput = [1, 28, 28]\nlayers = [{type = "fc", units = 10}, {type = "softmax"}]\n'
    )
    config = load_config(whole)
    assert config.optim == OptimConfig()  # the built-in defaults, not the bundled job's
    assert len(config.model.layers) == 2


def test_config_show_prints_a_complete_config_that_reads_back(tmp_path, capsys):
    partial = tmp_path / "short.toml"
    partial.write_text("[train]\nepochs = 2\n")
    assert cli._dispatch(["config", "show", "--config", str(partial), "--optim.lr=0.02"]) == 0
    shown = tmp_path / "shown.toml"
    shown.write_text(capsys.readouterr().out)
    expected = load_config(partial, {"optim.lr": 0.02}).to_dict()
    assert load_config(shown).to_dict() == expected


def test_config_to_toml_round_trips_strings_floats_and_lists(tmp_path):
    config = load_config().override(
        {"data.source": 'a "quoted" \\ path', "optim.lr": 1e-7, "ps.servers": "h:1,h:2"}
    )
    path = tmp_path / "c.toml"
    path.write_text(config_to_toml(config))
    assert load_config(path).to_dict() == config.to_dict()


def test_the_ps_plugin_commands_take_no_prefixes():
    refused = subprocess.run(
        [sys.executable, "-m", "hogwild.cli", "ps", "status", "127.0.0.1:1", "--time", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "--time" in refused.stderr


@pytest.mark.parametrize("command", ["train", "cluster"])
def test_tensorboard_is_a_flag_of_both_training_commands(command, tmp_path):
    config, _ = resolved(command, "--tensorboard", str(tmp_path), "--tensorboard-every", "7")
    assert (config.output.tensorboard, config.output.tensorboard_every) == (str(tmp_path), 7)
    with pytest.raises(ConfigError, match=r"^--tensorboard-every 0: output.tensorboard_every"):
        resolved(command, "--tensorboard-every", "0")


@pytest.mark.parametrize(
    "argv, suggestion",
    [
        (["cluster", "--workers-per", "2"], "did you mean --workers?"),
        (["train", "--btach-size", "3"], "did you mean --batch-size?"),
        (["cluster", "status", "--jsn", "run"], "did you mean --json?"),
    ],
)
def test_an_unknown_flag_is_named_with_a_suggestion(argv, suggestion, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli._dispatch(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized argument {argv[1] if argv[1] != 'status' else argv[2]}" in err
    assert suggestion in err and "invalid choice" not in err
