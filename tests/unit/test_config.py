"""The typed TOML configuration of :mod:`hogwild.config`.

Proves that the bundled config loads with the values it documents; that ``section.key`` and
``model.layers.N.key`` overrides apply, with strings parsed as TOML literals; that every bad input
(unknown section or key, wrong type, unknown layer type or key, missing layer key, invalid TOML,
missing file) raises :class:`ConfigError`
with a message naming the key and what was expected; and that ``to_dict()`` round-trips through
``config_from_dict`` (and through JSON, as checkpoints and metrics files store it). Values out
of range are in ``test_config_checks.py``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hogwild.config import (
    LAYER_KEYS,
    Config,
    LayerConfig,
    config_from_dict,
    default_config_path,
    load_config,
)
from hogwild.errors import ConfigError
from tests.config_cases import SMALL_LAYERS, error_of, small


def override_error(overrides) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    return str(info.value)


# --- the bundled config -----------------------------------------------------------------------


def test_bundled_config_loads_with_documented_values():
    config = load_config()
    assert isinstance(config, Config)
    assert config.origin == str(default_config_path())
    assert default_config_path().is_file()
    assert config.model.input == (1, 28, 28)
    assert [layer.type for layer in config.model.layers] == [
        "conv",
        "relu",
        "maxpool",
        "conv",
        "relu",
        "maxpool",
        "dropout",
        "fc",
        "relu",
        "dropout",
        "fc",
        "relu",
        "dropout",
        "fc",
        "softmax",
    ]
    assert config.model.layers[0] == LayerConfig(type="conv", maps=10, kernel=5)
    assert config.model.layers[3].maps == 20
    assert config.model.layers[2].size == 2 and config.model.layers[2].stride == 2
    assert [layer.units for layer in config.model.layers if layer.type == "fc"] == [400, 400, 10]
    assert [layer.p for layer in config.model.layers if layer.type == "dropout"] == [0.25, 0.5, 0.5]
    assert config.optim.rule == "sgd" and config.optim.lr == 0.006
    assert config.optim.schedule == "cosine" and config.optim.weight_decay == 0.001
    assert config.train.epochs == 60
    paper = config.model.without_dropout()  # Adam's model: what the peers and oracles compute
    assert [layer.type for layer in paper.layers] == [
        layer.type for layer in config.model.layers if layer.type != "dropout"
    ]
    assert len(paper.layers) == 12 and paper.input == config.model.input
    assert config.train.batch == 1 and config.train.epoch_fraction == 1.0
    assert config.data.mean == 0.1307 and config.data.std == 0.3081
    assert config.output.progress is True


def test_load_config_from_a_user_file(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(
        "[model]\ninput = [1, 8, 8]\n"
        '[[model.layers]]\ntype = "fc"\nunits = 10\n'
        '[[model.layers]]\ntype = "softmax"\n'
        "[optim]\nlr = 0.5\n"
    )
    config = load_config(path, overrides={"train.epochs": 3})
    assert config.origin == str(path)
    assert config.optim.lr == 0.5 and config.train.epochs == 3
    assert config.optim.rule == "sgd"  # a key the file leaves out keeps its default


def test_config_is_immutable():
    config = load_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.optim.lr = 1.0  # type: ignore[misc]


# --- overrides --------------------------------------------------------------------------------


def test_string_overrides_parse_as_toml_literals():
    config = load_config(
        overrides={
            "optim.lr": "0.05",
            "output.progress": "false",
            "train.sync": "true",
            "train.batch": "8",
            "optim.weight_decay": "1e-4",
            "data.source": "/data/my mnist",  # not a literal: stays a string
            "model.init": "xavier",
        }
    )
    assert config.optim.lr == 0.05 and isinstance(config.optim.lr, float)
    assert config.output.progress is False and config.train.sync is True
    assert config.train.batch == 8 and isinstance(config.train.batch, int)
    assert config.optim.weight_decay == 1e-4
    assert config.data.source == "/data/my mnist"
    assert config.model.init == "xavier"


def test_typed_and_string_overrides_mean_the_same():
    assert load_config(overrides={"optim.lr": 0.05}) == load_config(overrides={"optim.lr": "0.05"})


def test_override_returns_a_new_config_and_keeps_the_origin():
    base = load_config()
    changed = base.override({"train.epochs": "2"})
    assert base.train.epochs == 60 and changed.train.epochs == 2
    assert changed.origin == base.origin


def test_layer_overrides():
    config = load_config(
        overrides={
            "model.layers.0.maps": "16",
            "model.layers.0.padding": "same",
            "model.layers.7.units": 128,
            "model.layers.1.type": "tanh",
            "model.layers.2.stride": 1,
        }
    )
    layers = config.model.layers
    assert layers[0].maps == 16 and layers[0].padding == "same" and layers[0].kernel == 5
    assert layers[7].units == 128
    assert layers[1].type == "tanh"
    assert layers[2].size == 2 and layers[2].stride == 1


def test_override_replaces_the_whole_layer_stack():
    config = load_config(
        overrides={"model.layers": '[{type = "fc", units = 10}, {type = "softmax"}]'}
    )
    assert [layer.type for layer in config.model.layers] == ["fc", "softmax"]


def test_override_of_unknown_section():
    msg = override_error({"optimizer.lr": 0.1})
    assert "optimizer.lr" in msg and "optim" in msg and "model" in msg


def test_override_without_a_section():
    msg = override_error({"lr": 0.1})
    assert "'lr'" in msg and "section" in msg


def test_override_of_unknown_key_lists_known_keys():
    msg = override_error({"optim.learning_rate": "0.1"})
    assert "optim.learning_rate" in msg
    assert "lr" in msg and "momentum" in msg and "weight_decay" in msg


def test_override_of_missing_layer():
    msg = override_error({"model.layers.15.units": 3})
    assert "15" in msg and "there are 15" in msg
    msg = override_error({"model.layers.first.units": 3})
    assert "first" in msg


def test_override_of_unknown_layer_key():
    msg = override_error({"model.layers.7.kernel": 3})
    assert "model.layers[7]" in msg and "kernel" in msg and "units" in msg


def test_override_below_a_value():
    msg = override_error({"optim.lr.max": 1})
    assert "optim.lr" in msg and "not a table" in msg


def test_override_with_wrong_type_names_key():
    msg = override_error({"optim.lr": "fast"})
    assert "optim.lr" in msg and "float" in msg and "'fast'" in msg


# --- types ------------------------------------------------------------------------------------


def test_int_is_accepted_where_a_float_is_expected():
    config = config_from_dict(small(optim={"lr": 1, "momentum": 0}, data={"std": 2}))
    assert config.optim.lr == 1.0 and isinstance(config.optim.lr, float)
    assert isinstance(config.optim.momentum, float) and isinstance(config.data.std, float)
    layers = small()["model"]["layers"]
    layers.insert(3, {"type": "dropout", "p": 0})
    config = config_from_dict({"model": {"input": [1, 8, 8], "layers": layers}})
    assert config.model.layers[3].p == 0.0 and isinstance(config.model.layers[3].p, float)


@pytest.mark.parametrize(
    ("section", "key", "value", "expected"),
    [
        ("train", "batch", 2.5, "int"),
        ("train", "epochs", 4.0, "int"),
        ("train", "epochs", True, "int"),
        ("train", "sync", 1, "bool"),
        ("train", "sync", "yes", "bool"),
        ("optim", "lr", "0.1", "float"),
        ("optim", "lr", True, "float"),
        ("optim", "rule", 1, "str"),
        ("output", "keep_checkpoints", "2", "int"),
        ("data", "source", ["a"], "str"),
    ],
)
def test_wrong_type_names_key_and_expected_type(section, key, value, expected):
    msg = error_of(small(**{section: {key: value}}))
    assert f"{section}.{key}" in msg and expected in msg and repr(value) in msg


@pytest.mark.parametrize(
    "layer", [{"type": "conv", "maps": 2.0, "kernel": 3}, {"type": "fc", "units": "10"}]
)
def test_wrong_layer_value_type(layer):
    data = small()
    data["model"]["layers"][0 if layer["type"] == "conv" else 2] = layer
    msg = error_of(data)
    assert "model.layers[" in msg and "int" in msg


def test_wrong_dropout_and_padding_types():
    data = small()
    data["model"]["layers"][0]["padding"] = 1.5
    assert "padding" in error_of(data) and "str" in error_of(data)
    data["model"]["layers"][0]["padding"] = -1
    assert "integer padding must be >= 0" in error_of(data)
    data["model"]["layers"][0]["padding"] = 1  # PyTorch's Conv2d(padding=1)
    assert config_from_dict(data).model.layers[0].padding == 1
    data = small()
    data["model"]["layers"].insert(2, {"type": "dropout", "p": "half"})
    msg = error_of(data)
    assert "dropout.p" in msg and "float" in msg


@pytest.mark.parametrize("value", [[1, 28], [0, 28, 28], [1, 28, 28.0], "1x28x28", [1, True, 3]])
def test_bad_input_shape(value):
    msg = error_of({"model": {"input": value, "layers": SMALL_LAYERS}})
    assert "model.input" in msg and "[channels, height, width]" in msg


# --- unknown names ----------------------------------------------------------------------------


def test_unknown_section_lists_known_sections():
    msg = error_of(small(trainer={"epochs": 1}))
    assert "trainer" in msg
    for section in ("model", "optim", "train", "data", "output"):
        assert section in msg


def test_unknown_key_lists_known_keys():
    msg = error_of(small(train={"epoch": 3}))
    assert "train.epoch" in msg
    for key in ("epochs", "batch", "workers", "epoch_fraction", "seed"):
        assert key in msg


def test_section_that_is_not_a_table():
    msg = error_of({"optim": 0.1})
    assert "[optim]" in msg and "table" in msg
    assert "table" in error_of([1, 2])


def test_unknown_layer_type_lists_known_types():
    data = small()
    data["model"]["layers"][1] = {"type": "lppool", "size": 2}
    msg = error_of(data)
    assert "model.layers[1]" in msg and "'lppool'" in msg
    for kind in LAYER_KEYS:
        assert kind in msg


def test_unknown_layer_key_lists_the_keys_it_takes():
    data = small()
    data["model"]["layers"][0]["dilation"] = 2
    msg = error_of(data)
    assert "model.layers[0] (conv)" in msg and "dilation" in msg
    for key in ("maps", "kernel", "stride", "padding"):
        assert key in msg
    data = small()
    data["model"]["layers"][3]["units"] = 10
    msg = error_of(data)
    assert "model.layers[3] (softmax)" in msg and "units" in msg and "no keys" in msg


@pytest.mark.parametrize(
    ("layer", "missing"),
    [
        ({"type": "conv", "kernel": 3}, "maps"),
        ({"type": "conv", "maps": 3}, "kernel"),
        ({"type": "fc"}, "units"),
    ],
)
def test_missing_required_layer_key(layer, missing):
    data = small()
    data["model"]["layers"][0] = layer
    msg = error_of(data)
    assert "model.layers[0]" in msg and repr(missing) in msg and "missing" in msg


def test_layer_without_type():
    data = small()
    data["model"]["layers"][1] = {"size": 2}
    msg = error_of(data)
    assert "model.layers[1]" in msg and "'type'" in msg


def test_layers_must_be_a_non_empty_list():
    assert "model.layers" in error_of({"model": {"layers": []}})
    assert "model.layers" in error_of({"model": {"layers": {"type": "softmax"}}})


def test_softmax_must_be_last():
    data = small()
    data["model"]["layers"] = [{"type": "softmax"}, {"type": "fc", "units": 10}]
    msg = error_of(data)
    assert "model.layers[0] (softmax)" in msg and "last" in msg
    data["model"]["layers"] = [{"type": "fc", "units": 10}, {"type": "relu"}]
    msg = error_of(data)
    assert "last layer must be softmax" in msg and "relu" in msg


# --- files ------------------------------------------------------------------------------------


def test_invalid_toml_file_names_the_file(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[optim]\nlr = = 0.1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and "not valid TOML" in str(info.value)


def test_missing_file_names_the_file(tmp_path):
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and "cannot read" in str(info.value)


def test_errors_from_a_file_name_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(default_config_path().read_text().replace("lr = 0.006", "lr = -1.0"))
    with pytest.raises(ConfigError) as info:
        load_config(Path(path))
    assert str(path) in str(info.value) and "optim.lr" in str(info.value)


# --- round trip -------------------------------------------------------------------------------


def test_to_dict_round_trips():
    config = load_config(overrides={"optim.lr": 0.2, "model.layers.0.padding": "same"})
    data = config.to_dict()
    assert set(data) == {"model", "optim", "train", "data", "output", "ps", "cluster"}
    assert data["model"]["input"] == [1, 28, 28]
    assert data["model"]["layers"][0] == {
        "type": "conv",
        "maps": 10,
        "kernel": 5,
        "stride": 1,
        "padding": "same",
    }
    assert data["model"]["layers"][-1] == {"type": "softmax"}
    assert config_from_dict(data, origin=config.origin) == config
    assert config_from_dict(json.loads(json.dumps(data)), origin=config.origin) == config


def test_to_dict_round_trips_every_layer_type():
    layers = [
        {"type": "conv", "maps": 2, "kernel": 3, "stride": 2, "padding": "same"},
        {"type": "sigmoid"},
        {"type": "maxpool", "size": 3},
        {"type": "tanh"},
        {"type": "fc", "units": 5},
        {"type": "relu"},
        {"type": "dropout", "p": 0.25},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
    config = config_from_dict({"model": {"input": [3, 9, 9], "layers": layers}})
    data = config.to_dict()
    assert data["model"]["layers"][2] == {"type": "maxpool", "size": 3, "stride": 3}
    assert data["model"]["layers"][6] == {"type": "dropout", "p": 0.25}
    assert config_from_dict(data) == config
