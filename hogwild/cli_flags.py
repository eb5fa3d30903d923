"""The command line's flags: one parser class, one meaning per flag, errors that name the flag.

Every ``hogwild`` parser (the plugins' subcommands too, through ``parser_class``) is a
:class:`HogwildParser`: prefixes of long options are not accepted (``--workers`` must not
silently mean ``--workers-per-replica``), and each option's help ends with its default.

The training flags that ``train`` and ``cluster`` share are declared once
(:func:`add_training_flags`), each with the config key it sets (:data:`FLAG_KEYS`). Spellings of
earlier versions still parse as hidden aliases (``--batch`` for ``--batch-size``, ``--ps`` for
``train --ps-servers`` and ``cluster --ps-count``, ``--workers-per-replica`` for ``cluster
--workers``). The parser records the spelling each value was given with, so that a value the
config rejects is reported against the flag the user typed (:func:`apply_flags`), not against
the file the rest of the job came from.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from hogwild.errors import ConfigError

TYPED = "_typed"  # namespace attribute: dest -> the option string the user typed


class HelpFormatter(argparse.HelpFormatter):
    """Help whose options end with ``(default: X)`` when they have a default worth saying."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            text is not argparse.SUPPRESS
            and "default" not in text
            and default not in (None, False, argparse.SUPPRESS)
            and action.option_strings
            and action.nargs != 0
        ):
            text += " (default: %(default)s)"
        return text


class HogwildParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` without prefix matching and with defaults in its help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


class _Typed(argparse.Action):
    """Stores a value and which of the option's spellings carried it."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        typed = dict(getattr(namespace, TYPED, None) or {})
        typed[self.dest] = option_string
        setattr(namespace, TYPED, typed)


class _TypedTrue(_Typed):
    def __init__(self, option_strings, dest, default=None, required=False, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, required=required,
                         help=help)  # fmt: skip

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, True, option_string)


# dest -> config key, for the flags that set one.
FLAG_KEYS = {
    "workers": "train.workers",
    "partitions": "model.partitions",
    "epochs": "train.epochs",
    "batch_size": "train.batch",
    "lr": "optim.lr",
    "sync": "train.sync",
    "epoch_fraction": "train.epoch_fraction",
    "seed": "train.seed",
    "subset": "train.subset",
    "evaluate_every": "train.evaluate_every",
    "checkpoint_dir": "output.checkpoint_dir",
    "metrics": "output.metrics",
    "tensorboard": "output.tensorboard",
    "tensorboard_every": "output.tensorboard_every",
    "ps_servers": "ps.servers",
    "replicas": "cluster.replicas",
    "ps_count": "cluster.ps",
    "data_servers": "cluster.data_servers",
    "launcher": "cluster.launcher",
    "ray_address": "cluster.ray_address",
}
CLUSTER_KEYS = {"workers": "cluster.workers_per_replica"}  # where ``cluster`` differs

LOG_LEVELS = ("debug", "info", "warning", "error")


def bundled_value(key: str) -> Any:
    """The bundled job's value of ``section.key`` (what a flag left out means)."""
    from hogwild.config import load_config

    section, name = key.split(".")
    return getattr(getattr(_bundled(load_config), section), name)


_BUNDLED: list = []


def _bundled(load_config):
    if not _BUNDLED:
        _BUNDLED.append(load_config())
    return _BUNDLED[0]


def _job(key: str, fallback: str | None = None) -> str:
    value = bundled_value(key)
    shown = fallback if fallback and value in (0, "", None) else repr(value)
    return f"(default: the job's {key}, {shown} in the bundled job)"


def _add(parser, *names: str, hidden: tuple[str, ...] = (), flag: bool = False, **kwargs) -> None:
    """An option recording its spelling; ``hidden`` spellings parse but are not in the help."""
    action = _TypedTrue if flag else _Typed
    main = parser.add_argument(*names, action=action, **kwargs)
    for old in hidden:
        same = {k: v for k, v in kwargs.items() if k in ("type", "metavar")}
        parser.add_argument(old, action=action, dest=main.dest, help=argparse.SUPPRESS, **same)


def add_training_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags of a training job, shared by ``train`` and ``cluster``: same names, same keys."""
    cluster = command == "cluster"
    _add(parser, "--config", metavar="FILE",
         help="job config (TOML); a file without [model] layers is layered over the bundled "
         "job (default: the bundled job, Adam's MNIST model)")  # fmt: skip
    _add(parser, "--data", metavar="SOURCE",
         help="an LMDB image cache (hogwild data ingest), a directory of MNIST idx files, or "
         "'mnist' (default: the job's data.source)")  # fmt: skip
    if cluster:
        _add(parser, "--workers", type=int, metavar="N", hidden=("--workers-per-replica",),
             help="worker processes per model replica "
             + _job("cluster.workers_per_replica"))  # fmt: skip
    else:
        _add(parser, "--workers", type=int, metavar="N",
             help="worker processes " + _job("train.workers", "one per physical core"))  # fmt: skip
    _add(parser, "--epochs", type=int, metavar="E",
         help="passes over the training set " + _job("train.epochs"))  # fmt: skip
    _add(parser, "--batch-size", type=int, metavar="B", hidden=("--batch",),
         help="examples per update " + _job("train.batch"))  # fmt: skip
    _add(parser, "--lr", type=float, metavar="X", help="learning rate " + _job("optim.lr"))
    _add(parser, "--seed", type=int, metavar="S", help="random seed " + _job("train.seed"))
    _add(parser, "--subset", type=int, metavar="N",
         help="train on the first N examples only (default: all of them)")  # fmt: skip
    _add(parser, "--evaluate-every", type=int, metavar="N",
         help="evaluate on the test set after every N-th epoch and after the last; 0: only "
         "after the last " + _job("train.evaluate_every"))  # fmt: skip
    _add(parser, "--checkpoint-dir", metavar="DIR",
         help="write a checkpoint here at every epoch end (default: none)")  # fmt: skip
    _add(parser, "--resume", flag=True,
         help="continue the run in --checkpoint-dir and append to its --metrics file")  # fmt: skip
    _add(parser, "--overwrite", flag=True,
         help="replace the checkpoints in --checkpoint-dir and the --metrics file of an "
         "earlier run")  # fmt: skip
    _add(parser, "--metrics", metavar="FILE",
         help="write JSON-lines metrics to this file (refused if it exists, unless --resume "
         "or --overwrite; default: none)")  # fmt: skip
    _add(parser, "--no-progress", flag=True, help="no progress output")
    _add(parser, "--tensorboard", metavar="DIR",
         help="write TensorBoard scalars here: per epoch, and in train every "
         "--tensorboard-every steps (needs the tensorboard extra; default: none)")  # fmt: skip
    _add(parser, "--tensorboard-every", type=int, metavar="N",
         help="steps (updates) between train's in-epoch TensorBoard scalars "
         + _job("output.tensorboard_every"))  # fmt: skip
    _add(parser, "--log-level", choices=LOG_LEVELS, default="info",
         help="messages of this level and above on stderr")  # fmt: skip


def add_train_only_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of ``train`` that a cluster job does not take."""
    _add(parser, "--sync", flag=True, help="one worker, synchronous (Adam's Table 1 comparison)")
    _add(parser, "--epoch-fraction", type=float, metavar="F",
         help="end an epoch once this fraction of workers finished their shard (Adam: 0.75) "
         + _job("train.epoch_fraction"))  # fmt: skip
    _add(parser, "--ps-servers", metavar="HOST:PORT[,...]", hidden=("--ps",),
         help="train through these running parameter servers (sets ps.servers and, unless "
         "given, train.parameters=ps; default: none)")  # fmt: skip
    _add(parser, "--partitions", type=int, metavar="K",
         help="split one replica's layers over K processes (Adam 3.2: convolutions by feature "
         "maps, fully connected layers by units; docs/partitioning.md) "
         + _job("model.partitions"))  # fmt: skip
    _add(parser, "--model", metavar="FILE.py:FUNCTION",
         help="a PyTorch model: FUNCTION() in FILE.py returns a torch.nn module (see "
         "docs/python-api.md), trained from its weights with the job's other settings; its "
         "input shape is the features of --data FILE.csv or .npz, else model.input (default: "
         "the job's model)")  # fmt: skip
    _add(parser, "--loss", choices=("cross_entropy", "mse"), default="cross_entropy",
         help="with --model: cross-entropy on its last Linear's class scores, or mse: its values "
         "regressed on the targets (default: cross_entropy)")  # fmt: skip
    _add(parser, "--target", metavar="COLUMN",
         help="with --data FILE.csv: the column of class indices, or with --loss mse of target "
         "values (the others are features; 20 %% of the rows are held back as the test split; "
         "default: none)")  # fmt: skip


def add_cluster_only_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of ``cluster``: how many of each role, and where they run."""
    _add(parser, "--replicas", type=int, metavar="R",
         help="model replicas " + _job("cluster.replicas"))  # fmt: skip
    _add(parser, "--ps-count", type=int, metavar="S", hidden=("--ps",),
         help="parameter servers " + _job("cluster.ps"))  # fmt: skip
    _add(parser, "--data-servers", type=int, metavar="D",
         help="data servers " + _job("cluster.data_servers"))  # fmt: skip
    _add(parser, "--partitions", type=int, metavar="K",
         help="split each replica's layers over K processes, each pushing and pulling its own "
         "rows (docs/partitioning.md) " + _job("model.partitions"))  # fmt: skip
    _add(parser, "--launcher", metavar="NAME",
         help="where the roles run: local (this host), ray (a Ray cluster) or a plugin's "
         + _job("cluster.launcher"))  # fmt: skip
    _add(parser, "--ray-address", metavar="ADDR", help="the Ray cluster to join (launcher ray)")


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option ``parser`` and its subcommands' parsers take (hidden spellings too)."""
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= option_strings(sub)
    return found


def flag_overrides(args: argparse.Namespace, command: str) -> dict[str, tuple[str, Any]]:
    """``{config key: (the flag as typed, value)}`` for every config flag given."""
    typed = getattr(args, TYPED, None) or {}
    keys = {**FLAG_KEYS, **(CLUSTER_KEYS if command == "cluster" else {})}
    out = {}
    for dest, key in keys.items():
        value = getattr(args, dest, None)
        if value is None or dest not in typed:
            continue
        out[key] = (typed[dest], value)
    return out


def apply_flags(config, flags: Mapping[str, tuple[str, Any]], overrides: Mapping[str, str]):
    """``config`` with the flags' values and the ``--section.key=value`` overrides applied.

    The config it starts from was valid; a value it then rejects came from the command line, so
    the error names what the user typed (``--epochs 0``, ``--train.epochs=0``) instead of the
    file the job came from.

    Raises:
        ConfigError: A value out of range or of the wrong type, naming its flag.
    """
    merged: dict[str, Any] = {key: value for key, (_, value) in flags.items()}
    merged.update(overrides)
    if not merged:
        return config
    try:
        return config.override(merged)
    except ConfigError as exc:
        raise ConfigError(_blame(str(exc), config.origin, flags, overrides)) from None


def _blame(message: str, origin: str, flags, overrides) -> str:
    """``message`` with the config's origin replaced by the flags whose keys it names."""
    text = message.removeprefix(f"{origin}: ")
    typed = [f"{flag} {value}" for key, (flag, value) in flags.items() if key in text]
    typed += [f"--{key}={value}" for key, value in overrides.items() if key in text]
    if not typed:  # a key the message does not spell out (a layer's, say): every value given
        typed = [f"{flag} {value}" for flag, value in flags.values()]
        typed += [f"--{key}={value}" for key, value in overrides.items()]
    return f"{', '.join(typed)}: {text}"
