"""Numba kernels that render augmented images: one affine map per image, sampled bilinearly.

:func:`warp_kernel` maps every output pixel (column u, row v) to the source position
``x = a*u + b*v + c``, ``y = d*u + e*v + f`` and samples it bilinearly; source pixels outside
the image read as ``fill``. Along a row the source position moves by a constant step, so it is
tracked in 16.16 fixed point and the bilinear weights are 8-bit fractions whose products sum to
2**16: the inner loop is integer arithmetic only (the scheme of OpenCV's ``warpAffine``). RGB
images are first spread into one 64-bit word per pixel, a 16-bit lane per channel, so a blend is
three lane-parallel lerps (SWAR) instead of twelve multiplications. Each row is split, by
intervals (the position is linear in the column), into columns that sample only outside the
image (written as ``fill``), the few border columns (each tap checked) and the interior, which
runs without bounds checks. Maps that are only a reflection and whole-pixel shifts (translation,
crop, flip) are copied exactly, without resampling.

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
    packed = np.empty(h * w if nc == 3 else 0, np.uint64)  # one image's pixels as SWAR words
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
        if nc == 3:
            _pack_rgb(image, packed)
        for v in range(oh):
            x = int(round((b * v + c) * one))
            y = int(round((e * v + f) * one))
            # Columns [t_lo, t_hi) touch the image, [lo, hi) lie wholly inside it: fill the
            # rest, check each tap at the edges, run the interior without bounds checks.
            t_lo, t_hi = _span(x, step_x, y, step_y, -one, w * one, -one, h * one, ow)
            lo, hi = _span(x, step_x, y, step_y, 0, (w - 1) * one, 0, (h - 1) * one, ow)
            if lo >= hi:
                lo = hi = t_lo
            o = np.uint64(v * ow * pixel_step)
            _fill_run(out, o, pixel_step, channel_step, nc, fill, 0, t_lo)
            _fill_run(out, o, pixel_step, channel_step, nc, fill, t_hi, ow)
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
                t_lo,
                lo,
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
                t_hi,
            )
            if nc == 3:
                _interior_rgb(
                    packed, out, o, pixel_step, channel_step, w, x, step_x, y, step_y, lo, hi
                )
            else:
                _interior(
                    image, out, o, pixel_step, channel_step, w, nc, x, step_x, y, step_y, lo, hi
                )


@njit(cache=True, nogil=True, inline="always")
def _within(x, y, lo_x, hi_x, lo_y, hi_y):
    return lo_x <= x < hi_x and lo_y <= y < hi_y


@njit(cache=True, nogil=True)
def _span(x, step_x, y, step_y, lo_x, hi_x, lo_y, hi_y, ow):
    """[lo, hi): the output columns u of a row with lo_x <= x + u*step_x < hi_x, same for y.

    Along a row the source position is linear in the column, so those columns are one interval:
    estimate its ends in floating point, then move each end to the exact boundary.
    """
    lo, hi = 0.0, float(ow)
    for pos, step, bottom, top in ((x, step_x, lo_x, hi_x), (y, step_y, lo_y, hi_y)):
        if step == 0:
            if not (bottom <= pos < top):
                return 0, 0
        else:
            ends = ((bottom - pos) / step, (top - pos) / step)
            lo, hi = max(lo, min(ends)), min(hi, max(ends))
    ulo = min(max(int(math.ceil(lo)), 0), ow)
    uhi = min(max(int(math.ceil(hi)), ulo), ow)
    while ulo < uhi and not _within(x + ulo * step_x, y + ulo * step_y, lo_x, hi_x, lo_y, hi_y):
        ulo += 1
    while ulo > 0 and _within(
        x + (ulo - 1) * step_x, y + (ulo - 1) * step_y, lo_x, hi_x, lo_y, hi_y
    ):
        ulo -= 1
    uhi = max(uhi, ulo)
    while uhi > ulo and not _within(
        x + (uhi - 1) * step_x, y + (uhi - 1) * step_y, lo_x, hi_x, lo_y, hi_y
    ):
        uhi -= 1
    while uhi < ow and _within(x + uhi * step_x, y + uhi * step_y, lo_x, hi_x, lo_y, hi_y):
        uhi += 1
    return ulo, uhi


@njit(cache=True, nogil=True)
def _fill_run(out, o, pixel_step, channel_step, nc, fill, lo, hi):
    """Columns lo..hi of a row that sample only outside the image: ``fill``."""
    for u in range(lo, hi):
        q = o + np.uint64(u * pixel_step)
        for ch in range(nc):
            out[q + np.uint64(ch) * channel_step] = fill


@njit(cache=True, nogil=True, inline="always")
def _weights(x, y):
    """Bilinear weights (w00, w01, w10, w11), summing to 2**FRACTION_BITS."""
    fx = (x >> (FRACTION_BITS - WEIGHT_BITS)) & ((1 << WEIGHT_BITS) - 1)
    fy = (y >> (FRACTION_BITS - WEIGHT_BITS)) & ((1 << WEIGHT_BITS) - 1)
    w11 = fx * fy
    w01 = (fx << WEIGHT_BITS) - w11
    w10 = (fy << WEIGHT_BITS) - w11
    return (1 << FRACTION_BITS) - w01 - w10 - w11, w01, w10, w11


_LANES = np.uint64(0x000000FF00FF00FF)  # R, G, B in the low byte of three 16-bit lanes
_LANE_HALF = np.uint64(0x0000008000800080)  # 0.5 in each lane after an 8-bit weighting


@njit(cache=True, nogil=True)
def _pack_rgb(image, packed):
    """Spread each RGB pixel into one word, a 16-bit lane per channel: R | G << 16 | B << 32."""
    for p in range(packed.shape[0]):
        q = 3 * p
        packed[p] = (
            np.uint64(image[q])
            | (np.uint64(image[q + 1]) << np.uint64(16))
            | (np.uint64(image[q + 2]) << np.uint64(32))
        )


@njit(cache=True, nogil=True, inline="always")
def _lerp_lanes(left, right, weight):
    """(left * (256 - weight) + right * weight) / 256, rounded, in all three lanes at once.

    Each lane holds at most 255 * 256 before the shift, so no lane carries into the next.
    """
    full = np.uint64(1 << WEIGHT_BITS)
    mixed = left * (full - weight) + right * weight + _LANE_HALF
    return (mixed >> np.uint64(WEIGHT_BITS)) & _LANES


@njit(cache=True, nogil=True)
def _interior_rgb(packed, out, o, pixel_step, channel_step, w, x, step_x, y, step_y, lo, hi):
    """Columns lo..hi of a row of an RGB image (no bounds checks: see _span).

    SWAR: the three channels of a tap are one word of :func:`_pack_rgb`, so the bilinear blend
    is three lane-parallel lerps (horizontal, horizontal, vertical) per pixel instead of twelve
    multiplications; rounding after each pass keeps it within one grey level of the exact blend.
    """
    mask = (1 << WEIGHT_BITS) - 1
    shift = FRACTION_BITS - WEIGHT_BITS
    row = np.uint64(w)
    one_u = np.uint64(1)
    byte = np.uint64(0xFF)
    for u in range(lo, hi):
        xu = x + u * step_x
        yu = y + u * step_y
        fx = np.uint64((xu >> shift) & mask)
        fy = np.uint64((yu >> shift) & mask)
        # Unsigned indices: numba then skips its negative-index wraparound checks.
        p00 = np.uint64((yu >> FRACTION_BITS) * w + (xu >> FRACTION_BITS))
        p10 = p00 + row
        top = _lerp_lanes(packed[p00], packed[p00 + one_u], fx)
        bottom = _lerp_lanes(packed[p10], packed[p10 + one_u], fx)
        blend = _lerp_lanes(top, bottom, fy)
        q = o + np.uint64(u * pixel_step)
        out[q] = blend & byte
        out[q + channel_step] = (blend >> np.uint64(16)) & byte
        out[q + np.uint64(2) * channel_step] = (blend >> np.uint64(32)) & byte


@njit(cache=True, nogil=True)
def _interior(image, out, o, pixel_step, channel_step, w, nc, x, step_x, y, step_y, lo, hi):
    """Columns lo..hi of a row, any channel count (no bounds checks: see _span)."""
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
        o = np.uint64(v * ow * pixel_step)
        if not 0 <= y < h:
            _fill_run(out, o, pixel_step, channel_step, nc, fill, 0, ow)
            continue
        # Columns whose source x = a*u + c lies in 0..w-1.
        lo, hi = (-c, w - c) if a == 1 else (c - w + 1, c + 1)
        lo, hi = min(max(lo, 0), ow), min(max(hi, 0), ow)
        hi = max(hi, lo)
        _fill_run(out, o, pixel_step, channel_step, nc, fill, 0, lo)
        _fill_run(out, o, pixel_step, channel_step, nc, fill, hi, ow)
        row = y * w
        if a == 1 and pixel_step == nc:  # interleaved and not mirrored: one contiguous block
            start = (row + lo + c) * nc
            first = v * ow * nc + lo * nc
            out[first : first + (hi - lo) * nc] = image[start : start + (hi - lo) * nc]
            continue
        for u in range(lo, hi):
            p = np.uint64((row + a * u + c) * nc)
            q = o + np.uint64(u * pixel_step)
            for ch in range(nc):
                out[q + np.uint64(ch) * channel_step] = image[p + np.uint64(ch)]
