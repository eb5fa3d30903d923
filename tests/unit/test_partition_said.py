"""A stopped partition's last words (the parameter server's error, in the arena's ``said`` row)
reach its parent's one-line error: control characters in them become spaces, so a message
with a newline cannot forge another ``hogwild: ...`` line (hogwild/partition/process.py)."""

from __future__ import annotations

import numpy as np

from hogwild.partition.process import SAID_BYTES, read_said, write_said
from hogwild.shm.arena import Arena, ArenaLayout


def test_said_text_loses_its_control_characters_and_keeps_its_bound():
    layout = ArenaLayout()
    layout.add("said", np.uint8, (2, SAID_BYTES))
    with Arena.create("said test", layout) as arena:
        hostile = "bucket 3 stopped: disk\nhogwild: all done, exit 0\r\x1b[2K\u2028ok é"
        write_said(arena, 1, hostile)
        said = read_said(arena, 1)
        assert said == "bucket 3 stopped: disk hogwild: all done, exit 0  [2K ok é"
        assert not any(c in said for c in "\n\r\x1b\u2028")
        assert read_said(arena, 0) == ""  # the other partition's row untouched
        write_said(arena, 0, "x" * (2 * SAID_BYTES))
        assert read_said(arena, 0) == "x" * SAID_BYTES
