"""``hogwild.signals.die_with_parent``: a process that asked for it ends when its parent does, even
when the parent is SIGKILLed and runs no cleanup (how workers, pool helpers and the test
session's kernel warm-up end with their owners); one that did not ask outlives it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import psutil
import pytest

pytestmark = pytest.mark.kernel_free

GONE_WITHIN_S = 10.0  # a bound for a hang: the kernel signals the child at the parent's exit

CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from hogwild.signals import die_with_parent
    if sys.argv[1] == "ask":
        die_with_parent(signal.SIGKILL)
    print("ready", flush=True)
    time.sleep(60)
    """
)
PARENT = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    child.stdout.readline()  # asked (or not) before the parent goes; the pipes to the test
    # are this process's own, so the test reads to their end when it is gone
    print(child.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no cleanup: only the kernel can end the child
    """
)


def _orphan(mode: str) -> psutil.Process:
    parent = subprocess.run(
        [sys.executable, "-c", PARENT, CHILD, mode], capture_output=True, text=True, timeout=60
    )
    assert parent.returncode == -9, parent.stderr
    return psutil.Process(int(parent.stdout.split()[0]))


def _gone(child: psutil.Process) -> bool:
    try:
        child.wait(GONE_WITHIN_S)
        return True
    except psutil.TimeoutExpired:
        return False


def test_a_child_that_asked_dies_with_its_sigkilled_parent():
    child = _orphan("ask")
    assert _gone(child)


def test_a_child_that_did_not_ask_outlives_its_parent():
    child = _orphan("no")
    try:
        with pytest.raises(psutil.TimeoutExpired):
            child.wait(1.0)
    finally:
        child.kill()
        child.wait(GONE_WITHIN_S)
