"""``hogwild ps serve --copies 2`` while etcd does not answer: it says so at each try of its
first asks (the job's nonce, then its registration), and a SIGTERM then ends it at once with
status 143, as one that served would, instead of after the 30 s of tries (the driver SIGKILLs a
role 20 s after its SIGTERM, and a server SIGKILLed never gives its lease back).

The etcd here is a listening socket that never accepts: each ask is sent and never answered,
which is what a member that rejoins its cluster gives before it can serve.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from hogwild.net.ports import free_ports

pytestmark = pytest.mark.ps_kernels

TRY_LINE = "etcd did not answer its first read of the map (try 1;"
SAID_WITHIN_S = 120.0  # the server's start: imports and the kernels' load, then a 2 s ask
STOPPED_WITHIN_S = 10.0  # the ask under way (2 s) and the stop, far below the 30 s of tries


def test_a_sigterm_while_etcd_does_not_answer_ends_the_server_with_143(tmp_path):
    silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    log = tmp_path / "serve.log"
    process = None
    try:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        servers = ",".join(f"127.0.0.1:{port}" for port in free_ports(2))
        argv = [sys.executable, "-m", "hogwild.cli", "ps", "serve", "--threads", "1",
                "--copies", "2", "--lease-s", "2", "--servers", servers, "--index", "0",
                "--etcd", f"127.0.0.1:{silent.getsockname()[1]}"]  # fmt: skip
        with open(log, "w") as err:
            process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + SAID_WITHIN_S
        while TRY_LINE not in log.read_text():
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(STOPPED_WITHIN_S) == 143, log.read_text()[-3000:]
        said = log.read_text()
        assert "Traceback" not in said and "hogwild ps: serving" not in said, said[-3000:]
        assert "hogwild ps: stopped before serving (server 0: stopped while asking" in said
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)
        silent.close()
