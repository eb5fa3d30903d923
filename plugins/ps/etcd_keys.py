"""How etcd's JSON gateway takes keys: as base64 text, and a prefix's keys as the range
``[prefix, after(prefix))``. One encoding for the client (:mod:`~hogwild_plugins.ps.etcd`), the
watch's polls (:mod:`~hogwild_plugins.ps.etcd_watch`) and its stream
(:mod:`~hogwild_plugins.ps.etcd_stream`)."""

from __future__ import annotations

import base64

__all__ = ["after", "b64"]


def b64(data: bytes) -> str:
    """``data`` as the gateway's JSON carries keys and values: base64, ASCII text."""
    return base64.b64encode(data).decode("ascii")


def after(prefix: bytes) -> bytes:
    """The first key after every key starting with ``prefix`` (a range's end); b"\\0" for all."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\0"
    return stripped[:-1] + bytes([stripped[-1] + 1])
