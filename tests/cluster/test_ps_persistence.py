"""Delayed persistence: SIGKILL a server mid-stream, restart it on its store: every shard comes
back at its last flushed version (values included); a corrupted store is detected. Also the
CLI's signals: SIGTERM and Ctrl-C stop a server after a final flush."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.serving.launch import ServeProcess
from hogwild_plugins.ps.storage import RECORD, RECORD_MAGIC, ShardStore

from hogwild.config import load_config
from hogwild.model.network import build_network

pytestmark = pytest.mark.ps_kernels

SERVE = ["--port", "0", "--threads", "1", "--ps.shard_kib=256", "--ps.flush_s=0.2"]
N_PARAMS = build_network(load_config().model, 10).n_params  # the bundled MNIST model


def flushed_state(store_dir) -> dict:
    store = ShardStore(
        store_dir, job="adam_mnist", n_params=N_PARAMS, shard_floats=65536, rule="sgd"
    )
    try:
        n_shards = -(-N_PARAMS // 65536)
        sizes = {s: min(65536, N_PARAMS - s * 65536) for s in range(n_shards)}
        return store.load(list(sizes), sizes, 0)
    finally:
        store.close()


def test_sigkill_mid_stream_then_restart_recovers_the_last_flush(tmp_path):
    store = tmp_path / "store"
    server = ServeProcess([*SERVE, "--store", str(store)])
    with server:
        address = server.start()
        client = PSClient([address], "adam_mnist", client_id=1, timeout_s=1.0, retries=1)
        client.assign(np.zeros(N_PARAMS, np.float32))  # values now count the pushes exactly
        acked = np.zeros(client.layout.n_shards, np.uint64)
        stop = threading.Event()

        def stream() -> None:
            ones = np.ones(N_PARAMS, np.float32)
            try:
                while not stop.is_set():
                    acked[:] = client.push_deltas(ones)
            except Exception:  # noqa: BLE001 - the server is killed under it
                pass

        pusher = threading.Thread(target=stream)
        pusher.start()
        try:
            deadline = time.monotonic() + 60
            while (acked < 20).any() or client_flushes(address) < 3:
                assert time.monotonic() < deadline, "no progress"
                time.sleep(0.05)
            server.kill()  # SIGKILL mid-stream: no final flush
        finally:
            stop.set()
            pusher.join(30)
            client.close()
    recovered = flushed_state(store)
    assert len(recovered) == -(-N_PARAMS // 65536)
    for shard, (version, values, _) in recovered.items():
        assert 1 <= version <= int(acked[shard]) + 1  # +1: the assignment
        assert (values == version - 1).all(), f"shard {shard} is not its version's state"

    again = ServeProcess([*SERVE, "--store", str(store)])
    with again:
        address = again.start()
        with PSClient([address], "adam_mnist", client_id=2) as client:
            out = np.empty(N_PARAMS, np.float32)
            versions = client.pull(out)
            for shard, (version, values, _) in recovered.items():
                lo = shard * 65536
                assert versions[shard] == version
                np.testing.assert_array_equal(out[lo : lo + values.size], values)
        assert again.stop(signal.SIGINT) == 0  # Ctrl-C: a final flush, exit 0
    assert any("final flush written" in line for line in again.lines)

    # a corrupted store is detected, naming the file
    corrupt_live_record(store, shard=0)
    broken = ServeProcess([*SERVE, "--store", str(store)])
    with pytest.raises(Exception, match=r"data\.mdb: record shard/\d+: checksum mismatch"):
        broken.start()


def corrupt_live_record(store, shard: int) -> None:
    """Flip a byte in the values of the record LMDB serves now (not an old copy of it)."""
    import lmdb

    env = lmdb.open(str(store), readonly=True, lock=False)
    with env.begin() as txn:
        live = bytes(txn.get(b"shard/%08d" % shard))
    env.close()
    raw = bytearray((store / "data.mdb").read_bytes())
    at = raw.find(live[: RECORD.size + 64])
    assert at >= 0 and live[:4] == RECORD_MAGIC
    raw[at + RECORD.size + 1000] ^= 0x5A
    (store / "data.mdb").write_bytes(bytes(raw))


def client_flushes(address: str) -> int:
    with PSClient([address], "adam_mnist", client_id=9, timeout_s=2.0) as probe:
        return probe.status()[0]["loss_window"]["flushes"]


def test_sigterm_flushes_and_exits_143_and_status_reports(tmp_path):
    server = ServeProcess([*SERVE, "--store", str(tmp_path / "s"), "--ps.flush_s=3600"])
    with server:
        address = server.start()
        with PSClient([address], "adam_mnist", client_id=1) as client:
            client.push_deltas(np.ones(N_PARAMS, np.float32))
            # acknowledged when queued: a pull is answered only after every push before it
            client.pull(np.empty(N_PARAMS, np.float32))
            status = client.status()[0]
        assert status["loss_window"]["updates"] == client.layout.n_shards
        assert status["loss_window"]["flushes"] == 0
        cli = [sys.executable, "-m", "hogwild.cli", "ps", "status", address, "--job", "adam_mnist"]
        text = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert text.returncode == 0, text.stderr
        assert "loss window" in text.stdout and "shard 0 (bucket 0): version 1" in text.stdout
        raw = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=60)
        assert json.loads(raw.stdout)["applied_requests"] == client.layout.n_shards
        assert server.stop(signal.SIGTERM) == 143
    assert "final flush written" in server.lines[-1]
    assert all(v == 1 for v, _, _ in flushed_state(tmp_path / "s").values())
