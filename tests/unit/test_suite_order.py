"""The suite's order (``tests/conftest.py``): within the unit tier, the tests marked
``warmed_kernels`` (they call kernels the warm-up compiles) come after every other unit test,
so that by then ``tests.warm_kernels`` has compiled those kernels on the other core and they load
them instead of compiling them a second time beside it.

Checked on real files, collected by pytest in a child process (only unit files: no warm-up starts).
"""

from __future__ import annotations

import subprocess
import sys

MARKED = "tests/unit/test_cluster_records.py"  # marked warmed_kernels
UNMARKED = "tests/unit/test_schedule.py"


def collected(repo_root, *files: str) -> list[str]:
    """The node ids pytest collects from ``files``, in the order it would run them."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*command, *files], cwd=repo_root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_unit_tests_calling_the_jobs_kernels_run_after_the_other_unit_tests(repo_root):
    ids = collected(repo_root, MARKED, UNMARKED)  # named first, marked first
    marked = [i for i in ids if i.startswith(MARKED)]
    unmarked = [i for i in ids if i.startswith(UNMARKED)]
    assert marked and unmarked, ids
    assert ids == unmarked + marked
