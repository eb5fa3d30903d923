"""Data-pipeline throughput: LMDB cache reads beside a numpy gather, augmentation per core.

Adam's data servers keep the trainers fed (section 3.1): the cache must serve records about as
fast as memory does, and augmentation must keep up with training. In one run this benchmark
measures:

- **reads**: records/s of :meth:`hogwild.data.cache.ImageCache.read` (batches of random record
  indices, images and labels into preallocated arrays) beside its yardstick, an in-memory numpy
  gather (``np.take``) of the same records in the same order, for real MNIST (28x28x1, 60,000
  records) and for 256x256x3 images (Adam's ImageNet size; ``--large`` synthetic records). The
  cache is read through liblmdb from numba (``native``; the first epoch looks every key up, later
  ones reuse the remembered record addresses: ``lmdb_first_epoch`` and ``lmdb``) and through the
  ``lmdb`` package's Python binding (``lmdb_python``). The caches are freshly written, so their
  pages are in the OS page cache, like a data server's warm cache. Methods are interleaved per
  repetition; figures are medians of ``--repeats`` epochs.
- **augmentation**: images per CPU-second of one thread (``time.thread_time``: per core, not
  disturbed by other processes taking turns on the core) for the bilinear path (translate,
  rotate, scale, flip) and the exact whole-pixel path (translate, flip, crop), at 28x28 and at
  256x256x3, beside its yardstick: a plain copy of the same images (``np.copyto``), per core.
  Medians of ``--repeats`` batches, parameter drawing included.

Prints one JSON line (machine, versions, settings, results, targets); ``--out`` also writes it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.machine import describe_machine, versions
from bench.support.paths import SHARED_MNIST
from bench.support.record import command_line, emit_record

TARGETS = {"lmdb_over_numpy": 0.5, "augment_28_per_core": 20000, "augment_256_per_core": 500}
AUGMENT_BILINEAR = "translate=0.1,hflip,rotate=15,scale=0.9:1.1"
AUGMENT_EXACT = "translate=0.1,hflip"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/figures/data_throughput.py", description=__doc__
    )
    parser.add_argument("--data", default=str(SHARED_MNIST), help="MNIST idx directory")
    parser.add_argument("--large", type=int, default=1024, help="256x256x3 records to write")
    parser.add_argument("--repeats", type=int, default=7, help="epochs / batches per figure")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the JSON line to this file")
    return parser.parse_args(argv)


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def measure_reads(cache_path: Path, images: np.ndarray, labels: np.ndarray, batch: int,
                  repeats: int, seed: int) -> dict:  # fmt: skip
    """Records/s of the cache's read paths and of a numpy gather, same records, same order."""
    from hogwild.data.cache import open_cache

    n = len(images)
    flat = images.reshape(n, -1)
    out = np.empty((batch, flat.shape[1]), np.uint8)
    labels_out = np.empty(batch, np.int32)
    rng = np.random.default_rng(seed)
    native = open_cache(cache_path)
    python = open_cache(cache_path, native=False)
    native_reader = native.native
    native.read([0], out, labels_out)  # the kernel compiled or loaded before timing

    def epoch(read) -> float:
        order = rng.permutation(n)
        started = time.perf_counter()
        for lo in range(0, n, batch):
            read(order[lo : lo + batch])
        return _rate(n, time.perf_counter() - started)

    def numpy_gather(idx):
        k = len(idx)
        # mode="clip": numpy's default mode buffers ``out``; this is its fastest gather.
        np.take(flat, idx, axis=0, out=out[:k], mode="clip")
        np.take(labels, idx, out=labels_out[:k], mode="clip")

    def lmdb_read(idx):
        native.read(idx, out, labels_out)

    def python_read(idx):
        python.read(idx, out, labels_out)

    rates = {"numpy": [], "lmdb": [], "lmdb_python": []}
    try:
        rates["lmdb_first_epoch"] = [epoch(lmdb_read)]
        for _ in range(repeats):
            rates["numpy"].append(epoch(numpy_gather))
            rates["lmdb"].append(epoch(lmdb_read))
        rates["lmdb_python"].append(epoch(python_read))
    finally:
        native.close()
        python.close()
    medians = {k: statistics.median(v) for k, v in rates.items()}
    record_bytes = flat.shape[1]
    return {
        "records": n,
        "record_shape": list(images.shape[1:]),
        "batch": batch,
        "records_per_s": {k: round(v) for k, v in medians.items()},
        "mb_per_s": {k: round(v * record_bytes / 1e6, 1) for k, v in medians.items()},
        "lmdb_over_numpy": round(medians["lmdb"] / medians["numpy"], 3),
        "lmdb_first_epoch_over_numpy": round(medians["lmdb_first_epoch"] / medians["numpy"], 3),
        "lmdb_range": [round(min(rates["lmdb"])), round(max(rates["lmdb"]))],
        "numpy_range": [round(min(rates["numpy"])), round(max(rates["numpy"]))],
        "native_reader": native_reader,
    }


def measure_augment(images: np.ndarray, repeats: int, seed: int) -> dict:
    """Images per CPU-second of one thread: bilinear and exact paths, and a plain copy."""
    from hogwild.data.augment import Augmenter, AugmentSpec

    n = len(images)
    idx = np.arange(n)
    out = np.empty_like(images)
    result = {"batch": n, "image_shape": list(images.shape[1:])}
    paths = {
        "bilinear": Augmenter(AugmentSpec.parse(AUGMENT_BILINEAR), seed),
        "exact": Augmenter(AugmentSpec.parse(AUGMENT_EXACT), seed),
    }
    cpu = {name: [] for name in (*paths, "copy")}
    wall = {name: [] for name in cpu}
    for augmenter in paths.values():
        augmenter(images, out, 0, idx)  # compiled or loaded from the cache before timing
    for rep in range(repeats):
        for name in cpu:
            c0, w0 = time.thread_time(), time.perf_counter()
            if name == "copy":
                np.copyto(out, images)
            else:
                paths[name](images, out, rep, idx)
            cpu[name].append(_rate(n, time.thread_time() - c0))
            wall[name].append(_rate(n, time.perf_counter() - w0))
    result["per_core_images_per_s"] = {k: round(statistics.median(v)) for k, v in cpu.items()}
    result["wall_images_per_s"] = {k: round(statistics.median(v)) for k, v in wall.items()}
    result["per_core_range"] = {k: [round(min(v)), round(max(v))] for k, v in cpu.items()}
    return result


def measure(args: argparse.Namespace) -> dict:
    from hogwild.data import lmdb_gather
    from hogwild.data.idx import read_images, read_labels
    from hogwild.data.ingest import ingest, ingest_arrays

    data = Path(args.data)
    mnist = read_images(data / "train-images-idx3-ubyte.gz")
    mnist_labels = read_labels(data / "train-labels-idx1-ubyte.gz").astype(np.int32)
    rng = np.random.default_rng(args.seed)
    large = rng.integers(0, 256, (args.large, 256, 256, 3), dtype=np.uint8)
    large_labels = rng.integers(0, 1000, args.large).astype(np.int32)
    with tempfile.TemporaryDirectory(prefix="hogwild-bench-data-") as tmp:
        started = time.perf_counter()
        ingest(data, Path(tmp) / "mnist", progress=False)
        mnist_ingest_s = time.perf_counter() - started
        ingest_arrays(Path(tmp) / "large", {"train": (large, large_labels)})
        reads = {
            "28x28x1": measure_reads(Path(tmp) / "mnist", mnist, mnist_labels, 256,
                                     args.repeats, args.seed),
            "256x256x3": measure_reads(Path(tmp) / "large", large, large_labels, 32,
                                       args.repeats, args.seed),
        }  # fmt: skip
    augment = {
        "28x28x1": measure_augment(np.ascontiguousarray(mnist[:2048]), args.repeats, args.seed),
        "256x256x3": measure_augment(large[:32], args.repeats, args.seed),
    }
    ratio = min(r["lmdb_over_numpy"] for r in reads.values())
    per_core_28 = augment["28x28x1"]["per_core_images_per_s"]["bilinear"]
    per_core_256 = augment["256x256x3"]["per_core_images_per_s"]["bilinear"]
    return {
        "benchmark": "data_throughput",
        "machine": describe_machine(),
        "versions": versions(),
        "settings": {
            "data": str(data),
            "large_records": args.large,
            "repeats": args.repeats,
            "seed": args.seed,
            "augment_bilinear": AUGMENT_BILINEAR,
            "augment_exact": AUGMENT_EXACT,
            "native_lmdb_reader": lmdb_gather.AVAILABLE,
        },
        "mnist_ingest_s": round(mnist_ingest_s, 2),
        "reads": reads,
        "augment": augment,
        "targets": TARGETS,
        "met": {
            "lmdb_over_numpy": ratio >= TARGETS["lmdb_over_numpy"],
            "augment_28_per_core": per_core_28 >= TARGETS["augment_28_per_core"],
            "augment_256_per_core": per_core_256 >= TARGETS["augment_256_per_core"],
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; prints one JSON line and returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    from hogwild.errors import HogwildError

    started = time.perf_counter()
    try:
        record = measure(args)
    except HogwildError as exc:
        print(f"data_throughput: error: {exc}", file=sys.stderr)
        return 2
    record["wall_s"] = round(time.perf_counter() - started, 1)
    record["command"] = command_line(__file__, argv)
    emit_record(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
