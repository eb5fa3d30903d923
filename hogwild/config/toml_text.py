"""A resolved config written back as TOML: what ``hogwild config show`` prints.

The text is a complete job: :func:`hogwild.config.load_config` reads it back to an equal
:class:`~hogwild.config.Config`. The config holds only strings, numbers, booleans, lists of
those and the list of layer tables, so a small writer does (the standard library reads TOML but
does not write it).
"""

from __future__ import annotations

import json
import math
from typing import Any


def config_to_toml(config) -> str:
    """``config`` (a :class:`~hogwild.config.Config`) as TOML text, one table per section."""
    data = config.to_dict()
    lines: list[str] = []
    for section, table in data.items():
        lines.append(f"[{section}]")
        for key, value in table.items():
            if section == "model" and key == "layers":
                continue  # array of tables, after the section's plain keys
            lines.append(f"{key} = {_value(value)}")
        if section == "model":
            lines.append("layers = [")
            for layer in table["layers"]:
                fields = ", ".join(f"{k} = {_value(v)}" for k, v in layer.items())
                lines.append(f"    {{{fields}}},")
            lines.append("]")
        lines.append("")
    return "\n".join(lines)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # the shortest text that reads back to the same float
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"a config value of type {type(value).__name__} has no TOML form: {value!r}")
