"""Augmentation: the numba warp against a float64 numpy oracle, exact paths, reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.data.augment import (
    Augmenter,
    AugmentParams,
    AugmentSpec,
    augment_batch,
    draw_params,
    identity_params,
    uniforms,
)

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels


def _images(n, shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)


def _params(n, *, flip=False, angle=0.0, scale=1.0, dx=0.0, dy=0.0):
    full = np.full
    return AugmentParams(
        full(n, flip),
        full(n, float(angle)),
        full(n, float(scale)),
        full(n, float(dx)),
        full(n, float(dy)),
    )


def reference_warp(images, affine, oh, ow, fill):
    """float64 bilinear sampling of x = a*u + b*v + c, y = d*u + e*v + f, taps outside = fill."""
    n, h, w, c = images.shape
    out = np.empty((n, oh, ow, c))
    v, u = np.mgrid[0:oh, 0:ow].astype(np.float64)
    for i in range(n):
        a, b, cc, d, e, f = affine[i]
        xs, ys = a * u + b * v + cc, d * u + e * v + f
        x0, y0 = np.floor(xs).astype(int), np.floor(ys).astype(int)
        fx, fy = (xs - x0)[..., None], (ys - y0)[..., None]

        def tap(yy, xx, i=i):
            inside = ((xx >= 0) & (xx < w) & (yy >= 0) & (yy < h))[..., None]
            values = images[i, np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)].astype(np.float64)
            return np.where(inside, values, fill)

        out[i] = (
            (1 - fx) * (1 - fy) * tap(y0, x0)
            + fx * (1 - fy) * tap(y0, x0 + 1)
            + (1 - fx) * fy * tap(y0 + 1, x0)
            + fx * fy * tap(y0 + 1, x0 + 1)
        )
    return out


@pytest.mark.parametrize("shape", [(28, 28, 1), (32, 32, 3), (17, 23, 3), (9, 6, 1)])
def test_warp_matches_float64_oracle(shape):
    n = 40
    images = _images(n, shape, seed=3)
    spec = AugmentSpec(translate=0.2, hflip=True, rotate=40, scale=(0.6, 1.4), fill=9)
    params = draw_params(spec, seed=5, epoch=2, indices=np.arange(n), in_hw=shape[:2])
    out = np.empty_like(images)
    augment_batch(images, out, params, fill=9)
    expected = reference_warp(images, params.affine(shape[:2], shape[:2]), *shape[:2], 9)
    # Positions resolved to 1/256 pixel (at most 255/256 of a level per axis) and rounding
    # after each lerp (RGB: three): within 3 grey levels everywhere, within 1 almost everywhere.
    assert np.abs(out - expected).max() <= 3.0
    assert np.mean(np.abs(out - expected) <= 1.0) > 0.95


def test_crop_and_scale_match_oracle():
    images = _images(10, (40, 30, 3), seed=4)
    spec = AugmentSpec(crop=(24, 20), scale=(0.5, 2.0), rotate=10)
    params = draw_params(spec, seed=1, epoch=0, indices=np.arange(10), in_hw=(40, 30))
    out = np.empty((10, 24, 20, 3), np.uint8)
    augment_batch(images, out, params)
    expected = reference_warp(images, params.affine((40, 30), (24, 20)), 24, 20, 0)
    assert np.abs(out - expected).max() <= 3.0


@pytest.mark.parametrize("shape", [(28, 28), (16, 12, 3)])
def test_identity_is_exact(shape):
    images = _images(5, shape)
    out = np.empty_like(images)
    augment_batch(images, out, identity_params(5))
    np.testing.assert_array_equal(out, images)


def test_channels_first_writes_planes():
    images = _images(4, (6, 5, 3))
    out = np.empty((4, 3, 6, 5), np.uint8)
    augment_batch(images, out, identity_params(4), channels_first=True)
    np.testing.assert_array_equal(out, images.transpose(0, 3, 1, 2))


def test_reflection_translation_and_crop_are_exact_copies():
    images = _images(3, (8, 10, 3))
    out = np.empty_like(images)
    augment_batch(images, out, _params(3, flip=True))
    np.testing.assert_array_equal(out, images[:, :, ::-1])

    augment_batch(images, out, _params(3, dx=3, dy=-2), fill=7)
    expected = np.full_like(images, 7)
    expected[:, 2:, :7] = images[:, :6, 3:]  # content moves left by 3 and down by 2
    np.testing.assert_array_equal(out, expected)

    small = np.empty((3, 4, 6, 3), np.uint8)
    augment_batch(images, small, identity_params(3))  # centre crop
    np.testing.assert_array_equal(small, images[:, 2:6, 2:8])


def test_quarter_turn_is_a_rotation():
    images = _images(2, (9, 9))
    out = np.empty_like(images)
    augment_batch(images, out, _params(2, angle=90))
    expected = np.rot90(images, -1, axes=(1, 2))
    assert np.abs(out.astype(int) - expected).max() <= 1


def test_outside_reads_fill():
    images = np.full((1, 8, 8), 200, np.uint8)
    out = np.empty_like(images)
    augment_batch(images, out, _params(1, scale=0.5), fill=10)  # zoomed out: a border appears
    assert out[0, 0, 0] == 10 and out[0, 4, 4] == 200


def test_parameters_depend_only_on_seed_epoch_index():
    spec = AugmentSpec(translate=0.1, hflip=True, rotate=15, scale=(0.9, 1.1), crop=(20, 20))
    idx = np.array([5, 17, 3, 40000, 9])
    a = draw_params(spec, 7, 3, idx, (28, 28))
    b = draw_params(spec, 7, 3, idx[::-1], (28, 28))  # another order, another batch
    for field in ("flip", "angle", "scale", "shift_x", "shift_y"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field)[::-1])
    single = draw_params(spec, 7, 3, idx[1:2], (28, 28))
    assert single.angle[0] == a.angle[1]
    assert not np.array_equal(draw_params(spec, 7, 4, idx, (28, 28)).angle, a.angle)
    assert not np.array_equal(draw_params(spec, 8, 3, idx, (28, 28)).angle, a.angle)


def test_parameter_ranges_and_distribution():
    spec = AugmentSpec(translate=0.1, hflip=True, rotate=15, scale=(0.8, 1.25), crop=(24, 24))
    p = draw_params(spec, 0, 0, np.arange(20000), (28, 28))
    assert np.abs(p.angle).max() <= 15 and np.abs(p.angle).max() > 14
    assert 0.8 <= p.scale.min() and p.scale.max() <= 1.25
    assert np.abs(p.shift_x).max() <= 0.1 * 28 + 2 and np.abs(p.shift_y).max() <= 0.1 * 28 + 2
    assert 0.45 < p.flip.mean() < 0.55
    u = uniforms(1, 2, np.arange(50000), 3)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    none = draw_params(AugmentSpec(), 0, 0, np.arange(10), (28, 28))
    assert not none.flip.any() and not none.angle.any() and (none.scale == 1).all()


def test_augmenter_is_reproducible_and_varies_by_epoch():
    images = _images(16, (28, 28))
    augmenter = Augmenter(AugmentSpec.parse("mnist"), seed=11)
    first, again, other = (np.empty_like(images) for _ in range(3))
    augmenter(images, first, 0, np.arange(16))
    augmenter(images, again, 0, np.arange(16))
    augmenter(images, other, 1, np.arange(16))
    np.testing.assert_array_equal(first, again)
    assert (first != other).any(axis=(1, 2)).all()  # every image differs in the next epoch


def test_spec_parsing():
    spec = AugmentSpec.parse("translate=0.1,hflip,rotate=15,scale=0.9:1.1,crop=24,fill=3")
    assert spec == AugmentSpec(0.1, True, 15.0, (0.9, 1.1), (24, 24), 3)
    assert AugmentSpec.parse("crop=20x24").crop == (20, 24)
    assert AugmentSpec.parse("mnist,rotate=5").rotate == 5
    assert AugmentSpec.parse("mnist").translate == 0.1
    assert not AugmentSpec.parse("none").random and AugmentSpec.parse("hflip").random
    assert AugmentSpec.parse("crop=8").output_shape((28, 28, 3)) == (8, 8, 3)
    with pytest.raises(ValueError, match="unknown augmentation 'shear'"):
        AugmentSpec.parse("shear=3")
    with pytest.raises(ValueError, match="bad augmentation 'rotate=x'"):
        AugmentSpec.parse("rotate=x")
    with pytest.raises(ValueError, match="out of range"):
        AugmentSpec.parse("rotate=500")
    with pytest.raises(ValueError, match="larger than the image"):
        AugmentSpec(crop=(30, 30)).output_shape((28, 28))


def test_bad_buffers_are_refused():
    images = _images(2, (8, 8, 3))
    with pytest.raises(ValueError, match="does not hold 3-channel images"):
        augment_batch(images, np.empty((2, 8, 8), np.uint8), identity_params(2))
    with pytest.raises(ValueError, match="at least 2 rows"):
        augment_batch(images, np.empty((1, 8, 8, 3), np.uint8), identity_params(2))
    with pytest.raises(ValueError, match="parameter sets"):
        augment_batch(images, np.empty_like(images), identity_params(3))
    with pytest.raises(ValueError, match="uint8"):
        augment_batch(images.astype(np.float32), np.empty_like(images), identity_params(2))
