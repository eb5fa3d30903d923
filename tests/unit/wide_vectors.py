"""Rerun a SIMD kernel's test file with 64-byte vectors, as an AVX-512 host would compile them.

This host may have AVX2 only; a child process with ``HOGWILD_SIMD_BYTES=64`` (and a numba cache
of its own, since the width changes the machine code) compiles the kernels with 16-float vectors,
which LLVM splits for the host: the block and mask logic of the wide width is what is checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SELECTION = "float32 and not 64_byte"  # the block logic is the same in float64; no recursion


def rerun_with_64_byte_vectors(test_file: str, tmp_path: Path) -> str:
    """Run ``test_file``'s float32 cases in such a child; its pytest output, once it passed."""
    env = dict(os.environ, HOGWILD_SIMD_BYTES="64", NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file]
    run = subprocess.run(
        [*command, "-k", SELECTION], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout
