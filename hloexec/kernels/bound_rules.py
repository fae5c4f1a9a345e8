"""The per-element error bounds' hot rules (tools/bounds.py, tools/bound_samples.py) as one pass per element: each
kernel reads its arrays once and writes its results, with no temporaries (the numpy forms they replace made ~30
array passes per element of each rule). The formulas are the bound rules' (their docstrings say why); here only
how they are computed. Arrays come in 1-D (callers ravel them); scalars describe the types."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .half import bitcast_f64_to_i64, bitcast_i64_to_f64


@njit(inline="always")
def _ulp(magnitude, nmant, tiny):
    """tools/compare.ulp_at for one element: the ulp of a type of `nmant` stored significand bits at |magnitude|,
    floored at the ulp of its smallest normal `tiny`; a non-finite magnitude's is 1's."""
    m = abs(magnitude)
    if not math.isfinite(m):
        m = 1.0
    elif m < tiny:
        m = tiny
    field = (bitcast_f64_to_i64(m) >> 52) - nmant
    if field >= 1:
        return bitcast_i64_to_f64(field << 52)
    return math.ldexp(1.0, int(field) - 1023)  # (below f64's normals: a subnormal power of two)


@njit(inline="always")
def _nan_min(a, b):
    """np.minimum's meaning: NaN if either is."""
    if a != a or b != b:
        return math.nan
    return a if a < b else b


@njit(cache=True, nogil=True, error_model="numpy")
def round_bounds(x, variance, at, own_out, bound_out, nmant, tiny, half_ulps, wide_nmant, wide_tiny, wide_ulps,
                 precision_scale, exact_rule, largest, has_inf, largest_error):  # fmt: skip
    """A value's own rounding and its bound after it, per element (tools/bounds.py `_rounding`, `_rounded`):
    b = sqrt(variance), the bound before the rounding; its magnitude |x| + a (a: `at`'s element, b where `at` has
    no elements); own = half_ulps x the ulp (`nmant`, `tiny`) there, at least precision_scale x the magnitude
    (reduce-precision; 0: none), plus wide_ulps x an ulp of the wider type (transcendentals; 0: none); 0 where
    `exact_rule` and b == 0 and x is a value of the type (a multiple of its ulp at |x|, at most `largest`, or an
    infinity where the type `has_inf`). bound = min(sqrt(b^2 + own^2), b + own x largest_error)."""
    own_at = at.size > 0
    for i in range(x.size):
        v = np.float64(x[i])
        b = math.sqrt(variance[i])
        magnitude = abs(v) + (at[i] if own_at else b)
        own = half_ulps * _ulp(magnitude, nmant, tiny)
        if precision_scale > 0:
            own = max(own, precision_scale * magnitude) if magnitude == magnitude else math.nan
        if wide_ulps > 0:
            own += wide_ulps * _ulp(magnitude, wide_nmant, wide_tiny)
        if exact_rule and b == 0:
            if math.isinf(v):
                representable = has_inf
            else:
                steps = v / _ulp(v, nmant, tiny)  # (exact: the ulp is a power of two)
                representable = abs(v) <= largest and steps == math.floor(steps)
            if representable:
                own = 0.0
        own_out[i] = own
        bound_out[i] = _nan_min(math.sqrt(b * b + own * own), b + own * largest_error)


@njit(cache=True, nogil=True, error_model="numpy")
def block_ratios(deviations, bound, block):
    """Per block of `block` consecutive elements (the last one shorter), what calibration reads
    (tools/bound_samples.calibrate): the largest and the sum of r = (sum over the samples of a deviation's square,
    in float32 as the samples are) / bound^2 over the elements with a finite positive bound and finite samples
    ("seen"), and how many were seen. `deviations`: (samples, n). Returns (largest, total, counted, seen,
    unjudged): unjudged, whether a finite bound has non-finite samples (then the bound is kept as it is)."""
    n = bound.size
    blocks = (n + block - 1) // block
    largest = np.zeros(blocks)
    total = np.zeros(blocks)
    counted = np.zeros(blocks, np.int64)
    squares = np.empty(block, np.float32)
    seen_all = 0
    unjudged = False
    for j in range(blocks):
        start, stop = j * block, min(n, (j + 1) * block)
        squares[:] = 0  # (sample by sample along the block: loops the compiler vectorizes)
        for k in range(deviations.shape[0]):
            for i in range(start, stop):
                d = deviations[k, i]
                squares[i - start] += d * d
        for i in range(start, stop):
            q, e = squares[i - start], bound[i]
            if not math.isfinite(q):
                unjudged |= e < math.inf
                continue
            if not (e > 0 and e < math.inf):
                continue
            ratio = np.float64(q) / (np.float64(e) * np.float64(e))
            if ratio > largest[j] or ratio != ratio:  # (NaN, as np.max: 0 / 0 where e^2 underflows)
                largest[j] = ratio
            total[j] += ratio
            counted[j] += 1
        seen_all += counted[j]
    return largest, total, counted, seen_all, unjudged


@njit(cache=True, nogil=True, error_model="numpy")
def scale_blocks(bound, factor, block, out):
    """out = bound x its block's factor (blocks of `block` consecutive elements)."""
    for i in range(bound.size):
        out[i] = bound[i] * factor[i // block]


@njit(cache=True, nogil=True, error_model="numpy")
def add_noise(samples, noise, own, sigmas):
    """Each sample's own error (tools/bounds.py `_sample`): samples[k, i] += noise[k, i] x float32(own[i] / sigmas)
    (float32 as the samples are)."""
    for k in range(samples.shape[0]):
        for i in range(samples.shape[1]):
            samples[k, i] += noise[k, i] * np.float32(own[i] / sigmas)
