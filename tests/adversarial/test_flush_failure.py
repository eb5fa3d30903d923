"""A parameter server whose store's disk fills: failed flushes are a recorded, visible state.

The store lives on a size-limited tmpfs (root's own permissions do not stop root; a full file
system does), filled for real by another file. While it is full every flush fails: the server
serves on (its memory holds every acknowledged update), the failure is in its status and gauges
(``flush_failures``, ``flush_failing_s``, the loss window's error) and the loss window grows; once
there is room the next flush writes every shard and the failure state clears. A final flush
that fails is reported by ``stop()`` (``hogwild ps serve`` exits 1 then), and a server started
again on the store recovers the last round that was written, whole.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.serving.cli import format_status
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.net.metrics import gauges

N = 4096
GEOMETRY = ModelGeometry(N)  # shard_kib=4: four shards of 1024 floats

pytestmark = pytest.mark.ps_kernels


@contextlib.contextmanager
def small_tmpfs(path, size: str = "512k"):
    """A tmpfs of ``size`` mounted at ``path`` (skips the test where mounting is not allowed)."""
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path) -> str:
    """Fill the file system of ``path`` with one file; its name."""
    filler = os.path.join(path, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, bytes(65536))
    except OSError:  # ENOSPC: full
        pass
    finally:
        os.close(fd)
    return filler


def wait_for(predicate, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not (found := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
    return found


def test_flushes_to_a_full_disk_are_recorded_visible_and_recover(tmp_path):
    with small_tmpfs(tmp_path / "disk") as disk:
        store = str(disk / "store")
        kw = dict(job="flush", shard_kib=4, threads=1, store=store, flush_s=0.05, rule="sgd")
        with local_server(GEOMETRY, **kw) as server:
            with PSClient([str(server.address)], "flush", client_id=3, timeout_s=5.0) as client:
                client.push_deltas(np.ones(N, np.float32))
                wait_for(lambda: server.status()["loss_window"]["updates"] == 0, "no flush")
                filler = fill(disk)
                client.push_deltas(np.ones(N, np.float32))
                status = wait_for(
                    lambda: (s := server.status())["flush_failures"] >= 2 and s, "no failure"
                )
                assert "No space left" in status["loss_window"]["error"]
                assert status["flush_failing_s"] > 0 and status["loss_window"]["updates"] > 0
                found = {f.name: f.samples[0].value for f in gauges("ps", "ps 0", status)}
                assert found["hogwild_ps_flush_failures"] >= 2
                assert found["hogwild_ps_flush_failing_s"] > 0
                assert "FLUSHES FAILING" in format_status(status)  # `hogwild ps status`
                out = np.zeros(N, np.float32)
                client.pull(out)  # it serves on: its memory holds every acknowledged update
                np.testing.assert_array_equal(out, 2.0)
                os.remove(filler)  # room again: the next round writes every shard
                status = wait_for(
                    lambda: (s := server.status())["flush_failing_s"] == 0 and s, "no recovery"
                )
                assert status["loss_window"]["error"] is None
                wait_for(lambda: server.status()["loss_window"]["updates"] == 0, "not flushed")
                flushed = {s["shard"]: s["flushed"] for s in server.status()["shards"]}
                filler = fill(disk)
                client.push_deltas(np.ones(N, np.float32))  # 3.0, never on disk
            assert server.stop() is False  # the final flush failed: `hogwild ps serve` exits 1
        # a server started again on the store recovers the last round written, whole
        os.remove(filler)
        with local_server(GEOMETRY, **kw) as again:
            assert {s["shard"]: s["flushed"] for s in again.status()["shards"]} == flushed
            for shard in again.shards:
                np.testing.assert_array_equal(shard.values, 2.0)
