"""The SIMD kernels' tests again, with the vector width this host does not run.

The width is decided per host (:mod:`hogwild.model.simd`): 64 bytes on AVX-512 hosts, 32
elsewhere. One child process with ``HOGWILD_SIMD_BYTES`` set to the other width (and a numba cache
of its own, since the width changes the machine code) runs the checks of the product kernel
(:mod:`tests.unit.test_gemm`) and of the direct convolutions (:mod:`tests.unit.test_conv_direct`)
again, so the block and mask logic of both widths is checked on every host: LLVM splits 64-byte
vectors on a host without AVX-512, and runs 32-byte ones natively on a host with it. One child for
both files: the interpreter, pytest and the imports start once, and it compiles only the kernels
those files call.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hogwild.model.simd import VECTOR_BYTES
from tests import schedule
from tests.unit import test_conv_direct, test_gemm

OTHER_WIDTH = 32 if VECTOR_BYTES == 64 else 64
FILES = (test_gemm.__file__, test_conv_direct.__file__)
# the refusal of float64 is typed before any vector exists: the same at every width
SELECTION = "not refused"


def test_the_kernels_are_right_with_the_other_width(tmp_path: Path):
    env = dict(
        os.environ, HOGWILD_SIMD_BYTES=str(OTHER_WIDTH), NUMBA_CACHE_DIR=str(tmp_path / "numba")
    )
    # The child compiles into its own cache: it must not wait on this suite's warm-up.
    for name in (schedule.FOLDER_VARIABLE, schedule.PID_VARIABLE):
        env.pop(name, None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FILES]
    run = subprocess.run(
        [*command, "-k", SELECTION], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    passed = re.search(r"(\d+) passed", run.stdout)
    # every mode on every shape, and both convolution kernels on every shape, at least
    least = 5 * len(test_gemm.SHAPES) + 2 * len(test_conv_direct.SHAPES)
    assert passed is not None and int(passed.group(1)) >= least, run.stdout[-3000:]
