"""MNIST data source: the real files, a real local HTTP mirror, and broken inputs.

No mocks: downloads go through a ``ThreadingHTTPServer`` on 127.0.0.1 serving the shared copy of
MNIST (or a corrupted copy), and the bad inputs are real files written to ``tmp_path``.
"""

from __future__ import annotations

import gzip
import hashlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hogwild.data.idx import read_idx, read_images, read_labels, write_idx
from hogwild.data.mnist import FILES, MIRRORS_ENV, default_data_dir, load_mnist
from hogwild.errors import DataError
from tests.mnist_files import mnist_dir

SHARED_MNIST = mnist_dir()
NAMES = {role: name for role, (name, _) in FILES.items()}

pytestmark = pytest.mark.skipif(
    not SHARED_MNIST.is_dir(), reason=f"the shared MNIST copy is not at {SHARED_MNIST}"
)


# --------------------------------------------------------------------------- fixtures


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins every handler thread: nothing outlives a test


@pytest.fixture
def serve() -> Iterator:
    """Start HTTP servers on 127.0.0.1 (port 0) for directories; shut all down afterwards."""
    started: list[tuple[_Server, threading.Thread]] = []

    def start(directory: Path) -> str:
        server = _Server(("127.0.0.1", 0), partial(_QuietHandler, directory=str(directory)))
        thread = threading.Thread(target=server.serve_forever, name="mnist-test-http")
        thread.start()
        started.append((server, thread))
        return f"http://127.0.0.1:{server.server_address[1]}/"

    try:
        yield start
    finally:
        for server, thread in started:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)
            assert not thread.is_alive()


@pytest.fixture
def dead_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


def _source_dir(tmp_path: Path, **replace: Path | None) -> Path:
    """A directory of symlinks to the shared files; ``replace`` maps a role to another file
    (or to None to leave it out)."""
    directory = tmp_path / "src"
    directory.mkdir()
    for role, name in NAMES.items():
        target = replace.get(role, SHARED_MNIST / name)
        if target is not None:
            (directory / name).symlink_to(target)
    return directory


# --------------------------------------------------------------------------- the real data


def test_loads_the_shared_dataset() -> None:
    data = load_mnist(SHARED_MNIST, download=False, progress=False)
    assert data.train_images.shape == (60000, 28, 28)
    assert data.train_labels.shape == (60000,)
    assert data.test_images.shape == (10000, 28, 28)
    assert data.test_labels.shape == (10000,)
    for array in (data.train_images, data.train_labels, data.test_images, data.test_labels):
        assert array.dtype == np.uint8
        assert array.flags.c_contiguous and array.flags.writeable
    assert data.source == str(SHARED_MNIST)
    # Known facts about MNIST.
    assert data.train_labels[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert data.test_labels[:5].tolist() == [7, 2, 1, 0, 4]
    assert set(np.unique(data.train_labels).tolist()) == set(range(10))
    assert np.bincount(data.train_labels).tolist()[1] == 6742  # the most frequent digit
    assert data.train_images.max() == 255 and data.train_images.min() == 0
    assert data.train_images[0, :4].sum() == 0  # the border is blank


def test_plain_idx_files_are_accepted(tmp_path: Path) -> None:
    plain = tmp_path / "t10k-labels-idx1-ubyte"
    plain.write_bytes(gzip.decompress((SHARED_MNIST / NAMES["test_labels"]).read_bytes()))
    source = _source_dir(tmp_path, test_labels=None)
    (source / plain.name).symlink_to(plain)
    data = load_mnist(str(source), progress=False)
    reference = read_labels(SHARED_MNIST / NAMES["test_labels"])
    np.testing.assert_array_equal(data.test_labels, reference)


def test_write_idx_round_trip(tmp_path: Path) -> None:
    for name, array in [
        ("a.gz", np.arange(24, dtype=np.uint8).reshape(2, 3, 4)),
        ("b", np.array([[-1.5, 2.0]], dtype=np.float64)),
        ("c", np.array([1, -70000], dtype=np.int32)),
    ]:
        write_idx(tmp_path / name, array)
        back = read_idx(tmp_path / name)
        assert back.dtype == array.dtype
        np.testing.assert_array_equal(back, array)


def test_a_peer_reads_idx_files_with_the_core_reader_without_loading_numba() -> None:
    """The bench peers (PyTorch, Ray) read MNIST with :func:`hogwild.data.idx.read_images` and
    ``read_labels``; importing them must not load numba (or the engine) into a peer's process."""
    script = (
        "import sys; from hogwild.data.idx import read_images, read_labels; "
        f"images = read_images({str(SHARED_MNIST / NAMES['test_images'])!r}); "
        f"labels = read_labels({str(SHARED_MNIST / NAMES['test_labels'])!r}); "
        "print(images.shape, labels.shape, images.dtype, 'numba' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["(10000,", "28,", "28)", "(10000,)", "uint8", "False"]


def test_default_data_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOGWILD_DATA", str(tmp_path / "d"))
    assert default_data_dir() == tmp_path / "d"
    monkeypatch.delenv("HOGWILD_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_data_dir() == tmp_path / "cache" / "hogwild" / "data" / "mnist"


# --------------------------------------------------------------------------- downloading


def test_download_tries_mirrors_in_turn(
    serve, dead_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    good = serve(SHARED_MNIST)
    data_dir = tmp_path / "data"
    monkeypatch.setenv("HOGWILD_DATA", str(data_dir))
    # A refused connection, then a 404 (a path the server lacks), then the real files.
    monkeypatch.setenv(MIRRORS_ENV, f"{dead_url}, {good}missing,{good}")
    data = load_mnist("mnist", progress=True)

    for name, md5 in FILES.values():
        assert hashlib.md5((data_dir / name).read_bytes()).hexdigest() == md5
    assert sorted(p.name for p in data_dir.iterdir()) == sorted(NAMES.values())
    assert data.source == str(data_dir)
    assert data.train_labels[0] == 5 and data.test_images.shape == (10000, 28, 28)
    err = capsys.readouterr().err
    assert "HTTP 404" in err and "cannot connect" in err  # (bars: on a terminal only)

    # A second load finds the files and needs no mirror at all.
    again = load_mnist(None, progress=False, mirrors=[dead_url])
    np.testing.assert_array_equal(again.train_labels, data.train_labels)


def test_download_with_wrong_md5_leaves_nothing(
    serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = tmp_path / "served"
    served.mkdir()
    corrupt = bytearray((SHARED_MNIST / NAMES["train_labels"]).read_bytes())
    corrupt[len(corrupt) // 2] ^= 0xFF
    (served / NAMES["train_labels"]).write_bytes(corrupt)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for role in ("train_images", "test_images", "test_labels"):
        (data_dir / NAMES[role]).symlink_to(SHARED_MNIST / NAMES[role])

    monkeypatch.setenv("HOGWILD_DATA", str(data_dir))
    url = serve(served)
    with pytest.raises(DataError) as info:
        load_mnist(None, progress=False, mirrors=[url])
    message = str(info.value)
    assert "MD5" in message and NAMES["train_labels"] in message
    assert FILES["train_labels"][1] in message  # the expected sum
    assert hashlib.md5(corrupt).hexdigest() in message  # the actual one
    assert sorted(p.name for p in data_dir.iterdir()) == sorted(
        NAMES[r] for r in ("train_images", "test_images", "test_labels")
    )


def test_download_disabled_or_explicit_dir_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_url: str
) -> None:
    monkeypatch.setenv("HOGWILD_DATA", str(tmp_path / "data"))
    with pytest.raises(DataError, match="downloading is disabled"):
        load_mnist(download=False)
    source = _source_dir(tmp_path, train_images=None, test_labels=None)
    with pytest.raises(DataError) as info:
        load_mnist(source, mirrors=[dead_url])
    message = str(info.value)
    assert str(source) in message
    assert NAMES["train_images"] in message and NAMES["test_labels"] in message
    assert NAMES["train_labels"] not in message
    assert len(list(source.iterdir())) == 2
    with pytest.raises(DataError, match="no such directory"):
        load_mnist(tmp_path / "nowhere")


def test_offline_the_download_error_is_one_line_within_seconds_saying_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_url: str
) -> None:
    monkeypatch.setenv("HOGWILD_DATA", str(tmp_path / "data"))
    started = time.monotonic()
    with pytest.raises(DataError) as info:
        load_mnist("mnist", progress=False, mirrors=[dead_url, "https://nowhere.invalid/mnist/"])
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert "\n" not in message and "no mirror is reachable" in message
    assert "--data DIR" in message and "HOGWILD_DATA=DIR" in message


# --------------------------------------------------------------------------- bad inputs


def test_truncated_gzip(tmp_path: Path) -> None:
    whole = (SHARED_MNIST / NAMES["test_images"]).read_bytes()
    cut = tmp_path / NAMES["test_images"]
    cut.write_bytes(whole[: len(whole) // 2])
    source = _source_dir(tmp_path, test_images=cut)
    with pytest.raises(DataError, match="truncated") as info:
        load_mnist(source)
    assert str(source / NAMES["test_images"]) in str(info.value)


def test_truncated_plain_file(tmp_path: Path) -> None:
    plain = tmp_path / "t10k-labels-idx1-ubyte"
    plain.write_bytes(gzip.decompress((SHARED_MNIST / NAMES["test_labels"]).read_bytes())[:5000])
    with pytest.raises(DataError) as info:
        read_labels(plain)
    message = str(info.value)
    assert str(plain) in message and "truncated" in message
    assert "10000" in message and "4992" in message  # needed vs found


@pytest.mark.parametrize("kind", ["png", "random"])
def test_foreign_file(tmp_path: Path, kind: str) -> None:
    fake = tmp_path / NAMES["train_labels"]
    if kind == "png":
        Image.new("L", (28, 28), color=7).save(fake, format="PNG")
    else:
        fake.write_bytes(np.random.default_rng(0).integers(1, 256, 4096, dtype=np.uint8).tobytes())
    source = _source_dir(tmp_path, train_labels=fake)
    with pytest.raises(DataError, match="not an idx file") as info:
        load_mnist(source)
    assert str(source / NAMES["train_labels"]) in str(info.value)
    if kind == "png":
        assert "PNG" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found") as info:
        read_images(tmp_path / "absent.gz")
    assert str(tmp_path / "absent.gz") in str(info.value)


def test_count_mismatch(tmp_path: Path) -> None:
    source = _source_dir(tmp_path, train_labels=SHARED_MNIST / NAMES["test_labels"])
    with pytest.raises(DataError) as info:
        load_mnist(source)
    message = str(info.value)
    assert str(source / NAMES["train_images"]) in message
    assert str(source / NAMES["train_labels"]) in message
    assert "60000 images" in message and "10000 labels" in message


def test_wrong_shapes_and_values(tmp_path: Path) -> None:
    images = tmp_path / "images.gz"
    write_idx(images, np.zeros((3, 28, 27), dtype=np.uint8))
    with pytest.raises(
        DataError, match=r"expected images of shape \[N, 28, 28\], found \[3, 28, 27\]"
    ):
        read_images(images)
    labels = tmp_path / "labels"
    write_idx(labels, np.zeros((3, 1), dtype=np.uint8))
    with pytest.raises(DataError, match=r"expected labels of shape \[N\], found \[3, 1\]"):
        read_labels(labels)
    write_idx(labels, np.array([1, 12, 3], dtype=np.uint8))
    with pytest.raises(DataError, match="0..9, found 12 at index 1") as info:
        read_labels(labels)
    assert str(labels) in str(info.value)
    write_idx(labels, np.array([1, 2], dtype=np.int32))
    with pytest.raises(DataError, match="expected labels of type uint8"):
        read_labels(labels)


def test_trailing_bytes_and_lying_header(tmp_path: Path) -> None:
    labels = tmp_path / "labels"
    write_idx(labels, np.array([1, 2, 3], dtype=np.uint8))
    labels.write_bytes(labels.read_bytes() + b"\0")
    with pytest.raises(DataError, match="trailing bytes"):
        read_labels(labels)
    huge = tmp_path / "huge.gz"  # a header claiming 2**32-1 images: must fail before allocating
    huge.write_bytes(gzip.compress(b"\0\0\x08\x03" + b"\xff\xff\xff\xff" + b"\0\0\0\x1c" * 2))
    with pytest.raises(DataError, match="corrupt"):
        read_images(huge)
