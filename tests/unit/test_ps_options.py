"""The parameter server's settings have one source: the job config (see ``ps/options.py``).

``hogwild ps serve`` runs through the real CLI parser here; only the step after parsing (starting
a server) is replaced by one that records the options it would serve with.
"""

from __future__ import annotations

import dataclasses
import tomllib

import hogwild_plugins.ps.serving.cli as ps_cli
import pytest
from hogwild_plugins.ps.serving.options import DEFAULT_LEASE_S, ServerOptions

import hogwild.cli as cli
from hogwild.config import PS_DEFAULT_LR, PsConfig, default_config_path, load_config

FROM_CONFIG = (
    "rule",
    "lr",
    "momentum",
    "staleness_decay",
    "max_staleness",
    "adagrad_eps",
    "shard_kib",
    "buckets",
    "flush_s",
    "keys",
    "copies",
    "etcd",
    "lease_s",
    "min_copies",
)


def served_options(monkeypatch, *argv: str) -> ServerOptions:
    """The options ``hogwild ps serve ARGV`` would serve with."""
    seen = []

    def record(args) -> int:
        config = load_config(args.config, getattr(args, "overrides", None) or None)
        seen.append(ps_cli.serve_options(args, config))
        return 0

    monkeypatch.setattr(ps_cli, "_serve", record)
    assert cli._dispatch(["ps", "serve", *argv]) == 0
    return seen[0]


def test_the_bundled_job_config_documents_the_ps_sections_defaults():
    written = tomllib.loads(default_config_path().read_text())["ps"]
    defaults = dataclasses.asdict(PsConfig())
    assert {k: (tuple(v) if isinstance(v, list) else v) for k, v in written.items()} == defaults


def test_ps_serve_with_no_flags_serves_as_the_job_config_says(monkeypatch):
    options = served_options(monkeypatch)
    # rule "auto" and lr 0 in the config: one replica's SGD, with that rule's default step
    assert (options.rule, options.lr) == ("sgd", PS_DEFAULT_LR["sgd"]) == ("sgd", 1.0)
    ps = load_config().ps
    assert (options.momentum, options.staleness_decay, options.max_staleness) == (
        ps.momentum,
        ps.staleness_decay,
        ps.max_staleness,
    )
    assert (options.adagrad_eps, options.shard_kib, options.buckets, options.flush_s) == (
        ps.adagrad_eps,
        ps.shard_kib,
        ps.buckets,
        ps.flush_s,
    )
    assert (options.keys, options.copies, options.etcd) == (None, 1, None)
    assert options.lease_s == DEFAULT_LEASE_S  # ps.lease_s = 0
    assert options.servers == (f"127.0.0.1:{ps_cli.DEFAULT_PORT}",) and options.index == 0
    assert options.job == default_config_path().stem


def test_server_options_defaults_are_what_ps_serve_with_no_flags_uses(monkeypatch):
    served = served_options(monkeypatch)
    built = ServerOptions(job=served.job, servers=served.servers, bind=served.bind)
    assert built == served  # every field: the config's, and the server's own defaults
    assert [getattr(built, k) for k in FROM_CONFIG] == [getattr(served, k) for k in FROM_CONFIG]


def test_flags_and_overrides_take_the_place_of_the_config_keys(monkeypatch):
    options = served_options(
        monkeypatch,
        "--rule",
        "adagrad",
        "--copies",
        "3",
        "--etcd",
        "127.0.0.1:2379",
        "--lease-s",
        "5",
        "--threads",
        "2",
        "--ack",
        "applied",
        "--ps.momentum=0.5",
        "--ps.shard_kib=64",
    )
    assert (options.rule, options.lr) == ("adagrad", PS_DEFAULT_LR["adagrad"])
    assert (options.copies, options.etcd, options.lease_s) == (3, "127.0.0.1:2379", 5)
    assert (options.threads, options.ack, options.recv) == (2, "applied", "auto")
    assert (options.momentum, options.shard_kib) == (0.5, 64)


RESOLVED = [
    ("auto", 0.0, ("sgd", 1.0)),
    ("momentum", 0.0, ("momentum", 1.0)),
    ("adagrad", 0.05, ("adagrad", 0.05)),
]


@pytest.mark.parametrize(("rule", "lr", "want"), RESOLVED)
def test_from_config_resolves_the_rule_as_for_one_replica(rule, lr, want):
    config = load_config(overrides={"ps.rule": rule, "ps.lr": lr})
    options = ServerOptions.from_config(config, job="j", servers=("127.0.0.1:1",))
    assert (options.rule, options.lr) == want
