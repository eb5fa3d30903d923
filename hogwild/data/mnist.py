"""MNIST as four uint8 arrays, read from a directory of idx files or downloaded on first use.

A source is a directory holding the four files MNIST is published as (gzipped, or plain with the
``.gz`` dropped). ``None`` or ``"mnist"`` names hogwild's data directory (:func:`default_data_dir`);
only there are missing files downloaded, from the mirrors torchvision uses, tried in turn, each
file kept only if its MD5 matches the published sum (hard-coded below, so a fresh machine needs
nothing else). A directory the caller names is never written to.

Invariant: a returned :class:`MnistData` is complete and consistent -- uint8 images
``[N, 28, 28]`` and labels ``[N]`` in 0..9 with the same N for each split (60,000 and 10,000 for
the published files; a smaller re-cut written in the same format is accepted too). Anything else
is a :class:`hogwild.errors.DataError` naming the file or directory and what was expected.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hogwild.data.download import download as download_file
from hogwild.data.idx import read_images, read_labels
from hogwild.errors import DataError
from hogwild.runtime import user_cache_dir

DATA_ENV = "HOGWILD_DATA"
"""Environment variable that overrides :func:`default_data_dir`."""

MIRRORS_ENV = "HOGWILD_MNIST_MIRRORS"
"""Environment variable overriding :data:`MIRRORS`: comma-separated base URLs."""

MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
"""Base URLs MNIST is downloaded from, in order (the list torchvision uses)."""

FILES: dict[str, tuple[str, str]] = {
    "train_images": ("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
    "train_labels": ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
    "test_images": ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
    "test_labels": ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"),
}
"""Role -> (published file name, MD5 of that gzip file)."""

REACH_TIMEOUT_S = 3.0
"""Seconds to wait for a mirror's host to accept a connection before it counts as unreachable."""


@dataclass(frozen=True)
class MnistData:
    """The MNIST training and test sets.

    Attributes:
        train_images: uint8 ``[60000, 28, 28]``, pixel values 0..255.
        train_labels: uint8 ``[60000]``, digits 0..9.
        test_images: uint8 ``[10000, 28, 28]``.
        test_labels: uint8 ``[10000]``.
        source: The directory the files came from.
    """

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str


def default_data_dir() -> Path:
    """hogwild's MNIST directory: ``$HOGWILD_DATA`` if set, else ``<user cache>/data/mnist``."""
    override = os.environ.get(DATA_ENV)
    if override:
        return Path(override).expanduser()
    return user_cache_dir() / "data" / "mnist"


def load_mnist(
    source: str | os.PathLike | None = None,
    *,
    download: bool = True,
    progress: bool = True,
    mirrors: Sequence[str] | None = None,
) -> MnistData:
    """Load MNIST from a directory of idx files, downloading into the data directory if needed.

    Args:
        source: A directory holding ``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``,
            ``t10k-images-idx3-ubyte.gz`` and ``t10k-labels-idx1-ubyte.gz`` (each may instead be
            the plain file, without ``.gz``). ``None`` or ``"mnist"`` means
            :func:`default_data_dir`.
        download: Fetch files missing from the data directory. Never applies to an explicit
            ``source`` directory, which is only read.
        progress: Show a progress bar on stderr while downloading.
        mirrors: Base URLs to download from, tried in order; defaults to ``$HOGWILD_MNIST_MIRRORS``
            (comma-separated) or :data:`MIRRORS`.

    Returns:
        The four arrays and the directory they were read from.

    Raises:
        DataError: The directory or a file is missing, a file is corrupt, truncated or of the
            wrong shape, images and labels disagree in number, or a download failed everywhere.
    """
    managed = source is None or (isinstance(source, str) and source == "mnist")
    directory = default_data_dir() if managed else Path(source).expanduser()
    if not managed:
        if not directory.exists():
            raise DataError(f"MNIST source {directory}: no such directory")
        if not directory.is_dir():
            raise DataError(
                f"MNIST source {directory}: is a file, expected a directory holding "
                + ", ".join(name for name, _ in FILES.values())
            )

    paths, missing = _locate(directory)
    if missing:
        names = ", ".join(FILES[role][0] for role in missing)
        if not managed:
            raise DataError(
                f"MNIST source {directory} lacks {names} (each may be gzipped or plain, without "
                f".gz); give the data directory instead (source=None) to download them"
            )
        if not download:
            raise DataError(
                f"MNIST data directory {directory} lacks {names} and downloading is disabled"
            )
        _download_missing(directory, missing, _mirror_list(mirrors), progress)
        paths, missing = _locate(directory)
        assert not missing, missing

    train_images, train_labels = _read_pair(paths["train_images"], paths["train_labels"])
    test_images, test_labels = _read_pair(paths["test_images"], paths["test_labels"])
    return MnistData(
        train_images=train_images,
        train_labels=train_labels,
        test_images=test_images,
        test_labels=test_labels,
        source=os.path.abspath(directory),
    )


def _locate(directory: Path) -> tuple[dict[str, Path], list[str]]:
    """Find each role's file (gzipped preferred, then plain); return found paths, missing roles."""
    found: dict[str, Path] = {}
    missing: list[str] = []
    for role, (name, _) in FILES.items():
        for candidate in (directory / name, directory / name.removesuffix(".gz")):
            if candidate.is_file():
                found[role] = candidate
                break
        else:
            missing.append(role)
    return found, missing


def _read_pair(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read an images file and its labels file and check that they have as many examples."""
    images = read_images(images_path)
    labels = read_labels(labels_path)
    if images.shape[0] != labels.shape[0]:
        raise DataError(
            f"{images_path} holds {images.shape[0]} images but {labels_path} holds "
            f"{labels.shape[0]} labels; expected one label per image"
        )
    return images, labels


def _mirror_list(mirrors: Sequence[str] | None) -> list[str]:
    """The base URLs to try: the argument, else ``$HOGWILD_MNIST_MIRRORS``, else :data:`MIRRORS`."""
    if mirrors is None:
        env = os.environ.get(MIRRORS_ENV, "")
        mirrors = [m.strip() for m in env.split(",") if m.strip()] or list(MIRRORS)
    if isinstance(mirrors, str):
        mirrors = [mirrors]
    result = [m if m.endswith("/") else m + "/" for m in mirrors]
    if not result:
        raise DataError("no MNIST mirrors to download from (mirrors=[] was given)")
    return result


def _check_reachable(directory: Path, mirrors: Sequence[str]) -> None:
    """Fail in seconds, on one line, when no mirror's host accepts a connection (offline)."""
    reasons = []
    for base in mirrors:
        url = urllib.parse.urlsplit(base)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname, port), timeout=REACH_TIMEOUT_S).close()
            return
        except OSError as exc:
            reasons.append(f"{url.hostname}:{port}: {exc.strerror or exc}")
    raise DataError(
        f"cannot download MNIST into {directory}: no mirror is reachable ({'; '.join(reasons)}); "
        f"offline? point at local MNIST idx files with --data DIR or {DATA_ENV}=DIR"
    )


def _download_missing(
    directory: Path, roles: Sequence[str], mirrors: Sequence[str], progress: bool
) -> None:
    """Download each role's file into ``directory``, trying the mirrors in turn."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(
            f"cannot create the MNIST data directory {directory}: {exc.strerror or exc}"
        ) from None
    _check_reachable(directory, mirrors)
    for role in roles:
        name, md5 = FILES[role]
        failures: list[str] = []
        for base in mirrors:
            url = base + name
            if progress:
                print(f"downloading {url}", file=sys.stderr, flush=True)
            try:
                download_file(url, directory / name, md5, progress)
            except DataError as exc:
                failures.append(str(exc))
                if progress:
                    print(f"  failed: {exc}", file=sys.stderr, flush=True)
                continue
            break
        else:
            raise DataError(
                f"could not download {name} into {directory} ({'; '.join(failures)}); offline? "
                f"point at local MNIST idx files with --data DIR or {DATA_ENV}=DIR"
            )
