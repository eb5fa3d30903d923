"""``tests.fork_launch``: a ``hogwild`` command a test starts is forked from the command server,
and behaves as the same command exec'd: its output, its exit status (a code, a signal), its
signals, its session, its command line; what a fork cannot give exactly is exec'd instead.

Each forked run is compared with the same command exec'd (inside ``fork_launch.exec_only()``), in
the same test.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import psutil
import pytest

from hogwild.net.ports import free_ports
from tests import fork_launch

pytestmark = [
    pytest.mark.ps_kernels,
    pytest.mark.skipif(subprocess.Popen is not fork_launch.ForkedPopen,
                       reason=f"{fork_launch.SWITCH_VARIABLE}=0: every command is exec'd"),
]  # fmt: skip

HOGWILD = [sys.executable, "-m", "hogwild.cli"]
SERVING_WITHIN_S = 120.0


def _both(*args, **options) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    forked = subprocess.run([*HOGWILD, *args], timeout=120, **options)
    with fork_launch.exec_only():
        fresh = subprocess.run([*HOGWILD, *args], timeout=120, **options)
    return forked, fresh


def test_output_and_exit_codes_are_an_execd_commands():
    forked, fresh = _both("--version", capture_output=True, text=True, input="ignored\n")
    assert (forked.returncode, forked.stdout, forked.stderr) == (0, "hogwild 0.1.0\n", "")
    assert (fresh.returncode, fresh.stdout, fresh.stderr) == (0, "hogwild 0.1.0\n", "")
    forked, fresh = _both("train", "--no-such-flag", stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)  # fmt: skip
    assert forked.returncode == fresh.returncode == 2
    assert b"unrecognized argument --no-such-flag" in forked.stdout
    assert forked.stdout == fresh.stdout


def _serve(**options) -> subprocess.Popen:
    """``hogwild ps serve`` on a free port, once it says it serves."""
    (port,) = free_ports(1)
    process = subprocess.Popen(
        [*HOGWILD, "ps", "serve", "--threads", "1", "--port", str(port)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **options,
    )  # fmt: skip
    said = b""  # read unbuffered: a line left in a reader's buffer would wait for the next
    deadline = time.monotonic() + SERVING_WITHIN_S
    while b"hogwild ps: serving" not in said:
        left = deadline - time.monotonic()
        part = os.read(process.stderr.fileno(), 4096) if _readable(process.stderr, left) else b""
        if not part:  # it ended, or said nothing in time
            process.kill()
            process.wait()
            pytest.fail(f"not serving (exit {process.returncode}): {said.decode()[-2000:]}")
        said += part
    return process


def _readable(stream, timeout_s: float) -> bool:
    return timeout_s > 0 and bool(select.select([stream], [], [], timeout_s)[0])


def _stopped(process: subprocess.Popen, signum: int) -> int:
    try:
        process.send_signal(signum)
        code = process.wait(timeout=30)
        process.stderr.read()
        return code
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_forked_server_is_the_command_servers_child_and_stops_as_an_execd_one(signum):
    process = _serve(start_new_session=True)
    try:
        proc = psutil.Process(process.pid)
        assert proc.ppid() == fork_launch.server_pid() != os.getpid()
        assert " -m hogwild.cli ps serve --threads 1" in " ".join(proc.cmdline())
        assert os.getsid(process.pid) == process.pid  # start_new_session
        assert process.poll() is None
    finally:
        forked_code = _stopped(process, signum)
    with fork_launch.exec_only():
        process = _serve()
    assert psutil.Process(process.pid).ppid() == os.getpid()
    assert os.getsid(process.pid) == os.getsid(0)  # no session asked for: the test's
    assert _stopped(process, signum) == forked_code
    if signum == signal.SIGKILL:
        assert forked_code == -signal.SIGKILL


def test_a_timeout_kills_a_forked_command_and_a_changed_environment_is_execd():
    (port,) = free_ports(1)
    argv = [*HOGWILD, "ps", "serve", "--threads", "1", "--port", str(port)]
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1.0)
    assert time.monotonic() - started < 30  # killed and reaped, not waited out
    env = {**os.environ, "HOGWILD_LOG_LEVEL": "debug"}  # read as hogwild imports: exec'd
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        assert psutil.Process(process.pid).ppid() == os.getpid()
    finally:
        process.kill()
        assert process.wait(timeout=30) == -signal.SIGKILL
