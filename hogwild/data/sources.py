"""What an ingest reads: MNIST-style idx files, CIFAR-10 binary batches, folders of images.

:func:`detect_source` looks at a path and describes it as an :class:`IngestSource`: its kind, class
names, image shape and splits. A split is either in memory already (``images`` uint8
``[N, H, W, C]`` and ``labels``: idx and CIFAR-10 files are small and fixed-size) or a list of
image files with their labels, decoded later by :func:`decode_images`, which the ingest runs in a
pool of spawned processes (this module imports neither numba nor LMDB, so those start quickly).

Recognised layouts:

- **idx** (MNIST, Fashion-MNIST): a directory with ``train-images-idx3-ubyte[.gz]`` and/or
  ``t10k-images-idx3-ubyte[.gz]`` and their label files (splits ``train`` and ``test``), or one
  ``*-images-idx3-ubyte[.gz]`` file (split ``train``). Shape 28x28x1.
- **cifar10**: a directory (or its ``cifar-10-batches-bin`` subdirectory) with
  ``data_batch_*.bin`` (split ``train``) and/or ``test_batch.bin`` (split ``test``), or one such
  file. Each record is a label byte and 3072 bytes of R, G, B planes. Class names come from
  ``batches.meta.txt`` when present. Shape 32x32x3.
- **folder**: one subfolder per class holding images in any format Pillow reads; or ``train/``
  and ``test/`` (or ``val/``) folders, each laid out that way. Every image is resized so that
  its shorter side is ``size`` and centre-cropped to ``size`` x ``size`` (Adam section 4: 256x256
  for ImageNet). Files whose extension Pillow does not know, and hidden files, are ignored.

Invariant: the order of items in a split is a pure function of the files (sorted names), so an
interrupted ingest that runs again sees the same items in the same order and can resume by
position.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hogwild.data.idx import read_images, read_labels
from hogwild.errors import DataError

CIFAR_SIDE = 32
CIFAR_RECORD = 1 + 3 * CIFAR_SIDE * CIFAR_SIDE
_IDX_PREFIX = {"train": "train", "test": "t10k"}


@dataclass
class IngestSplit:
    """One split of a source: in-memory arrays, or image files decoded at ingest time.

    Attributes:
        name: ``train``, ``test``...
        images: uint8 ``[N, H, W, C]`` (in-memory sources) or None.
        labels: int ``[N]`` for in-memory sources, else the label of each file.
        files: The image files (folder sources), in ingest order.
    """

    name: str
    images: np.ndarray | None = None
    labels: np.ndarray | None = None
    files: list[Path] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.images) if self.images is not None else len(self.files)


@dataclass
class IngestSource:
    """A described input: kind (``idx``, ``cifar10``, ``folder``), path, classes, shape, splits."""

    kind: str
    path: Path
    classes: tuple[str, ...]
    shape: tuple[int, int, int]
    splits: list[IngestSplit]
    formats: tuple[str, ...] | None = None  # folder sources: the Pillow formats decoded

    def fingerprint(self) -> dict:
        """What identifies this source for resuming: kind, path, shape, classes, split sizes.

        Folder sources add a hash of their file list, so added or removed files are noticed.
        """
        doc = {
            "kind": self.kind,
            "path": str(self.path.resolve()),
            "shape": list(self.shape),
            "classes": list(self.classes),
            "splits": {s.name: len(s) for s in self.splits},
        }
        if self.kind == "folder":
            listing = hashlib.sha256()
            for split in self.splits:
                for file, label in zip(split.files, split.labels, strict=True):
                    listing.update(f"{split.name}\0{file}\0{label}\n".encode())
            doc["files_sha256"] = listing.hexdigest()
        return doc


IMAGE_FORMATS = ("JPEG", "PNG", "BMP", "GIF", "TIFF", "WEBP", "PPM")
"""The Pillow formats a folder source is decoded as by default (PPM also reads PGM and PBM): the
image formats users mean. Any other (Pillow opens about 70, EPS among them, which runs
Ghostscript where it is installed) only when asked for by name, or with ``"all"``."""


def detect_source(
    path: str | os.PathLike,
    *,
    size: int = 256,
    channels: int = 3,
    formats: tuple[str, ...] | str = IMAGE_FORMATS,
    follow_symlinks: bool = False,
) -> IngestSource:
    """Describe the idx files, CIFAR-10 batches or image folders at ``path``.

    Args:
        path: A directory or a single idx / CIFAR-10 file.
        size: Side of the square images a folder source is resized and cropped to.
        channels: 3 (RGB) or 1 (grey) for folder sources; idx is grey and CIFAR-10 RGB always.
        formats: The Pillow formats a folder's files are decoded as (default
            :data:`IMAGE_FORMATS`; ``"all"``: every format this Pillow opens).
        follow_symlinks: Take image files and class folders that are links leading out of
            ``path`` (default: such a link is an error naming it).

    Raises:
        DataError: The path is missing or is none of the recognised layouts, or a file is
            malformed (naming it).
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if path.is_file():
        if "images-idx3-ubyte" in path.name:
            return _idx_source(path.parent, {"train": path})
        if path.suffix == ".bin":
            return _cifar_source(path.parent, {"train": [path]})
        raise DataError(
            f"{path}: not an idx image file (*-images-idx3-ubyte[.gz]) or a CIFAR-10 .bin batch"
        )
    if (path / "cifar-10-batches-bin").is_dir():
        path = path / "cifar-10-batches-bin"
    idx_files = {
        split: found
        for split, prefix in _IDX_PREFIX.items()
        if (found := _first_existing(path, f"{prefix}-images-idx3-ubyte")) is not None
    }
    if idx_files:
        return _idx_source(path, idx_files)
    cifar = {
        "train": sorted(path.glob("data_batch_*.bin")),
        "test": sorted(path.glob("test_batch*.bin")),
    }
    if cifar["train"] or cifar["test"]:
        return _cifar_source(path, {k: v for k, v in cifar.items() if v})
    return _folder_source(path, size, channels, _formats(formats), follow_symlinks)


def _formats(formats: tuple[str, ...] | str) -> tuple[str, ...]:
    """The Pillow format names asked for, checked (``"all"``: every one this Pillow opens)."""
    from PIL import Image

    Image.init()
    known = tuple(sorted(Image.OPEN))
    if formats == "all":
        return known
    names = tuple(f.strip().upper() for f in (formats.split(",") if isinstance(formats, str)
                                              else formats) if f.strip())  # fmt: skip
    unknown = [n for n in names if n not in Image.OPEN]
    if unknown or not names:
        raise DataError(
            f"image formats {', '.join(unknown) or '(none)'}: not formats this Pillow opens "
            f"({', '.join(known)}; or 'all')"
        )
    return names


def _first_existing(directory: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def _idx_source(directory: Path, image_files: dict[str, Path]) -> IngestSource:
    splits = []
    for name, images_path in image_files.items():
        labels_name = images_path.name.replace("images-idx3", "labels-idx1")
        labels_path = images_path.with_name(labels_name)
        if not labels_path.is_file():
            raise DataError(f"{labels_path}: missing (the labels of {images_path})")
        images, labels = read_images(images_path), read_labels(labels_path)
        if len(images) != len(labels):
            raise DataError(
                f"{labels_path}: {len(labels)} labels for the {len(images)} images of {images_path}"
            )
        splits.append(IngestSplit(name, images[:, :, :, None], labels.astype(np.int32)))
    return IngestSource("idx", directory, tuple(str(i) for i in range(10)), (28, 28, 1), splits)


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 binary batch: (uint8 ``[n, 32, 32, 3]``, int32 labels ``[n]``).

    Raises:
        DataError: The file is missing, empty, not a whole number of 3073-byte records, or holds
            a label outside 0..9.
    """
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if raw.size == 0 or raw.size % CIFAR_RECORD:
        raise DataError(
            f"{path}: {raw.size} bytes is not a whole number of {CIFAR_RECORD}-byte CIFAR-10 "
            "records (a label byte and 32x32x3 pixels); the file is truncated or not CIFAR-10"
        )
    records = raw.reshape(-1, CIFAR_RECORD)
    labels = records[:, 0].astype(np.int32)
    if labels.max() > 9:
        bad = int(np.argmax(labels > 9))
        raise DataError(f"{path}: record {bad} has label {labels[bad]}, expected 0..9")
    planes = records[:, 1:].reshape(-1, 3, CIFAR_SIDE, CIFAR_SIDE)
    return np.ascontiguousarray(planes.transpose(0, 2, 3, 1)), labels


def _cifar_source(directory: Path, files: dict[str, list[Path]]) -> IngestSource:
    splits = []
    for name, paths in files.items():
        parts = [read_cifar_batch(p) for p in paths]
        splits.append(
            IngestSplit(
                name, np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
            )
        )
    classes = tuple(str(i) for i in range(10))
    meta = directory / "batches.meta.txt"
    if meta.is_file():
        names = [line.strip() for line in meta.read_text(errors="replace").splitlines()]
        names = [n for n in names if n]
        if len(names) == 10:
            classes = tuple(names)
    return IngestSource("cifar10", directory, classes, (CIFAR_SIDE, CIFAR_SIDE, 3), splits)


def image_extensions(formats: tuple[str, ...] | None = None) -> frozenset[str]:
    """File extensions (lower case, with the dot) of ``formats`` (default: every format this
    Pillow can open)."""
    from PIL import Image

    Image.init()
    wanted = set(Image.OPEN) if formats is None else set(formats)
    return frozenset(ext for ext, fmt in Image.registered_extensions().items() if fmt in wanted)


def _inside(file: Path, root: Path, follow_symlinks: bool) -> Path:
    """``file``, unless it leads out of ``root`` through a link and that was not asked for."""
    if not follow_symlinks and not file.resolve().is_relative_to(root):
        raise DataError(
            f"{file}: a link to {file.resolve()}, outside the source {root}; pass "
            "--follow-symlinks to take files from outside it"
        )
    return file


def _class_dirs(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))


def _folder_source(
    path: Path, size: int, channels: int, formats: tuple[str, ...], follow_symlinks: bool
) -> IngestSource:
    if channels not in (1, 3):
        raise DataError(f"channels must be 1 (grey) or 3 (RGB), got {channels}")
    if not 1 <= size <= 8192:
        raise DataError(f"the image size must be 1..8192 pixels, got {size}")
    test_dir = next((path / n for n in ("test", "val") if (path / n).is_dir()), None)
    if (path / "train").is_dir() and test_dir is not None:
        split_dirs = {"train": path / "train", "test": test_dir}
    else:
        split_dirs = {"train": path}
    class_names = sorted({c.name for d in split_dirs.values() for c in _class_dirs(d)})
    if not class_names:
        raise DataError(
            f"{path}: not a recognised data source: expected MNIST idx files, CIFAR-10 .bin "
            "batches, or one subfolder of images per class"
        )
    label_of = {name: i for i, name in enumerate(class_names)}
    extensions = image_extensions(formats)
    root = path.resolve()
    splits = []
    for name, directory in split_dirs.items():
        files, labels = [], []
        for class_dir in _class_dirs(directory):
            _inside(class_dir, root, follow_symlinks)
            for file in sorted(class_dir.rglob("*")):
                if file.suffix.lower() in extensions and not file.name.startswith("."):
                    files.append(_inside(file, root, follow_symlinks))
                    labels.append(label_of[class_dir.name])
        splits.append(IngestSplit(name, None, np.asarray(labels, dtype=np.int32), files))
    if not any(len(s) for s in splits):
        raise DataError(
            f"{path}: the class folders hold no image files of the formats {', '.join(formats)}"
        )
    return IngestSource("folder", path, tuple(class_names), (size, size, channels), splits,
                        formats)  # fmt: skip


def decode_image(
    path: str | os.PathLike, size: int, channels: int, formats: tuple[str, ...] = IMAGE_FORMATS
) -> np.ndarray:
    """Decode one image file, resize its shorter side to ``size`` and centre-crop it square.

    Only ``formats`` are tried, whatever the file's name says (a file of another format is
    unreadable: Pillow's other decoders, Ghostscript's among them, never see it).

    Returns:
        uint8 ``[size, size, channels]``.

    Raises:
        Exception: Whatever Pillow raises for an unreadable, corrupt or truncated file.
    """
    from PIL import Image, ImageOps

    mode = "RGB" if channels == 3 else "L"
    with Image.open(path, formats=list(formats)) as image:
        image.draft(mode, (size, size))  # JPEG: let the decoder downscale by 2, 4 or 8 first
        image = image.convert(mode)
        image = ImageOps.fit(image, (size, size), method=Image.Resampling.BILINEAR)
        pixels = np.asarray(image, dtype=np.uint8)
    return pixels.reshape(size, size, channels)


def decode_images(
    paths: list[str], size: int, channels: int, formats: tuple[str, ...] = IMAGE_FORMATS
) -> tuple[np.ndarray, list[str | None]]:
    """Decode a list of files (run in a decoding process).

    Returns:
        uint8 ``[k, size, size, channels]`` and, per file, None or why it could not be read
        (its row is then zeros).
    """
    out = np.zeros((len(paths), size, size, channels), dtype=np.uint8)
    errors: list[str | None] = []
    for i, path in enumerate(paths):
        try:
            out[i] = decode_image(path, size, channels, formats)
            errors.append(None)
        except Exception as exc:  # any decoder failure means "unreadable": report it, go on
            errors.append(f"{type(exc).__name__}: {exc}")
    return out, errors
