"""Data servers (Adam section 3.1) on loopback: what they serve, what they refuse, failover.

Batches read over the network through a :class:`~hogwild.data.remote.RemoteReader` (and a
worker's feed over it) equal a worker's own reads of idx files and of an LMDB cache, with and
without augmentation. Malformed frames and requests with mutated header bits each get one reply
(an error naming what was wrong) and the server keeps serving. A reader moves to the other server
when one stops, and names both when neither answers. ``hogwild train`` with its data from two
``hogwild data serve`` processes trains to the same accuracy as reading the idx files itself, and
a job whose data server is SIGKILLed mid-epoch finishes on the other one (without failover its
worker's reads fail). The servers stop with 143 on SIGTERM and 0 on Ctrl-C, leaving nothing.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque

import numpy as np
import pytest
import zmq

import hogwild
from bench.support.paper_job import PAPER_OVERRIDES  # Adam's model on the old schedule: learns fast
from hogwild.data.augment import AugmentSpec
from hogwild.data.cache import open_cache
from hogwild.data.feed import ArrayReader, WorkerFeed
from hogwild.data.ingest import ingest_arrays
from hogwild.data.remote import RemoteReader, all_silent, describe_server, describe_servers
from hogwild.data.resident import Delivery, load_source
from hogwild.data.server import DataServer
from hogwild.errors import DataError
from hogwild.net.address import parse_address
from hogwild.net.channel import Cancelled, Peers
from hogwild.net.wire import HEADER_SIZE, DType, Header, MsgType, pack_header, unpack_header

READY = re.compile(r"^hogwild data: serving .* on (\S+)$")
TIMEOUT_S = 60.0


class DataServe:
    """``hogwild data serve ARGS`` as a child process, ready once it printed its ready line."""

    def __init__(self, *args: str) -> None:
        command = [sys.executable, "-m", "hogwild.cli", "data", "serve", *args]
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True)  # fmt: skip
        self.lines: deque[str] = deque(maxlen=50)
        self.address: str | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip())
            match = READY.match(line.rstrip())
            if match:
                self.address = match.group(1)
                self._ready.set()

    def wait_ready(self) -> str:
        deadline = time.monotonic() + TIMEOUT_S
        while not self._ready.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                raise AssertionError(f"hogwild data serve not ready: {list(self.lines)}")
        return self.address

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            code = self.process.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._reader.join(5.0)
        self.process.stderr.close()
        return code


def _status(address: str) -> dict:
    text = json.dumps({"op": "status"}).encode()
    header = Header(MsgType.CONTROL, dtype=DType.UINT8, shape=(len(text),), frames=1)
    with Peers([address], sender=99, timeout_s=2.0, retries=1) as peers:
        reply, frames = peers.request(0, header, [text])
    return json.loads(bytes(frames[0]))


@pytest.fixture
def two_servers(mnist_dir, request):
    """Two ``hogwild data serve`` processes of the MNIST idx files (extra args: the param)."""
    extra = getattr(request, "param", ())
    servers = [DataServe(str(mnist_dir), "--port", "0", *extra) for _ in range(2)]
    try:
        yield servers, [s.wait_ready() for s in servers]
    finally:
        codes = [s.stop() for s in servers]
    assert all(code in (143, -signal.SIGKILL) for code in codes), codes


@pytest.fixture(scope="module")
def rgb_cache(tmp_path_factory):
    out = tmp_path_factory.mktemp("cache") / "rgb"
    rng = np.random.default_rng(1)
    splits = {
        name: (rng.integers(0, 256, (n, 20, 24, 3), np.uint8), rng.integers(0, 4, n))
        for name, n in (("train", 600), ("test", 150))
    }
    ingest_arrays(out, splits)
    return out


def _in_process(path, augment: str = "", seed: int = 0) -> DataServer:
    spec = AugmentSpec.parse(augment) if augment else None
    delivery = Delivery(load_source(str(path)), augment=spec, seed=seed)
    server = DataServer(delivery, parse_address("127.0.0.1:0"), threads=1)
    server.start()
    return server


def _local(reader, spec, seed, epoch, idx, train):
    images, labels = [], []
    with WorkerFeed(reader, batch=100, augment=spec, seed=seed, train=train) as feed:
        feed.start_epoch(epoch, idx)
        for batch in feed:
            images.append(batch.images.copy())
            labels.append(batch.labels.copy())
    return np.concatenate(images), np.concatenate(labels)


def _served(reader: RemoteReader, epoch: int, idx: np.ndarray, train: bool):
    """Read as a worker's feed does: no augmentation of its own, the layout passed through."""
    images, labels = [], []
    with WorkerFeed(reader, batch=100, train=train, channels_first=False) as feed:
        feed.start_epoch(epoch, idx, reader.for_epoch(epoch) if train else None)
        for batch in feed:
            images.append(batch.images.copy())
            labels.append(batch.labels.copy())
    return np.concatenate(images), np.concatenate(labels)


@pytest.mark.parametrize(
    "kind, augment", [("idx", ""), ("idx", "mnist"), ("cache", "crop=16,hflip")]
)
def test_served_batches_equal_a_workers_own_reads(kind, augment, mnist_dir, rgb_cache):
    path = rgb_cache if kind == "cache" else mnist_dir
    spec = AugmentSpec.parse(augment) if augment else None
    servers = [_in_process(path, augment, seed=3) for _ in range(2)]
    rng = np.random.default_rng(4)
    try:
        addresses = [str(s.address) for s in servers]
        for split in ("train", "test"):
            if kind == "cache":
                local = open_cache(path, split)
            else:
                held = servers[0].delivery.source.splits[split]
                local = ArrayReader(held.reader.images, held.labels)
            with RemoteReader(addresses, split, timeout_s=5.0) as remote:
                assert remote.shape == servers[0].delivery.shape
                for epoch in (0, 2) if split == "train" else (0,):
                    idx = rng.permutation(len(local.labels))[:333]
                    want = _local(local, spec, 3, epoch, idx, split == "train")
                    got = _served(remote, epoch, idx, split == "train")
                    np.testing.assert_array_equal(got[0], want[0])
                    np.testing.assert_array_equal(got[1], want[1])
            if hasattr(local, "close"):
                local.close()
        batches = [s.status()["batches"] for s in servers]
        assert min(batches) > 0, batches  # reads take turns over the servers
    finally:
        for server in servers:
            server.stop()


def test_malformed_and_mutated_requests_get_errors_and_the_server_keeps_serving(mnist_dir):
    server = _in_process(mnist_dir)
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address.endpoint)
    good = Header(MsgType.BATCH, job=server.data_id, sender=5, target=0, aux=1,
                  dtype=DType.INT64, shape=(3,), frames=1)  # fmt: skip
    indices = np.array([7, 0, 59999], np.int64)

    def exchange(*frames) -> tuple[Header, list]:
        sock.send_multipart(list(frames))
        assert sock.poll(5000), f"no reply to {frames[0][:16]!r}..."
        head, *rest = sock.recv_multipart()
        return unpack_header(head), rest

    try:
        malformed = [
            [b"x"],  # not a header
            [pack_header(good)[:-1], indices.tobytes()],  # a header one byte short
            [b"XXXX" + pack_header(good)[4:], indices.tobytes()],  # bad magic
            [pack_header(good)],  # the indices frame missing
            [pack_header(good), indices.tobytes(), b"extra"],  # a frame too many
            [pack_header(good), indices.tobytes()[:-1]],  # a truncated frame
        ]
        for frames in malformed:
            reply, rest = exchange(*frames)
            assert reply.type == MsgType.ERROR and rest and rest[0], frames
        rng = np.random.default_rng(9)
        kinds = set()
        for seq in range(1, 301):  # one bit of a valid request flipped at random
            head = bytearray(pack_header(good._replace(seq=seq)))
            bit = int(rng.integers(0, HEADER_SIZE * 8))
            head[bit // 8] ^= 1 << (bit % 8)
            reply, rest = exchange(bytes(head), indices.tobytes())
            kinds.add(reply.type)
            if reply.type == MsgType.ERROR:
                assert rest[0].decode()  # says what was wrong
        assert MsgType.ERROR in kinds
        reply, (images, labels) = exchange(pack_header(good._replace(seq=999)), indices.tobytes())
        assert reply.type == MsgType.DATA and reply.shape == (3, 1, 28, 28)
        held = server.delivery.source.splits["train"]
        np.testing.assert_array_equal(np.frombuffer(labels, np.int32), held.labels[indices])
        status = server.status()
        assert server.alive and sum(status["errors"].values()) >= len(malformed)
        assert "BAD_HEADER" in status["errors"] and "BAD_FRAMES" in status["errors"]
    finally:
        sock.close(0)
        context.term()
        server.stop()


def test_a_reader_moves_on_when_a_server_stops_and_names_them_all_when_none_answers(mnist_dir):
    servers = [_in_process(mnist_dir) for _ in range(2)]
    addresses = [str(s.address) for s in servers]
    out, labels = np.empty((64, 1, 28, 28), np.uint8), np.empty(64, np.int32)
    idx = np.arange(64, dtype=np.int64)
    try:
        assert not all_silent(addresses) and not all_silent([])  # the driver's restart probe
        with RemoteReader(addresses, "train", timeout_s=0.3) as reader:
            reader.read(idx, out, labels)
            servers[0].stop()
            assert not all_silent(addresses)  # one still answers: a replica's restart goes on
            for _ in range(4):  # every read served, the stopped server left out after one try
                reader.read(idx, out, labels)
            assert reader.failovers == 1
            np.testing.assert_array_equal(
                labels, servers[1].delivery.source.splits["train"].labels[:64]
            )
            servers[1].stop()
            assert all_silent(addresses)  # none answers: the driver holds a replica's restart
            with pytest.raises(DataError) as caught:
                reader.read(idx, out, labels)
            assert all(a in str(caught.value) for a in addresses)
            assert "no data server could serve 64 train records" in str(caught.value)
    finally:
        for server in servers:
            server.stop()


def test_a_start_waits_for_a_data_server_that_comes_back_and_fails_at_once_without_a_wait(
    mnist_dir, capfd
):
    """A replica restarted while its job's one data server is being started again (lost with
    its host) waits for it (data.wait_s) instead of failing its start, and a restart, at once."""
    with socket.socket() as probe:  # a port nothing listens on, for the server to come back at
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    with pytest.raises(DataError, match="no data server answered"):
        describe_servers([address], timeout_s=0.2)  # no wait: one round
    started: list[DataServer] = []

    def come_back() -> None:
        time.sleep(1.5)
        delivery = Delivery(load_source(str(mnist_dir)))
        server = DataServer(delivery, parse_address(address), threads=1)
        server.start()
        started.append(server)

    back = threading.Thread(target=come_back)
    back.start()
    try:
        described = describe_servers([address], timeout_s=0.2, wait_s=60)
        assert described["answering"] == [address] and described["splits"]["train"] == 60000
        assert "waiting up to 60 s (data.wait_s)" in capfd.readouterr().err
    finally:
        back.join()
        for server in started:
            server.stop()


def test_a_read_waiting_on_a_silent_server_ends_at_once_when_the_reader_is_cancelled(mnist_dir):
    """A worker leaving while its read waits on a data server that died must not wait for the
    read's timeouts: :meth:`RemoteReader.cancel` (from another thread) ends it now."""
    server = _in_process(mnist_dir)
    out, labels = np.empty((64, 1, 28, 28), np.uint8), np.empty(64, np.int32)
    idx = np.arange(64, dtype=np.int64)
    try:
        with RemoteReader([str(server.address)], "train", timeout_s=30.0) as reader:
            reader.read(idx, out, labels)
            server.stop()  # nothing answers now: a read would wait 30 s, twice
            ended: list = []

            def read() -> None:
                began = time.monotonic()
                try:
                    reader.read(idx, out, labels)
                except BaseException as exc:  # noqa: BLE001 - what ended it is the finding
                    ended.append((exc, time.monotonic() - began))

            reading = threading.Thread(target=read)
            reading.start()
            time.sleep(0.3)  # the read is under way (waiting on its reply)
            assert reading.is_alive()
            reader.cancel()
            reading.join(10.0)
            assert not reading.is_alive(), "the cancelled read still waits"
            ((exc, took),) = ended
            assert isinstance(exc, Cancelled) and took < 10.0, (exc, took)
            with pytest.raises(Cancelled):  # every later read is refused
                reader.read(idx, out, labels)
    finally:
        server.stop()


def _train(mnist_dir, **overrides):
    return hogwild.train(data=mnist_dir, workers=1, epochs=1, subset=6000, progress=False,
                         overrides={**PAPER_OVERRIDES, **overrides})  # fmt: skip


def test_a_job_reading_from_two_data_servers_trains_like_a_local_one(mnist_dir, two_servers):
    servers, addresses = two_servers
    served = _train(mnist_dir, **{"data.servers": ",".join(addresses)})
    local = _train(mnist_dir)  # the idx files in the arena, read in place
    # One worker, the same examples in the same order: the same updates, the same model.
    assert served.metrics["test_accuracy"] == local.metrics["test_accuracy"] >= 0.9
    assert served.metrics["data_wait_s"] < 0.2 * served.metrics["train_s"]
    batches = [_status(a)["batches"] for a in addresses]
    assert min(batches) >= 10, batches  # the worker's reads took turns over both
    assert describe_server(addresses[0])["augment"] is None


@pytest.mark.parametrize("two_servers", [("--data.augment=translate=0.05",)], indirect=True)
def test_a_data_server_killed_mid_epoch_the_job_finishes_on_the_other(mnist_dir, two_servers):
    servers, addresses = two_servers
    killed = threading.Event()
    at_kill = {}

    def kill_when_busy() -> None:  # SIGKILL the first server once it served part of epoch 1
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            if _status(addresses[0])["batches"] >= 8:
                at_kill["other"] = _status(addresses[1])["batches"]
                servers[0].process.send_signal(signal.SIGKILL)
                killed.set()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=kill_when_busy, daemon=True)
    watcher.start()
    result = hogwild.train(data=mnist_dir, workers=2, epochs=2, subset=8000, progress=False,
                           evaluate_every=0,  # the final figures only
                           overrides={**PAPER_OVERRIDES, "data.servers": ",".join(addresses),
                                      "data.augment": "translate=0.05",
                                      "data.timeout_s": 0.5})  # fmt: skip
    watcher.join(TIMEOUT_S)
    assert killed.is_set()
    assert result.metrics["epochs_run"] == 2 and result.metrics["examples"] == 16000
    assert result.metrics["test_accuracy"] >= 0.9
    status = _status(addresses[1])
    assert status["batches"] >= at_kill["other"] + 8000 // 256  # epoch 2 came from it
    assert status["served"]["rendered"] > 0  # variants rendered ahead of demand
    assert servers[0].process.wait(5) == -signal.SIGKILL


def test_ctrl_c_stops_a_server_with_0_and_an_unsafe_bind_is_one_line(mnist_dir):
    server = DataServe(str(mnist_dir), "--port", "0")
    server.wait_ready()
    assert server.stop(signal.SIGINT) == 0
    assert server.lines[-1] == "hogwild data: stopped"
    refused = subprocess.run(
        [sys.executable, "-m", "hogwild.cli", "data", "serve", str(mnist_dir), "--bind", "0.0.0.0"],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "refusing to bind 0.0.0.0:5580" in refused.stderr
