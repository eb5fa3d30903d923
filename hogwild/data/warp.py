"""Numba kernels that render augmented images: one affine map per image, sampled bilinearly.

:func:`warp_kernel` maps every output pixel (column u, row v) to the source position
``x = a*u + b*v + c``, ``y = d*u + e*v + f`` and samples it bilinearly; source pixels outside
the image read as ``fill``. Along a row the source position moves by a constant step, so it is
tracked in 16.16 fixed point and the bilinear weights are 8-bit fractions whose products sum to
2**16: the inner loop is integer arithmetic only (the scheme of OpenCV's ``warpAffine``). Each
row is split into the columns whose 2x2 neighbourhood lies inside the image -- an interval,
because the position is linear in the column -- which run without bounds checks, and the few
border columns, which check each tap. Maps that are only a reflection and whole-pixel shifts
(translation, crop, flip) are copied exactly, without resampling.

Invariants: every kernel writes each output value exactly once, reads only inside the source
image, and is ``nogil`` (a prefetch thread renders while the training loop runs).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

FRACTION_BITS = 16
"""Fixed-point precision of the warp's source coordinates (16.16)."""

WEIGHT_BITS = 8
"""Bits of each bilinear weight: the sub-pixel position is resolved to 1/256 pixel."""


@njit(cache=True, nogil=True)
def warp_kernel(src, dst, affine, oh, ow, channels_first, fill):
    """Affine warp of every image, bilinear or (whole-pixel maps) exact; see :func:`augment_batch`.

    ``src`` is uint8 ``[n, H, W, C]``, ``dst`` uint8 ``[n, oh*ow*C]``, ``affine`` float64
    ``[n, 6]``. A destination value sits at ``pixel * pixel_step + channel * channel_step``:
    (C, 1) for interleaved channels, (1, oh*ow) for planes. Source coordinates step along a row
    in 16.16 fixed point and the bilinear weights are 8-bit fractions (their products sum to
    2**16), so the inner loop is integer arithmetic only.
    """
    n, h, w, nc = src.shape
    flat = src.reshape(n, h * w * nc)
    pixel_step, channel_step = (1, oh * ow) if channels_first else (nc, 1)
    channel_step = np.uint64(channel_step)
    one = 1 << FRACTION_BITS
    for i in range(n):
        image, out = flat[i], dst[i]
        a, b, c = affine[i, 0], affine[i, 1], affine[i, 2]
        d, e, f = affine[i, 3], affine[i, 4], affine[i, 5]
        rigid = (
            b == 0.0
            and d == 0.0
            and e == 1.0
            and (a == 1.0 or a == -1.0)
            and c == math.floor(c)
            and f == math.floor(f)
        )
        if rigid:
            _copy_rigid(
                image, out, h, w, nc, oh, ow, int(a), int(c), int(f), pixel_step, channel_step, fill
            )
            continue
        step_x = int(round(a * one))
        step_y = int(round(d * one))
        for v in range(oh):
            x = int(round((b * v + c) * one))
            y = int(round((e * v + f) * one))
            lo, hi = _interior_span(x, step_x, y, step_y, w, h, ow)
            o = np.uint64(v * ow * pixel_step)
            # The border columns check each tap; the interior ones run without bounds checks.
            _border_run(
                image, out, o, pixel_step, channel_step, h, w, nc, x, step_x, y, step_y, fill, 0, lo
            )
            _border_run(
                image,
                out,
                o,
                pixel_step,
                channel_step,
                h,
                w,
                nc,
                x,
                step_x,
                y,
                step_y,
                fill,
                hi,
                ow,
            )
            if nc == 3:
                _interior_rgb(
                    image, out, o, pixel_step, channel_step, w, x, step_x, y, step_y, lo, hi
                )
            else:
                _interior(
                    image, out, o, pixel_step, channel_step, w, nc, x, step_x, y, step_y, lo, hi
                )


@njit(cache=True, nogil=True, inline="always")
def _inside(x, y, w, h):
    """Whether the 2x2 neighbourhood of fixed-point (x, y) lies inside the image."""
    return 0 <= x and (x >> FRACTION_BITS) + 1 < w and 0 <= y and (y >> FRACTION_BITS) + 1 < h


@njit(cache=True, nogil=True)
def _interior_span(x, step_x, y, step_y, w, h, ow):
    """[lo, hi): the output columns of a row whose samples need no bounds checks.

    Along a row the source position is linear in the column, so the columns inside are one
    interval: estimate its ends in floating point, then move each end to the exact boundary.
    """
    lo, hi = 0.0, float(ow)
    for pos, step, side in ((x, step_x, w), (y, step_y, h)):
        top = float((side - 1) << FRACTION_BITS)  # inside: 0 <= pos + step*u < top
        if step == 0:
            if not (0 <= pos < top):
                return 0, 0
        else:
            ends = ((0.0 - pos) / step, (top - pos) / step)
            lo, hi = max(lo, min(ends)), min(hi, max(ends))
    ulo = min(max(int(math.ceil(lo)), 0), ow)
    uhi = min(max(int(math.ceil(hi)), ulo), ow)
    while ulo < uhi and not _inside(x + ulo * step_x, y + ulo * step_y, w, h):
        ulo += 1
    while ulo > 0 and _inside(x + (ulo - 1) * step_x, y + (ulo - 1) * step_y, w, h):
        ulo -= 1
    while uhi > ulo and not _inside(x + (uhi - 1) * step_x, y + (uhi - 1) * step_y, w, h):
        uhi -= 1
    while uhi < ow and _inside(x + uhi * step_x, y + uhi * step_y, w, h):
        uhi += 1
    return ulo, uhi


@njit(cache=True, nogil=True, inline="always")
def _weights(x, y):
    """Bilinear weights (w00, w01, w10, w11), summing to 2**FRACTION_BITS."""
    fx = (x >> (FRACTION_BITS - WEIGHT_BITS)) & ((1 << WEIGHT_BITS) - 1)
    fy = (y >> (FRACTION_BITS - WEIGHT_BITS)) & ((1 << WEIGHT_BITS) - 1)
    w11 = fx * fy
    w01 = (fx << WEIGHT_BITS) - w11
    w10 = (fy << WEIGHT_BITS) - w11
    return (1 << FRACTION_BITS) - w01 - w10 - w11, w01, w10, w11


@njit(cache=True, nogil=True)
def _interior_rgb(image, out, o, pixel_step, channel_step, w, x, step_x, y, step_y, lo, hi):
    """Columns lo..hi of a row of a 3-channel image (no bounds checks: see _interior_span)."""
    half = 1 << (FRACTION_BITS - 1)
    row, step = np.uint64(3 * w), np.uint64(3)
    one_u = np.uint64(1)
    two_u = np.uint64(2)
    for u in range(lo, hi):
        xu = x + u * step_x
        yu = y + u * step_y
        w00, w01, w10, w11 = _weights(xu, yu)
        # Unsigned indices: numba then skips its negative-index wraparound checks.
        p00 = np.uint64(((yu >> FRACTION_BITS) * w + (xu >> FRACTION_BITS)) * 3)
        p10 = p00 + row
        q = o + np.uint64(u * pixel_step)
        out[q] = _lerp4(image, p00, p10, step, w00, w01, w10, w11, half)
        out[q + channel_step] = _lerp4(
            image, p00 + one_u, p10 + one_u, step, w00, w01, w10, w11, half
        )
        out[q + two_u * channel_step] = _lerp4(
            image, p00 + two_u, p10 + two_u, step, w00, w01, w10, w11, half
        )


@njit(cache=True, nogil=True)
def _interior(image, out, o, pixel_step, channel_step, w, nc, x, step_x, y, step_y, lo, hi):
    """Columns lo..hi of a row, any channel count (no bounds checks: see _interior_span)."""
    half = 1 << (FRACTION_BITS - 1)
    row, step = np.uint64(nc * w), np.uint64(nc)
    for u in range(lo, hi):
        xu = x + u * step_x
        yu = y + u * step_y
        w00, w01, w10, w11 = _weights(xu, yu)
        p00 = np.uint64(((yu >> FRACTION_BITS) * w + (xu >> FRACTION_BITS)) * nc)
        p10 = p00 + row
        q = o + np.uint64(u * pixel_step)
        for ch in range(nc):
            cu = np.uint64(ch)
            out[q + cu * channel_step] = _lerp4(
                image, p00 + cu, p10 + cu, step, w00, w01, w10, w11, half
            )


@njit(cache=True, nogil=True)
def _border_run(
    image, out, o, pixel_step, channel_step, h, w, nc, x, step_x, y, step_y, fill, lo, hi
):
    """Columns lo..hi of a row whose neighbourhoods leave the image."""
    for u in range(lo, hi):
        q = o + np.uint64(u * pixel_step)
        _border_pixel(image, out, q, channel_step, h, w, nc, x + u * step_x, y + u * step_y, fill)


@njit(cache=True, nogil=True, inline="always")
def _border_pixel(image, out, q, channel_step, h, w, nc, x, y, fill):
    """One output pixel whose neighbourhood leaves the image: missing taps read ``fill``."""
    x0, y0 = x >> FRACTION_BITS, y >> FRACTION_BITS
    w00, w01, w10, w11 = _weights(x, y)
    for ch in range(nc):
        acc = (
            w00 * _tap(image, h, w, nc, y0, x0, ch, fill)
            + w01 * _tap(image, h, w, nc, y0, x0 + 1, ch, fill)
            + w10 * _tap(image, h, w, nc, y0 + 1, x0, ch, fill)
            + w11 * _tap(image, h, w, nc, y0 + 1, x0 + 1, ch, fill)
        )
        out[q + np.uint64(ch) * channel_step] = (acc + (1 << (FRACTION_BITS - 1))) >> FRACTION_BITS


@njit(cache=True, nogil=True, inline="always")
def _lerp4(image, p00, p10, step, w00, w01, w10, w11, half):
    acc = w00 * image[p00] + w01 * image[p00 + step] + w10 * image[p10] + w11 * image[p10 + step]
    return (acc + half) >> FRACTION_BITS


@njit(cache=True, nogil=True, inline="always")
def _tap(image, h, w, nc, y, x, ch, fill):
    if 0 <= x < w and 0 <= y < h:
        return np.int64(image[(y * w + x) * nc + ch])
    return np.int64(fill)


@njit(cache=True, nogil=True)
def _copy_rigid(image, out, h, w, nc, oh, ow, a, c, f, pixel_step, channel_step, fill):
    """Whole-pixel map x = a*u + c (a = +-1), y = v + f: a copy, row by row, no resampling."""
    for v in range(oh):
        y = v + f
        for u in range(ow):
            x = a * u + c
            o = (v * ow + u) * pixel_step
            if 0 <= x < w and 0 <= y < h:
                p = (y * w + x) * nc
                for ch in range(nc):
                    out[o + ch * channel_step] = image[p + ch]
            else:
                for ch in range(nc):
                    out[o + ch * channel_step] = fill
