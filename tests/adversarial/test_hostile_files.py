"""Hostile files: what an ingest decodes, where it reads from, what a compressed file may claim,
and who may read a secret key.

- An image folder is decoded as the image formats users mean (JPEG, PNG, BMP, GIF, TIFF, WebP,
  PPM/PGM) unless others are asked for: an EPS file named ``.jpg`` never reaches Pillow's EPS
  decoder (which runs Ghostscript where it is installed), and ``.eps`` files are not listed.
- A link out of the source tree is an error naming it, unless ``follow_symlinks``.
- A gzip idx file whose header claims far more than its stream holds costs the memory of what
  the stream holds, not of the claim.
- A secret key file is created mode 0600: it is never readable by others, not for a moment.
"""

from __future__ import annotations

import gzip
import os
import stat
import struct
import tracemalloc

import numpy as np
import pytest
from PIL import Image

from hogwild.data.idx import read_images
from hogwild.data.ingest import ingest
from hogwild.errors import DataError
from hogwild.net.auth import make_keys

EPS = b"""%!PS-Adobe-3.0 EPSF-3.0
%%BoundingBox: 0 0 8 8
newpath 0 0 moveto 8 8 lineto stroke
showpage
%%EOF
"""


def _folder(root, n_png: int = 3):
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(n_png):
            Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(root / cls / f"{i}.png")
    return root


def test_an_eps_file_is_never_decoded_as_eps_by_default(tmp_path):
    src = _folder(tmp_path / "src")
    (src / "a" / "disguised.jpg").write_bytes(EPS)
    (src / "b" / "plain.eps").write_bytes(EPS)
    report = ingest(src, tmp_path / "cache", size=8, workers=0, progress=False)
    assert report.manifest.splits["train"].count == 6  # the PNGs
    reasons = {os.path.basename(f): why for _, f, why in report.skipped}
    assert set(reasons) == {"disguised.jpg"}  # plain.eps not even listed
    assert "cannot identify image file" in reasons["disguised.jpg"]  # no EPS decoder tried


def test_other_formats_only_when_asked_for(tmp_path):
    src = _folder(tmp_path / "src")
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(src / "a" / "grey.pgm")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(src / "b" / "picture.tga")
    report = ingest(src, tmp_path / "c1", size=8, workers=0, progress=False)
    assert report.manifest.splits["train"].count == 7  # PGM is among the defaults, TGA is not
    report = ingest(src, tmp_path / "c2", size=8, workers=0, progress=False, formats="PNG,TGA")
    assert report.manifest.splits["train"].count == 7  # six PNGs and the TGA
    with pytest.raises(DataError, match="NOPE"):
        ingest(src, tmp_path / "c3", size=8, workers=0, progress=False, formats="PNG,NOPE")


def test_links_out_of_the_source_are_refused_unless_asked(tmp_path):
    src = _folder(tmp_path / "src")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(outside / "secret.png")
    (src / "a" / "link.png").symlink_to(outside / "secret.png")
    (src / "b" / "inside.png").symlink_to(src / "a" / "0.png")  # within the tree: fine
    with pytest.raises(DataError, match=r"link\.png: a link to .*secret\.png, outside"):
        ingest(src, tmp_path / "c1", size=8, workers=0, progress=False)
    report = ingest(src, tmp_path / "c2", size=8, workers=0, progress=False, follow_symlinks=True)
    assert report.manifest.splits["train"].count == 8


def test_a_gzip_idx_header_claiming_too_much_costs_only_what_the_stream_holds(tmp_path):
    n = 1_000_000  # claims 784 MB of images
    body = np.random.default_rng(0).integers(0, 256, 900_000, np.uint8).tobytes()
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(struct.pack(">BBBBIII", 0, 0, 8, 3, n, 28, 28) + body))
    assert path.stat().st_size * 1032 > n * 784  # within the ratio check: the stream must tell
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match="truncated"):
            read_images(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * len(body), peak  # not the 784 MB claimed


def test_secret_key_files_are_created_private(tmp_path, monkeypatch):
    def no_chmod(*args, **kwargs):
        raise AssertionError("a key file made readable first and private after")

    monkeypatch.setattr(os, "chmod", no_chmod)
    old = os.umask(0)  # nothing taken away by the umask: the mode given at creation is all
    try:
        root = make_keys(tmp_path / "keys")
    finally:
        os.umask(old)
    for name in ("server", "client"):
        assert stat.S_IMODE((root / f"{name}.key_secret").stat().st_mode) == 0o600
        assert stat.S_IMODE((root / f"{name}.key").stat().st_mode) == 0o644
