"""What a data server holds and delivers: a data set in memory, and its variants rendered ahead.

:func:`load_source` loads a source that ``hogwild train`` accepts (a directory of MNIST idx files
or an LMDB image cache): its ``train`` and ``test`` splits in this process's memory, within a RAM
budget when one is given (a cache's records beyond it are read through LMDB). A
:class:`Delivery` turns records into what a replica's model reads: uint8 images ``[n, C, h, w]``
and int32 labels. Training images are the variant ``Augmenter(spec, seed, channels_first=True)``
gives for (epoch, index) -- from epochs a :class:`RenderAhead` thread rendered before they were
asked for (Adam section 3.1: "done in advance since some of the image transformations are compute
intensive"), or rendered on demand when not there yet; test images are the centre view a worker's
test feed renders. So a replica reading through a data server trains on exactly what it would
have read itself. No sockets here: :mod:`hogwild.data.server` serves a :class:`Delivery`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import threading
import time
from dataclasses import dataclass

import numpy as np

from hogwild.data.augment import Augmenter, AugmentSpec, augment_batch, identity_params
from hogwild.data.feed import ArrayReader
from hogwild.errors import DataError
from hogwild.net.wire import job_id

__all__ = ["SPLITS", "Delivery", "RenderAhead", "ResidentSource", "ResidentSplit", "load_source"]

SPLITS = ("train", "test")
"""The splits served; a ``BATCH`` request's ``target`` is the index into this."""
LOAD_RECORDS = 4096  # records per read when a cache is copied into memory
RENDER_RECORDS = 2048  # records per render-ahead step


@dataclass
class ResidentSplit:
    """One split: a reader (``read(indices, out, labels_out)`` into ``[n, H, W, C]``) and labels."""

    name: str
    reader: object  # an ArrayReader, or an ImageCache where the split is beyond the RAM budget
    labels: np.ndarray
    resident: int  # records held in this process's memory

    @property
    def count(self) -> int:
        return len(self.labels)


@dataclass
class ResidentSource:
    """A loaded data source: its splits, their stored shape (H, W, C), classes, fingerprint."""

    path: str
    kind: str  # "idx" or "cache"
    shape: tuple[int, int, int]
    classes: tuple[str, ...]
    splits: dict[str, ResidentSplit]
    fingerprint: str

    def count(self, split: str) -> int:
        return self.splits[split].count if split in self.splits else 0

    def close(self) -> None:
        for split in self.splits.values():
            if hasattr(split.reader, "close"):
                split.reader.close()


def load_source(path: str, ram_budget_bytes: int | None = None) -> ResidentSource:
    """Load a directory of MNIST idx files (or ``"mnist"``) or an LMDB image cache into memory.

    Args:
        path: The source, as ``hogwild train --data`` takes it.
        ram_budget_bytes: Most bytes of a cache's records to hold (None: all of them); the rest
            is read through LMDB. Idx files are always held whole.

    Raises:
        DataError: The source is missing, incomplete or malformed (naming it).
    """
    from hogwild.data.layout import is_image_cache

    if path not in (None, "mnist") and is_image_cache(path):
        return _load_cache(str(path), ram_budget_bytes)
    from hogwild.data.mnist import load_mnist

    data = load_mnist(path, progress=False)
    digest = hashlib.blake2b(digest_size=16)
    splits = {}
    for name, images, labels in (
        ("train", data.train_images, data.train_labels),
        ("test", data.test_images, data.test_labels),
    ):
        reader = ArrayReader(np.ascontiguousarray(images), labels)
        digest.update(f"{name}{reader.images.shape}".encode())
        digest.update(reader.images.data)
        digest.update(reader.labels.data)
        splits[name] = ResidentSplit(name, reader, reader.labels, len(reader))
    shape = tuple(int(v) for v in splits["train"].reader.shape)
    classes = tuple(str(i) for i in range(10))
    return ResidentSource(data.source, "idx", shape, classes, splits, "idx:" + digest.hexdigest())


def _load_cache(path: str, budget: int | None) -> ResidentSource:
    from hogwild.data.cache import open_cache, read_manifest

    manifest = read_manifest(path)
    if "train" not in manifest.splits:
        raise DataError(f"{path}: the image cache has no 'train' split")
    shape = tuple(int(v) for v in manifest.shape)
    splits: dict[str, ResidentSplit] = {}
    try:
        for name in SPLITS:
            if name not in manifest.splits:
                continue
            count = manifest.splits[name].count
            if budget is None or count * math.prod(shape) <= budget:
                images = np.empty((count, *shape), np.uint8)
                labels = np.empty(count, np.int32)
                with open_cache(path, name) as cache:
                    for lo in range(0, count, LOAD_RECORDS):
                        idx = np.arange(lo, min(lo + LOAD_RECORDS, count), dtype=np.int64)
                        cache.read(idx, images[lo : lo + len(idx)], labels[lo : lo + len(idx)])
                reader = ArrayReader(images, labels)
                splits[name] = ResidentSplit(name, reader, reader.labels, count)
                budget = None if budget is None else budget - images.nbytes
            else:
                cache = open_cache(path, name, ram_budget_bytes=budget)
                splits[name] = ResidentSplit(name, cache, cache.labels, cache.resident)
                budget -= cache.resident * cache.record_bytes
    except BaseException:
        ResidentSource(path, "cache", shape, (), splits, "").close()
        raise
    checksums = ",".join(f"{n}={manifest.splits[n].checksum}" for n in SPLITS if n in splits)
    fingerprint = f"cache:{list(shape)}:{checksums}"
    return ResidentSource(path, "cache", shape, tuple(manifest.classes), splits, fingerprint)


class RenderAhead:
    """Whole epochs of the training split's variants, rendered by a thread before they are asked.

    The thread renders the latest epoch requested in the last ``recent_s`` seconds, then the next
    (epoch 0 and 1 at the start), in steps of :data:`RENDER_RECORDS`; a request for a far-off
    epoch (a bad client) is forgotten after ``recent_s``. At most ``keep`` epochs are held; room
    is made by dropping the epoch least recently requested that is neither of those two.
    :meth:`lookup` gives an epoch's array when every record asked for is rendered (None
    otherwise: render on demand).
    """

    def __init__(
        self,
        split: ResidentSplit,
        augmenter: Augmenter,
        shape: tuple,
        keep: int,
        recent_s: float = 30.0,
    ) -> None:
        self.split, self.augmenter, self.shape, self.keep = split, augmenter, shape, max(1, keep)
        self.recent_s = recent_s
        self.n_steps = -(-split.count // RENDER_RECORDS)
        self.epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # epoch -> (images, ready)
        self.used: dict[int, float] = {}
        self.latest, self.rendered, self.render_s = 0, 0, 0.0
        self.failure: str | None = None
        self._lock, self._wake, self._stop = threading.Lock(), threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="hogwild-data-render", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def note(self, epoch: int) -> None:
        """A request for ``epoch`` arrived."""
        with self._lock:
            self.used[epoch] = time.monotonic()
        if epoch > self.latest:
            self._wake.set()

    def lookup(self, epoch: int, idx: np.ndarray) -> np.ndarray | None:
        entry = self.epochs.get(epoch)
        if entry is None or not entry[1][idx // RENDER_RECORDS].all():
            return None
        return entry[0]

    def _next_step(self):
        with self._lock:
            now = time.monotonic()
            recent = [e for e, t in self.used.items() if now - t <= self.recent_s]
            self.latest = max(recent, default=self.latest)
            self.used = {e: t for e, t in self.used.items() if now - t <= self.recent_s
                         or e in self.epochs}  # fmt: skip
            wanted = (self.latest, self.latest + 1)
            for epoch in wanted:
                entry = self.epochs.get(epoch)
                if entry is None:
                    old = [e for e in self.epochs if e not in wanted]
                    while len(self.epochs) >= self.keep and old:
                        old.sort(key=lambda e: self.used.get(e, 0.0))
                        del self.epochs[old.pop(0)]
                    if len(self.epochs) >= self.keep:
                        return None
                    images = np.empty((self.split.count, *self.shape), np.uint8)
                    entry = self.epochs[epoch] = (images, np.zeros(self.n_steps, bool))
                missing = np.flatnonzero(~entry[1])
                if missing.size:
                    return epoch, entry, int(missing[0])
        return None

    def _run(self) -> None:
        raw = np.empty((RENDER_RECORDS, *self.split.reader.shape), np.uint8)
        labels = np.empty(RENDER_RECORDS, np.int32)
        try:
            while not self._stop.is_set():
                step = self._next_step()
                if step is None:
                    self._wake.wait(0.2)
                    self._wake.clear()
                    continue
                epoch, (images, ready), i = step
                started = time.perf_counter()
                lo = i * RENDER_RECORDS
                idx = np.arange(lo, min(lo + RENDER_RECORDS, self.split.count), dtype=np.int64)
                source, _ = self.split.reader.read(idx, raw, labels)
                self.augmenter(source, images[lo : lo + len(idx)], epoch, idx)
                ready[i] = True
                self.rendered += len(idx)
                self.render_s += time.perf_counter() - started
        except Exception as exc:  # noqa: BLE001 - reported in status; requests render on demand
            self.failure = f"{type(exc).__name__}: {exc}"

    def state(self) -> dict:
        with self._lock:
            epochs = dict(self.epochs)
        return {
            "enabled": True,
            "latest_requested": self.latest,
            "keep": self.keep,
            "epochs": {str(e): round(float(r.mean()), 3) for e, (_, r) in sorted(epochs.items())},
            "rendered_records": self.rendered,
            "render_s": round(self.render_s, 2),
            "failure": self.failure,
        }


class Delivery:
    """A source as the model reads it: the shape delivered, the data's id, and :meth:`fill`.

    Args:
        source: What is served (:func:`load_source`); closed by :meth:`close`.
        augment: The training split's augmentation (None: images as stored).
        seed: The job's seed (``train.seed``): which variant each (epoch, index) gets.
        keep: Rendered epochs held at most (0: every batch rendered on demand).
        ram_budget_bytes: Bytes the source and the rendered epochs may take (None: no limit).

    Attributes:
        shape: (C, h, w) of a delivered image.
        renders: Whether delivering runs the warp kernel (augmenting, or a view other than the
            stored bytes); False: the stored images go out as they are, without numba.
        data_id: A 64-bit id of the source's content, the augmentation and (when augmenting) the
            seed: two servers with the same id deliver the same bytes.
    """

    def __init__(self, source: ResidentSource, *, augment: AugmentSpec | None = None, seed: int = 0,
                 keep: int = 3, ram_budget_bytes: int | None = None) -> None:  # fmt: skip
        self.source, self.spec, self.seed = source, augment or AugmentSpec(), seed
        try:
            oh, ow, channels = self.spec.output_shape(source.shape)
        except ValueError as exc:
            raise DataError(f"{source.path}: data.augment does not fit its images: {exc}") from None
        self.shape = (channels, oh, ow)
        self._plain = channels == 1 and (oh, ow) == source.shape[:2]
        # Whether fill ever runs the warp kernel: to augment, or to render a centre view
        self.renders = bool(self.spec.random) or not self._plain
        self.augmenter = Augmenter(self.spec, seed, channels_first=True)
        spec_text = json.dumps(dataclasses.asdict(self.spec), sort_keys=True)
        random_seed = seed if self.spec.random else ""
        self.data_id = job_id(f"{source.fingerprint}|{spec_text}|{random_seed}")
        self.render: RenderAhead | None = None
        self.render_off = "" if self.spec.random else "no augmentation"
        if self.spec.random:
            epoch_bytes = max(1, source.count("train") * math.prod(self.shape))
            held = sum(s.resident * math.prod(source.shape) for s in source.splits.values())
            room = keep if ram_budget_bytes is None else (ram_budget_bytes - held) // epoch_bytes
            if min(keep, room) >= 1:
                train = source.splits["train"]
                self.render = RenderAhead(train, self.augmenter, self.shape, min(keep, room))
            else:
                self.render_off = "no room for a rendered epoch" if keep else "keep = 0"
        self.served = dict.fromkeys(("rendered", "on_demand", "stored"), 0)
        self._count = threading.Lock()

    def start(self) -> None:
        """Start rendering ahead (epochs 0 and 1 first)."""
        if self.render is not None:
            self.render.start()

    def close(self) -> None:
        """Stop rendering and close the source."""
        if self.render is not None:
            self.render.stop()
        self.source.close()

    def fill(self, split: str, epoch: int, idx: np.ndarray, images: np.ndarray, labels) -> None:
        """Write records ``idx`` of ``split`` as delivered into ``images`` ``[n, C, h, w]`` and
        their labels into ``labels`` (int32 ``[n]``). ``idx`` must be in range."""
        data, n = self.source.splits[split], len(idx)
        if split == "train" and self.spec.random:
            rendered = None
            if self.render is not None:
                self.render.note(epoch)
                rendered = self.render.lookup(epoch, idx)
            if rendered is not None:
                np.take(rendered, idx, axis=0, out=images, mode="clip")
                np.take(data.labels, idx, out=labels, mode="clip")
                self._counted("rendered")
                return
            raw, _ = data.reader.read(idx, np.empty((n, *self.source.shape), np.uint8), labels)
            self.augmenter(raw, images, epoch, idx)
            self._counted("on_demand")
            return
        if self._plain:  # one channel, nothing cropped: the stored bytes are the model's layout
            data.reader.read(idx, images.reshape(n, *self.source.shape), labels)
        else:  # the centre view, channels first: what a worker's test feed renders
            raw, _ = data.reader.read(idx, np.empty((n, *self.source.shape), np.uint8), labels)
            augment_batch(raw, images, identity_params(n), channels_first=True, fill=self.spec.fill)
        self._counted("stored")

    def _counted(self, where: str) -> None:
        with self._count:
            self.served[where] += 1

    def describe(self) -> dict:
        """What is delivered (plain data: a data server's ``describe`` reply, less its limits)."""
        source = self.source
        return {
            "role": "data",
            "source": source.path,
            "kind": source.kind,
            "data_id": self.data_id,
            "shape": list(self.shape),
            "stored_shape": list(source.shape),
            "splits": {name: source.count(name) for name in SPLITS},
            "classes": list(source.classes),
            "augment": dataclasses.asdict(self.spec) if self.spec.random else None,
            "seed": self.seed,
        }

    def state(self) -> dict:
        """Where batches came from, what is resident, and the render-ahead state."""
        render = self.render.state() if self.render else {"enabled": False, "why": self.render_off}
        return {
            "served": dict(self.served),
            "resident": {name: s.resident for name, s in self.source.splits.items()},
            "render_ahead": render,
        }
