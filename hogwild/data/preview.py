"""A PNG grid of augmented samples from a cache: ``hogwild data preview CACHE --out grid.png``.

So a person can see what the network is fed: records drawn at random (by ``seed``) from one
split, each rendered as the trainer would render it in the given epoch(s). With ``variants`` of
1 the grid is ``n`` tiles; with ``variants`` k > 1 each row is one image -- the stored original,
then its variants in epochs ``epoch .. epoch+k-1`` -- so the augmentation's range is visible.
Small images are enlarged (nearest neighbour) so that a tile is at least 96 pixels.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from hogwild.data.augment import Augmenter, AugmentSpec
from hogwild.data.cache import open_cache
from hogwild.errors import DataError

_GAP = 2
_BACKGROUND = 48
_MIN_TILE = 96


def render_samples(
    cache_path: str | os.PathLike,
    *,
    n: int = 64,
    seed: int = 0,
    spec: AugmentSpec | None = None,
    epoch: int = 0,
    variants: int = 1,
    split: str = "train",
) -> tuple[list[list[np.ndarray]], np.ndarray]:
    """The tiles of a preview, row by row (uint8 ``[h, w, C]`` each), and the records shown.

    Raises:
        DataError: As :func:`~hogwild.data.cache.open_cache`.
    """
    spec = spec or AugmentSpec()
    with open_cache(cache_path, split) as cache:
        count = len(cache)
        if count == 0 or n < 1:
            raise DataError(f"{cache_path}: no records to preview in split {split!r}")
        picked = np.random.default_rng(seed).permutation(count)[: min(n, count)]
        picked = np.sort(picked)
        originals, _ = cache.read(picked)
    augmenter = Augmenter(spec, seed)
    out_shape = spec.output_shape(originals.shape[1:])
    rendered = []
    for k in range(max(1, variants)):
        out = np.empty((len(picked), *out_shape), dtype=np.uint8)
        augmenter(originals, out, epoch + k, picked)
        rendered.append(out)
    if variants > 1:
        tiles = [[originals[i]] + [r[i] for r in rendered] for i in range(len(picked))]
    else:
        columns = max(1, math.ceil(math.sqrt(len(picked))))
        flat = list(rendered[0])
        tiles = [flat[i : i + columns] for i in range(0, len(flat), columns)]
    return tiles, picked


def draw_grid(tiles: list[list[np.ndarray]], path: str | os.PathLike) -> Path:
    """Lay tiles out on a grey background and write them as a PNG; returns the path."""
    from PIL import Image

    height = max(t.shape[0] for row in tiles for t in row)
    width = max(t.shape[1] for row in tiles for t in row)
    zoom = max(1, math.ceil(_MIN_TILE / max(height, width)))
    cell_h, cell_w = height * zoom + _GAP, width * zoom + _GAP
    columns = max(len(row) for row in tiles)
    canvas = np.full(
        (len(tiles) * cell_h + _GAP, columns * cell_w + _GAP, 3), _BACKGROUND, dtype=np.uint8
    )
    for r, row in enumerate(tiles):
        for c, tile in enumerate(row):
            rgb = tile if tile.shape[2] == 3 else np.repeat(tile, 3, axis=2)
            big = rgb.repeat(zoom, axis=0).repeat(zoom, axis=1)
            y, x = _GAP + r * cell_h, _GAP + c * cell_w
            canvas[y : y + big.shape[0], x : x + big.shape[1]] = big
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    Image.fromarray(canvas).save(tmp, format="PNG")
    os.replace(tmp, path)
    return path


def preview(
    cache_path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    n: int = 64,
    seed: int = 0,
    spec: AugmentSpec | None = None,
    epoch: int = 0,
    variants: int = 1,
    split: str = "train",
) -> Path:
    """Render ``n`` samples of ``cache_path`` and write the grid to ``out`` (PNG).

    Raises:
        DataError: As :func:`~hogwild.data.cache.open_cache`.
        ValueError: A crop larger than the images.
    """
    tiles, _ = render_samples(
        cache_path, n=n, seed=seed, spec=spec, epoch=epoch, variants=variants, split=split
    )
    return draw_grid(tiles, out)
