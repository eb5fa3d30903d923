"""The LMDB image cache end to end: ingest from real MNIST, a CIFAR-10 batch written here, and
folders of real JPEG/PNG files (some corrupt) decoded by spawned processes; an ingest killed with
SIGKILL and resumed; truncated, foreign and wrong-version caches refused with the file named;
reads through both LMDB paths and from RAM; augmentation rendered ahead by a process pool; the
preview grid and the data commands."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import lmdb
import numpy as np
import pytest
from PIL import Image

from hogwild.data import lmdb_gather
from hogwild.data.cache import is_image_cache, open_cache, read_manifest
from hogwild.data.cli_data import main as data_main
from hogwild.data.idx import read_images, read_labels
from hogwild.data.ingest import ingest, ingest_arrays
from hogwild.data.layout import record_key, records_db
from hogwild.errors import DataError

TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def mnist_cache(tmp_path_factory, mnist_dir) -> Path:
    """Real MNIST ingested once, starting from a 1 MiB map so the map has to grow."""
    out = tmp_path_factory.mktemp("mnist") / "cache"
    report = ingest(mnist_dir, out, progress=False, initial_map_size=1 << 20, chunk=4096)
    assert report.written == {"train": 60000, "test": 10000} and not report.skipped
    return out


@pytest.fixture(scope="module")
def mnist_arrays(published_mnist_dir):  # as published: the ingested files are the plain copy
    d = published_mnist_dir
    return (
        read_images(d / "train-images-idx3-ubyte.gz"),
        read_labels(d / "train-labels-idx1-ubyte.gz"),
    )


@pytest.fixture()
def small_cache(tmp_path) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (300, 16, 12, 3), dtype=np.uint8)
    labels = rng.integers(0, 5, 300)
    out = tmp_path / "small"
    ingest_arrays(out, {"train": (images, labels)}, classes=("a", "b", "c", "d", "e"))
    return out, images, labels


def test_mnist_ingest_and_reads(mnist_cache, mnist_arrays):
    images, labels = mnist_arrays
    manifest = read_manifest(mnist_cache)
    assert manifest.shape == (28, 28, 1) and manifest.classes == tuple("0123456789")
    assert {k: v.count for k, v in manifest.splits.items()} == {"train": 60000, "test": 10000}
    assert json.loads((mnist_cache / "manifest.json").read_text())["record_bytes"] == 24 + 784
    assert is_image_cache(mnist_cache) and not is_image_cache(mnist_cache.parent)
    idx = np.random.default_rng(1).permutation(60000)[:3000]
    for native in {False, lmdb_gather.AVAILABLE}:
        with open_cache(mnist_cache, native=native) as cache:
            np.testing.assert_array_equal(cache.labels, labels)
            out = np.empty((4000, 1, 28, 28), np.uint8)  # any row layout of 784 bytes
            labels_out = np.empty(4000, np.int64)
            for _ in range(2):  # the second pass reads through the remembered addresses
                got, got_labels = cache.read(idx, out, labels_out)
                np.testing.assert_array_equal(got[:, 0], images[idx])
                np.testing.assert_array_equal(got_labels, labels[idx])


def test_complete_cache_is_not_rewritten(mnist_cache, mnist_dir, tmp_path):
    report = ingest(mnist_dir, mnist_cache, progress=False)
    assert report.already_complete and report.manifest.count == 70000
    with pytest.raises(DataError, match="complete cache of another source"):
        cifar = _write_cifar(tmp_path / "cifar")
        ingest(cifar, mnist_cache, progress=False)


def test_ram_residency_and_verification(mnist_cache, mnist_arrays):
    images, labels = mnist_arrays
    with open_cache(mnist_cache, ram_budget_bytes=808 * 1000 + 5) as cache:
        assert cache.resident == 1000
        idx = np.array([0, 999, 1000, 59999, 5, 5])
        got, got_labels = cache.read(idx)
        np.testing.assert_array_equal(got[..., 0], images[idx])
        np.testing.assert_array_equal(got_labels, labels[idx])
    with open_cache(mnist_cache, "test") as cache:
        cache.verify()
        with pytest.raises(IndexError, match="record index 10000 outside"):
            cache.read([3, 10000])


def test_cache_belongs_to_the_process_that_opened_it(small_cache, monkeypatch):
    path, _, _ = small_cache
    cache = open_cache(path)
    with pytest.raises(TypeError, match="open_cache"):
        import pickle

        pickle.dumps(cache)
    real_pid = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: real_pid + 1)  # what a forked child would see
    with pytest.raises(DataError, match=r"opened in process \d+ and cannot be used in process"):
        cache.read([0])
    monkeypatch.undo()
    cache.close()
    with pytest.raises(DataError, match="closed"):
        cache.read([0])


def _write_cifar(directory: Path, n_train: int = 30, n_test: int = 12) -> Path:
    directory.mkdir(parents=True)
    rng = np.random.default_rng(7)
    for name, n in (("data_batch_1.bin", n_train), ("test_batch.bin", n_test)):
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        planes = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        raw = np.concatenate([labels[:, None], planes.reshape(n, -1)], axis=1)
        (directory / name).write_bytes(raw.tobytes())
        np.save(directory / f"{name}.npy", planes.transpose(0, 2, 3, 1))
        np.save(directory / f"{name}.labels.npy", labels)
    names = ["plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    (directory / "batches.meta.txt").write_text("\n".join(names) + "\n\n")
    return directory


def test_cifar10_binary_batches(tmp_path):
    src = _write_cifar(tmp_path / "cifar")
    report = ingest(src, tmp_path / "cache", progress=False)
    assert report.manifest.classes[1] == "car" and report.manifest.shape == (32, 32, 3)
    for split, name in (("train", "data_batch_1.bin"), ("test", "test_batch.bin")):
        expected = np.load(src / f"{name}.npy")
        with open_cache(tmp_path / "cache", split) as cache:
            got, labels = cache.read(np.arange(len(expected)))
        np.testing.assert_array_equal(got, expected)  # planes became interleaved RGB
        np.testing.assert_array_equal(labels, np.load(src / f"{name}.labels.npy"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "data_batch_1.bin").write_bytes(b"\0" * 3000)
    with pytest.raises(DataError, match=r"data_batch_1\.bin: 3000 bytes is not a whole number"):
        ingest(tmp_path / "bad", tmp_path / "cache2", progress=False)


def _write_folder(root: Path) -> dict[str, str]:
    """Classes cat/dog, real PNG and JPEG files of several sizes and modes, and corrupt ones."""
    (root / "cat").mkdir(parents=True)
    (root / "dog").mkdir()
    Image.new("RGB", (40, 20), (255, 0, 0)).save(root / "cat" / "red.png")
    halves = np.zeros((32, 64, 3), np.uint8)
    halves[:, 32:] = 255  # left half black, right half white: the centre crop keeps both
    Image.fromarray(halves).save(root / "cat" / "halves.png")
    Image.new("L", (50, 70), 128).save(root / "cat" / "grey.jpg", quality=95)
    Image.new("RGBA", (30, 30), (0, 0, 255, 255)).save(root / "dog" / "blue.png")
    Image.new("P", (33, 35), 3).save(root / "dog" / "palette.gif")
    noise = np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    Image.fromarray(noise).save(root / "dog" / "noise.jpg", quality=90)
    whole = (root / "dog" / "noise.jpg").read_bytes()
    (root / "dog" / "truncated.jpg").write_bytes(whole[: len(whole) // 2])
    (root / "dog" / "garbage.png").write_bytes(b"definitely not a png" * 10)
    (root / "cat" / "empty.jpg").write_bytes(b"")
    (root / "cat" / "notes.txt").write_text("not an image, ignored")
    return {"cat/empty.jpg", "dog/garbage.png", "dog/truncated.jpg"}


def test_image_folders_with_corrupt_files(tmp_path, capsys):
    corrupt = _write_folder(tmp_path / "images")
    out = tmp_path / "cache"
    status = data_main(["ingest", str(tmp_path / "images"), "--out", str(out), "--size", "32",
                        "--workers", "2", "--no-progress"])  # fmt: skip
    assert status == 0
    err = capsys.readouterr().err
    assert "skipped 3 unreadable image(s)" in err and "truncated.jpg" in err
    manifest = read_manifest(out)
    assert manifest.classes == ("cat", "dog") and manifest.shape == (32, 32, 3)
    assert manifest.splits["train"].count == 6 and manifest.splits["train"].skipped == 3
    listed = {line.split("\t")[1] for line in (out / "skipped.txt").read_text().splitlines()}
    assert listed == corrupt
    with open_cache(out) as cache:  # files in sorted order: cat/grey, halves, red; dog/...
        images, labels = cache.read(np.arange(6))
    assert labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert np.abs(images[0].astype(int) - 128).max() <= 2  # grey JPEG, converted to RGB
    assert (images[1][:, :15] == 0).all() and (images[1][:, 17:] == 255).all()
    assert (images[2] == (255, 0, 0)).all() and (images[3] == (0, 0, 255)).all()


def test_ingest_killed_mid_way_resumes_without_duplicates(tmp_path, mnist_dir, mnist_arrays):
    out = tmp_path / "cache"
    command = [sys.executable, "-m", "hogwild.data.cli_data", "ingest", str(mnist_dir),
               "--out", str(out), "--chunk", "32", "--no-progress"]  # fmt: skip
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    data_file, deadline = out / "data.mdb", time.monotonic() + TIMEOUT_S
    try:
        while not (data_file.exists() and data_file.stat().st_size > 4 << 20):
            assert child.poll() is None, "the ingest ended before it could be killed"
            assert time.monotonic() < deadline, "the ingest never got going"
            time.sleep(0.002)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(TIMEOUT_S)
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    with pytest.raises(DataError, match="incomplete image cache .* interrupted"):
        open_cache(out)

    # Resuming does not depend on the chunk size: the resume point is a source position.
    rerun = subprocess.run(
        [*command[:-3], "--no-progress", "--json"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert rerun.returncode == 0, rerun.stderr
    report = json.loads(rerun.stdout.splitlines()[-1])
    assert 0 < report["resumed"]["train"] < 60000
    assert report["resumed"]["train"] + report["written"]["train"] == 60000
    assert report["splits"] == {"train": 60000, "test": 10000}
    images, labels = mnist_arrays
    with open_cache(out) as cache:
        got, got_labels = cache.read(np.arange(60000))
        cache.verify()
    np.testing.assert_array_equal(got[..., 0], images)  # every record once, in order, whole
    np.testing.assert_array_equal(got_labels, labels)
    env = lmdb.open(str(out), readonly=True, lock=False, max_dbs=16)
    try:
        with env.begin(db=env.open_db(records_db("train").encode(), create=False)) as txn:
            keys = list(txn.cursor().iternext(values=False))
        assert keys == [record_key(i) for i in range(60000)]
    finally:
        env.close()


def test_truncated_or_foreign_lmdb_is_refused(small_cache, tmp_path):
    path, _, _ = small_cache
    short = tmp_path / "short"
    shutil.copytree(path, short)
    data = short / "data.mdb"
    size = data.stat().st_size
    os.truncate(data, size // 2)
    with pytest.raises(DataError, match=rf"{data}: truncated: .* needs {size} bytes"):
        open_cache(short)
    os.truncate(data, 100)
    with pytest.raises(DataError, match=rf"{data}: not a readable LMDB environment"):
        open_cache(short)
    data.write_bytes(b"\x89PNG" + b"\0" * 9000)
    with pytest.raises(DataError, match=rf"{data}: not a readable LMDB"):
        open_cache(short)

    foreign = tmp_path / "foreign"
    env = lmdb.open(str(foreign), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"hello", b"world")
    env.close()
    with pytest.raises(DataError, match=rf"{foreign / 'data.mdb'}.* not a hogwild image cache"):
        open_cache(foreign)
    with pytest.raises(DataError, match="not a hogwild image cache; choose another --out"):
        ingest_arrays(foreign, {"train": (np.zeros((2, 4, 4), np.uint8), np.zeros(2))})
    with pytest.raises(DataError, match=r"missing: .* is not an LMDB image cache"):
        open_cache(tmp_path)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x").write_text("x")
    with pytest.raises(DataError, match="not empty and is not an image cache"):
        ingest_arrays(tmp_path / "junk", {"train": (np.zeros((2, 4, 4), np.uint8), np.zeros(2))})


def _patch(path: Path, key: bytes, edit, db: str | None = None) -> None:
    env = lmdb.open(str(path), max_dbs=16)
    try:
        handle = env.open_db(db.encode()) if db else None
        with env.begin(write=True, db=handle) as txn:
            txn.put(key, edit(bytearray(txn.get(key))))
    finally:
        env.close()


def _version(version: int):
    def edit(raw):
        struct.pack_into("<H", raw, 4, version)
        return bytes(raw)

    return edit


@pytest.mark.parametrize("native", [False, True])
def test_wrong_record_version_is_refused(small_cache, native):
    if native and not lmdb_gather.AVAILABLE:
        pytest.skip("liblmdb's C API is not exported by this lmdb build")
    path, images, _ = small_cache
    _patch(path, record_key(7), _version(2), records_db("train"))
    with open_cache(path, native=native) as cache:
        np.testing.assert_array_equal(cache.read([6])[0], images[[6]])
        with pytest.raises(DataError, match=rf"{path / 'data.mdb'}: record 7 .* version 2"):
            cache.read([6, 7])
    _patch(path, record_key(0), _version(3), records_db("train"))
    with pytest.raises(DataError, match=r"record 0 .* record format version 3"):
        open_cache(path, native=native)


def test_wrong_cache_version_is_refused(small_cache):
    path, _, _ = small_cache

    def newer(raw):
        doc = json.loads(bytes(raw))
        doc["version"] = 2
        return json.dumps(doc).encode()

    _patch(path, b"format", newer, "meta")
    with pytest.raises(DataError, match=r"data\.mdb: cache version 2 .* rebuild it"):
        open_cache(path)


def test_preview_and_info_commands(mnist_cache, tmp_path, capsys):
    grid = tmp_path / "grid.png"
    argv = ["preview", str(mnist_cache), "--out", str(grid), "--n", "10", "--augment", "mnist"]
    assert data_main(argv) == 0
    with Image.open(grid) as image:  # 4 columns x 3 rows of 28x28 tiles, enlarged 4x
        assert image.size == (4 * (112 + 2) + 2, 3 * (112 + 2) + 2) and image.mode == "RGB"
    assert data_main([*argv[:4], "--n", "3", "--variants", "4"]) == 0
    with Image.open(grid) as image:
        assert image.size == (5 * 114 + 2, 3 * 114 + 2)  # original + 4 epochs per row
    assert data_main(["info", str(mnist_cache), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["count"] == 70000
    assert data_main(["info", str(tmp_path / "missing")]) == 2
    assert "missing: no such cache directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        data_main(["preview", str(mnist_cache), "--out", str(grid), "--augment", "shear=1"])
