"""Image augmentation: random translations, reflections, rotations, crops and scales (Adam 3.1).

Adam's data servers transform every image differently in every epoch, so that each epoch sees a
new variant of the data set. Here a transformation is drawn per image per epoch from a
counter-based hash of ``(seed, epoch, record index)`` (splitmix64): it does not depend on which
worker reads the image, in which batch, in which order, or how many times -- the same triple
always gives the same variant, on any machine. :class:`AugmentSpec` says what may vary;
:func:`draw_params` draws the parameters; :func:`augment_batch` renders a batch with one numba
kernel (``nogil``, so a prefetch thread runs it beside the training loop).

Every transformation is one affine map from output to source pixel coordinates, sampled
bilinearly; source pixels outside the image read as ``fill``. A map that is only a reflection
and whole-pixel shifts (translate, crop, hflip without rotate or scale) takes an exact copying
path: no resampling blur, and the identity reproduces the input bit for bit.

Parameters of one image (all in source pixels, about the image centre):

- ``flip``: mirror left-right (probability 1/2 when ``hflip``);
- ``angle``: rotation, uniform in ``[-rotate, rotate]`` degrees;
- ``scale``: zoom, log-uniform in ``[scale_min, scale_max]`` (> 1 magnifies);
- ``shift_x``, ``shift_y``: translation uniform in ``[-translate, translate]`` times the side,
  plus the random crop position (uniform over the positions the crop fits in).

What differs from Adam: the variant is computed just before it is needed on the training
machine's own cores, or epochs ahead by a data server (:class:`hogwild.data.resident.RenderAhead`),
as Adam's data-serving machines did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hogwild.config.augment_spec import AugmentSpec

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class AugmentParams:
    """Per-image transformation parameters of a batch (see the module docstring).

    Attributes:
        flip: bool ``[n]``.
        angle: float64 ``[n]``, degrees.
        scale: float64 ``[n]``, zoom factor.
        shift_x: float64 ``[n]``, source pixels (positive: the content moves left).
        shift_y: float64 ``[n]``, source pixels (positive: the content moves up).
    """

    flip: np.ndarray
    angle: np.ndarray
    scale: np.ndarray
    shift_x: np.ndarray
    shift_y: np.ndarray

    def __len__(self) -> int:
        return self.flip.shape[0]

    def affine(self, in_hw: tuple[int, int], out_hw: tuple[int, int]) -> np.ndarray:
        """float64 ``[n, 6]``: (a, b, c, d, e, f) with source x = a*u + b*v + c, y = d*u + e*v + f
        for output column u and row v. Maps without rotation or scale get whole-pixel offsets."""
        (h, w), (oh, ow) = in_hw, out_hw
        theta = np.deg2rad(self.angle)
        sign = np.where(self.flip, -1.0, 1.0)
        cos, sin, inv = np.cos(theta), np.sin(theta), 1.0 / self.scale
        a, b = sign * cos * inv, sign * sin * inv
        d, e = -sin * inv, cos * inv
        cx, cy = (w - 1) / 2 + self.shift_x, (h - 1) / 2 + self.shift_y
        ux, uy = (ow - 1) / 2, (oh - 1) / 2
        c = cx - a * ux - b * uy
        f = cy - d * ux - e * uy
        rigid = (self.angle == 0) & (self.scale == 1)
        c = np.where(rigid, np.floor(c + 0.5), c)
        f = np.where(rigid, np.floor(f + 0.5), f)
        a, b, d, e = (np.where(rigid, np.round(m), m) for m in (a, b, d, e))
        return np.ascontiguousarray(np.stack([a, b, c, d, e, f], axis=1))


def identity_params(n: int) -> AugmentParams:
    """Parameters that leave ``n`` images as they are (centre crop when the output is smaller)."""
    zeros = np.zeros(n)
    return AugmentParams(np.zeros(n, dtype=bool), zeros, np.ones(n), zeros.copy(), zeros.copy())


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def uniforms(seed: int, epoch: int, indices: np.ndarray, k: int) -> np.ndarray:
    """float64 ``[n, k]`` in [0, 1): stream ``k`` of the hash of (seed, epoch, index)."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1).astype(np.uint64)
    head = _mix(np.array([seed & _MASK64], dtype=np.uint64))
    head = _mix(head ^ np.array([(epoch * _GOLDEN) & _MASK64], dtype=np.uint64))
    key = _mix(head ^ (idx * np.uint64(_GOLDEN)))
    streams = np.arange(1, k + 1, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
    bits = _mix(key[:, None] + streams[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def draw_params(
    spec: AugmentSpec, seed: int, epoch: int, indices: np.ndarray, in_hw: tuple[int, int]
) -> AugmentParams:
    """The parameters of images ``indices`` in ``epoch``: a pure function of its arguments.

    Args:
        spec: What may vary.
        seed: The job's seed.
        epoch: The epoch (0-based).
        indices: Record indices of the batch.
        in_hw: (H, W) of the source images.
    """
    h, w = in_hw
    oh, ow = spec.output_shape((h, w))
    u = uniforms(seed, epoch, indices, 7)
    flip = (u[:, 0] < 0.5) if spec.hflip else np.zeros(len(u), dtype=bool)
    angle = (2 * u[:, 1] - 1) * spec.rotate
    lo, hi = spec.scale
    scale = np.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * u[:, 2])
    shift_x = (2 * u[:, 3] - 1) * spec.translate * w + (2 * u[:, 5] - 1) * (w - ow) / 2
    shift_y = (2 * u[:, 4] - 1) * spec.translate * h + (2 * u[:, 6] - 1) * (h - oh) / 2
    return AugmentParams(flip, angle, scale, shift_x, shift_y)


def augment_batch(
    images: np.ndarray,
    out: np.ndarray,
    params: AugmentParams | np.ndarray,
    *,
    channels_first: bool = False,
    fill: int = 0,
) -> np.ndarray:
    """Render the variants of a batch into ``out``.

    Args:
        images: uint8 ``[n, H, W]`` or ``[n, H, W, C]``, C-contiguous.
        out: uint8, C-contiguous, at least ``n`` rows of ``oh * ow * C`` bytes: ``[n, oh, ow]``,
            ``[n, oh, ow, C]``, ``[n, C, oh, ow]`` with ``channels_first`` (the layout the model
            reads), or flat ``[n, oh*ow*C]``. ``(oh, ow)`` is the output size: the crop, or
            (H, W) if ``out`` has the input's row size.
        params: :class:`AugmentParams` of the batch (length n), or an ``[n, 6]`` affine array.
        channels_first: Write each image as C planes instead of interleaved channels.
        fill: Value of pixels mapped from outside the source.

    Returns:
        ``out[:n]``.

    Raises:
        ValueError: Mismatched shapes or types.
    """
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or not images.flags.c_contiguous:
        raise ValueError(
            f"images must be C-contiguous uint8 [n,H,W(,C)], got {images.dtype} "
            f"{list(images.shape)}"
        )
    src = images if images.ndim == 4 else images[:, :, :, None]
    n, h, w, c = src.shape
    oh, ow = _output_hw(out, n, h, w, c, channels_first)
    if isinstance(params, AugmentParams):
        if len(params) != n:
            raise ValueError(f"{len(params)} parameter sets for {n} images")
        params = params.affine((h, w), (oh, ow))
    if params.shape != (n, 6):
        raise ValueError(f"the affine parameters must be [n, 6], got {list(params.shape)}")
    # imported here: loading numba costs a process that never renders (a data server without
    # augmentation, the driver) a large part of its start-up
    from hogwild.data.warp import warp_kernel

    dst = out[:n].reshape(n, oh * ow * c)
    warp_kernel(
        src, dst, np.ascontiguousarray(params, dtype=np.float64), oh, ow, channels_first, fill
    )
    return out[:n]


def _output_hw(out, n, h, w, c, channels_first) -> tuple[int, int]:
    """(oh, ow) that ``out``'s rows hold; ValueError if they do not hold c-channel images."""
    if out.dtype != np.uint8 or not out.flags.c_contiguous or out.shape[0] < n:
        raise ValueError(
            f"out must be C-contiguous uint8 with at least {n} rows, got {out.dtype} "
            f"{list(out.shape)}"
        )
    shape = out.shape[1:]
    if len(shape) == 3 and channels_first and shape[0] == c:
        return shape[1], shape[2]
    if len(shape) == 3 and not channels_first and shape[2] == c:
        return shape[0], shape[1]
    if len(shape) == 2 and c == 1:
        return shape[0], shape[1]
    if len(shape) == 1 and shape[0] == h * w * c:
        return h, w
    layout = "[n, C, oh, ow]" if channels_first else "[n, oh, ow, C]"
    raise ValueError(
        f"out of shape {list(out.shape)} does not hold {c}-channel images; expected {layout}, "
        f"[n, oh, ow] for grey, or flat rows of {h * w * c} bytes"
    )


class Augmenter:
    """A spec and a seed: renders the variants of any batch for any epoch.

    Args:
        spec: What may vary.
        seed: The job's seed.
        channels_first: Write ``[n, C, oh, ow]`` (the model's layout) instead of HWC.
    """

    def __init__(self, spec: AugmentSpec, seed: int, *, channels_first: bool = False) -> None:
        self.spec, self.seed, self.channels_first = spec, seed, channels_first

    def output_shape(self, shape: tuple[int, int, int]) -> tuple[int, int, int]:
        """(oh, ow, C) of the variants of images of ``shape`` (H, W, C)."""
        return self.spec.output_shape(shape)

    def __call__(
        self, images: np.ndarray, out: np.ndarray, epoch: int, indices: np.ndarray
    ) -> np.ndarray:
        """Render the variants of ``images`` (records ``indices``) for ``epoch`` into ``out``."""
        n = images.shape[0]
        if self.spec.random:
            params = draw_params(self.spec, self.seed, epoch, indices, images.shape[1:3])
        else:
            params = identity_params(n)
        return augment_batch(
            images, out, params, channels_first=self.channels_first, fill=self.spec.fill
        )
