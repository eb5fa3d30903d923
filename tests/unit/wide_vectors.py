"""Rerun a SIMD kernel's test file with the vector width this host does not run.

The width is decided per host (:mod:`hogwild.model.simd`): 64 bytes on AVX-512 hosts, 32
elsewhere. A child process with ``HOGWILD_SIMD_BYTES`` set to the other width (and a numba cache
of its own, since the width changes the machine code) runs the file's float32 cases again, so
the block and mask logic of both widths is checked on every host: LLVM splits 64-byte vectors
on a host without AVX-512, and runs 32-byte ones natively on a host with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hogwild.model.simd import VECTOR_BYTES
from tests import schedule

OTHER_WIDTH = 32 if VECTOR_BYTES == 64 else 64
SELECTION = "float32 and not other_width"  # the block logic is the same in float64; no recursion


def rerun_with_the_other_width(test_file: str, tmp_path: Path) -> str:
    """Run ``test_file``'s float32 cases in such a child; its pytest output, once it passed."""
    env = dict(
        os.environ, HOGWILD_SIMD_BYTES=str(OTHER_WIDTH), NUMBA_CACHE_DIR=str(tmp_path / "numba")
    )
    # The child compiles into its own cache: it must not wait on this suite's warm-up.
    for name in (schedule.FOLDER_VARIABLE, schedule.PID_VARIABLE):
        env.pop(name, None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file]
    run = subprocess.run(
        [*command, "-k", SELECTION], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout
