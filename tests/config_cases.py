"""Small configs for the config tests: a tiny valid model, and the error a bad one raises."""

from __future__ import annotations

import pytest

from hogwild.config import config_from_dict
from hogwild.errors import ConfigError, HogwildError

SMALL_LAYERS = [
    {"type": "conv", "maps": 2, "kernel": 3},
    {"type": "maxpool", "size": 2},
    {"type": "fc", "units": 10},
    {"type": "softmax"},
]


def small(**sections) -> dict:
    data = {"model": {"input": [1, 8, 8], "layers": [dict(x) for x in SMALL_LAYERS]}}
    for name, table in sections.items():
        data.setdefault(name, {}).update(table)
    return data


def error_of(data) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert isinstance(info.value, HogwildError)
    return str(info.value)
