"""Range and consistency checks of :mod:`hogwild.config.checks`.

Every out-of-range, non-finite or not-a-choice value raises :class:`ConfigError` naming the key
and what was expected, as do layer settings that cannot run.
"""

from __future__ import annotations

import math

import pytest

from hogwild.config import config_from_dict
from hogwild.config.checks import etcd_election_unread
from tests.config_cases import error_of, small

# --- ranges -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("optim", "lr", 0.0),
        ("optim", "lr", -0.01),
        ("optim", "momentum", 1.0),
        ("optim", "momentum", -0.1),
        ("optim", "weight_decay", -1e-4),
        ("optim", "min_lr", -1.0),
        ("optim", "decay", 0.0),
        ("optim", "decay", 1.5),
        ("optim", "decay_every", 0),
        ("train", "epochs", 0),
        ("train", "batch", 0),
        ("train", "chunk", 0),
        ("train", "workers", -1),
        ("train", "subset", -5),
        ("train", "epoch_fraction", 0.0),
        ("train", "epoch_fraction", 1.01),
        ("train", "n_push", -1),
        ("train", "n_fetch", -64),
        ("train", "cadence_ramp", -2),
        ("train", "stall_s", 0.0),
        ("model", "partition_silence_s", 0.9),  # under two of the hosts' 0.5 s beats
        ("model", "partition_silence_s", math.inf),
        ("train", "evaluate_every", -1),
        ("ps", "lr", -1.0),
        ("ps", "shard_kib", 2),
        ("ps", "staleness_decay", 1.5),
        ("ps", "adagrad_eps", 0.0),
        ("ps", "adagrad_eps", 1e-50),  # positive, but 0 in float32
        ("data", "std", 0.0),
        ("output", "keep_checkpoints", 0),
        ("cluster", "replicas", 0),
        ("cluster", "ps", 0),
        ("cluster", "epoch_fraction", 0.0),
        ("cluster", "metrics_port", -1),
        ("cluster", "metrics_port", 65534),  # its roles would need ports past 65535
        ("cluster", "start_timeout_s", 0.0),
        ("cluster", "restarts", -1),
    ],
)
def test_out_of_range_value_names_key(section, key, value):
    msg = error_of(small(**{section: {key: value}}))
    assert f"{section}.{key}" in msg


def test_out_of_range_messages_say_what_is_expected():
    assert "(0, 1]" in error_of(small(train={"epoch_fraction": 0.0}))
    assert "integer >= 0" in error_of(small(train={"evaluate_every": -2}))
    assert "[0, 1)" in error_of(small(optim={"momentum": 1.0}))
    assert "> 0" in error_of(small(optim={"lr": 0.0}))
    assert ">= 1 (the hosts" in error_of(small(model={"partition_silence_s": 0.5}))
    shortest = config_from_dict(small(model={"partition_silence_s": 1.0}))  # two beats
    assert shortest.model.partition_silence_s == 1.0


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("optim", "rule", "adagrad"),
        ("optim", "schedule", "onecycle"),
        ("model", "init", "kaiming"),
        ("train", "start_method", "fork"),
        ("train", "placement", "random"),
        ("train", "parameters", "mirror"),
        ("cluster", "evaluate", "during"),
    ],
)
def test_choice_outside_its_choices(section, key, value):
    msg = error_of(small(**{section: {key: value}}))
    assert f"{section}.{key}" in msg and repr(value) in msg and "one of" in msg


@pytest.mark.parametrize("p", [1.0, 1.5, -0.1])
def test_dropout_probability_out_of_range(p):
    data = small()
    data["model"]["layers"].insert(2, {"type": "dropout", "p": p})
    msg = error_of(data)
    assert "model.layers[2] (dropout)" in msg and "[0, 1)" in msg


@pytest.mark.parametrize(
    ("layer", "words"),
    [
        ({"type": "conv", "maps": 0, "kernel": 3}, "maps"),
        ({"type": "conv", "maps": 2, "kernel": 0}, "kernel"),
        ({"type": "conv", "maps": 2, "kernel": 3, "stride": 0}, "stride"),
        ({"type": "conv", "maps": 2, "kernel": 3, "padding": "full"}, "'full'"),
        ({"type": "maxpool", "size": 0}, "size"),
        ({"type": "maxpool", "size": 2, "stride": 0}, "stride"),
        ({"type": "fc", "units": 0}, "units"),
    ],
)
def test_layer_settings_out_of_range(layer, words):
    data = small()
    data["model"]["layers"][0] = layer
    msg = error_of(data)
    assert f"model.layers[0] ({layer['type']})" in msg and words in msg


FLOAT_KEYS = [
    ("model", "init_scale"),
    ("optim", "lr"),
    ("optim", "momentum"),
    ("optim", "weight_decay"),
    ("optim", "decay"),
    ("optim", "min_lr"),
    ("train", "epoch_fraction"),
    ("data", "mean"),
    ("data", "std"),
]


@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize(("section", "key"), FLOAT_KEYS)
def test_non_finite_floats_are_rejected(section, key, value):
    """TOML has nan and inf literals; no setting means anything with them."""
    msg = error_of(small(**{section: {key: value}}))
    assert f"{section}.{key}" in msg


def test_negative_seed_is_rejected():
    """The seed feeds numpy's SeedSequence, which refuses negative values at training time."""
    assert "train.seed" in error_of(small(train={"seed": -1}))


def test_negative_init_scale_is_rejected():
    """A negative spread makes initialisation fail later (numpy: 'scale < 0')."""
    assert "model.init_scale" in error_of(small(model={"init_scale": -1.0}))


def test_options_that_do_nothing_in_the_chosen_mode_are_rejected_naming_the_key():
    msg = error_of(small(train={"batch": 32, "update_every": 8}))
    assert "train.update_every = 8 does nothing at train.batch = 32" in msg
    msg = error_of(small(train={"parameters": "shared", "n_push": 16}))
    assert "train.n_push = 16 does nothing with train.parameters = 'shared'" in msg
    msg = error_of(small(train={"parameters": "shared", "fc_push": "vectors"}))
    assert "train.fc_push" in msg
    msg = error_of(small(train={"parameters": "shared", "cadence_ramp": 8}))
    assert "train.cadence_ramp = 8 does nothing with train.parameters = 'shared'" in msg


def test_a_push_cadence_whose_weight_decay_would_remove_the_weights_is_rejected():
    msg = error_of(small(train={"n_push": 100_000}, optim={"lr": 0.1, "weight_decay": 0.0005}))
    assert "train.n_push" in msg and "weight decay" in msg
    # the store's own cadence (0) is the store's to check, where it resolves it (test_stores)
    config_from_dict(small(train={"parameters": "ps"}, optim={"lr": 1.0, "weight_decay": 0.002}))


# --- the job's own etcd cluster ---------------------------------------------------------------


def test_the_jobs_own_etcd_cluster_needs_copies_and_a_launcher_that_starts_it():
    assert (
        config_from_dict(small(cluster={"etcd": "job", "copies": 3, "ps": 3})).cluster.etcd == "job"
    )
    said = error_of(small(cluster={"etcd": "job"}))
    assert 'cluster.etcd = "job"' in said and "cluster.copies = 1" in said
    on_ray = small(cluster={"etcd": "job", "copies": 3, "ps": 3, "launcher": "ray"})
    assert config_from_dict(on_ray).cluster.etcd == "job"  # a member per Ray node


def test_job_made_etcd_certificates_need_the_jobs_etcd_on_ray():
    on_ray = {"etcd": "job", "etcd_tls": "job", "copies": 3, "ps": 3, "launcher": "ray"}
    assert config_from_dict(small(cluster=on_ray)).cluster.etcd_tls == "job"
    said = error_of(small(cluster={**on_ray, "launcher": "local"}))  # members on loopback
    assert 'cluster.etcd_tls = "job"' in said and "cluster.launcher = 'local'" in said
    said = error_of(small(cluster={**on_ray, "copies": 1, "ps": 1, "etcd": ""}))  # no etcd
    assert 'cluster.etcd_tls = "job"' in said and "cluster.copies = 1" in said
    for spaced in (" job", "job ", "/etc/etcd-tls\n"):  # what the controller would take verbatim
        said = error_of(small(cluster={**on_ray, "etcd_tls": spaced}))
        assert f"cluster.etcd_tls = {spaced!r}: leading or trailing spaces" in said


@pytest.mark.parametrize("value", [1.5, "2", True])
def test_evaluate_every_must_be_an_integer(value):
    assert "train.evaluate_every must be int" in error_of(small(train={"evaluate_every": value}))


@pytest.mark.parametrize(
    ("every", "evaluated"),
    [
        (1, [0, 1, 2, 3, 4, 5, 6]),  # the default: every epoch
        (3, [2, 5, 6]),  # every third, and the last though 7 is not a multiple of 3
        (7, [6]),
        (9, [6]),  # longer than the run: the last only
        (0, [6]),  # only the last
    ],
)
def test_evaluate_every_picks_every_nth_epoch_and_always_the_last(every, evaluated):
    train = config_from_dict(small(train={"epochs": 7, "evaluate_every": every})).train
    assert [epoch for epoch in range(7) if train.evaluates_after(epoch)] == evaluated


def test_the_etcd_election_timeout_is_checked_against_its_range_the_lease_and_the_etcd():
    copies = {"etcd": "job", "copies": 3, "ps": 3}
    chosen = config_from_dict(small(cluster={**copies, "etcd_election_ms": 500}))
    assert chosen.cluster.etcd_election_ms == 500
    assert config_from_dict(small(cluster=copies)).cluster.etcd_election_ms == 0  # hogwild's
    # the longest one hogwild's etcd start waits can wait out a first election for (review AE 5)
    assert config_from_dict(small(cluster={**copies, "etcd_election_ms": 5000}, ps={"lease_s": 8}))
    for wrong in (-1, 5, 5001, 40_000):
        said = error_of(small(cluster={**copies, "etcd_election_ms": wrong}))
        assert "cluster.etcd_election_ms must be 0 (hogwild's, 200) or 10 to 5000" in said
        assert f"got {wrong}" in said
    # etcd grants no lease shorter than 1.5 election timeouts: 1 s leases need <= 666 ms
    said = error_of(small(cluster={**copies, "etcd_election_ms": 700}, ps={"lease_s": 1}))
    assert "cluster.etcd_election_ms = 700 needs ps.lease_s >= 2" in said
    assert "1.5 election timeouts (1050 ms)" in said
    ok = small(cluster={**copies, "etcd_election_ms": 700}, ps={"lease_s": 2})
    assert config_from_dict(ok).ps.lease_s == 2


@pytest.mark.parametrize(
    ("cluster", "why"),
    [
        ({"etcd": "127.0.0.1:2379", "copies": 3, "ps": 3}, "cluster.etcd = '127.0.0.1:2379' is"),
        ({"etcd": "", "copies": 1}, "cluster.copies = 1"),
    ],
)
def test_an_etcd_election_timeout_no_member_is_started_with_is_said_unread_not_refused(
    cluster, why
):
    # Review AE 11: where hogwild starts no etcd member (an etcd given, or no copies) the key
    # is not read: a short ps.lease_s is not refused over it, and the driver warns it is unread.
    config = config_from_dict(
        small(cluster={**cluster, "etcd_election_ms": 700}, ps={"lease_s": 1})
    )
    said = etcd_election_unread(config.cluster)
    assert said.startswith("cluster.etcd_election_ms = 700 is not read: " + why), said
    started = config_from_dict(
        small(cluster={"etcd": "job", "copies": 3, "ps": 3}, ps={"lease_s": 1})
    )
    assert etcd_election_unread(started.cluster) is None  # 0: nothing to say
    chosen = small(cluster={"etcd": "job", "copies": 3, "ps": 3, "etcd_election_ms": 600})
    assert etcd_election_unread(config_from_dict(chosen).cluster) is None
