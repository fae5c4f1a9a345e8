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
def first_order_variance(multiply, same, a, b, ea, eb, out):
    """A 1-Lipschitz elementwise op's or a multiply's bound before its rounding, squared (tools/bounds.py
    `_elementwise`): per operand with errors (`ea` / `eb`: its bound, no elements where it has none), what it
    moves the value by: its bound times its places (`same`: one value in both, x + x), for a multiply the other's
    magnitude times it ((2 |a| + e_a) e_a for x * x); squares added in operand order, a multiply's e_a e_b last
    (what both do together). `a`, `b`: the operands' values (b is a for a unary op)."""
    with_a, with_b = ea.size > 0, eb.size > 0
    places = 2.0 if same else 1.0
    for i in range(out.size):
        v = 0.0
        if with_a:
            e = np.float64(ea[i])
            if not multiply:
                d = places * e
            elif same:
                d = (2 * abs(np.float64(a[i])) + e) * e
            else:
                d = abs(np.float64(b[i])) * e
            v += d * d
        if with_b:
            e = np.float64(eb[i])
            d = abs(np.float64(a[i])) * e if multiply else e
            v += d * d
        if multiply and with_a and with_b:
            both = np.float64(ea[i]) * np.float64(eb[i])
            v += both * both
        out[i] = v


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
    for j in range(factor.size):
        scale = factor[j]
        for i in range(j * block, min(bound.size, (j + 1) * block)):
            out[i] = bound[i] * scale


@njit(cache=True, nogil=True, error_model="numpy")
def bilinear_deviations(divide, x, a, b, da, db, out):
    """The samples' deviations of a multiply or a divide from its operands' (tools/bound_samples.py, every sample
    in float32 as the samples are; `da` / `db` with no columns: that operand has none): multiply,
    da (b + db) + a db; divide, (da - x db) / (b + db)."""
    with_a, with_b = da.shape[1] > 0, db.shape[1] > 0
    for k in range(out.shape[0]):
        for i in range(out.shape[1]):
            if not with_b:
                if not with_a:
                    out[k, i] = 0
                elif divide:
                    out[k, i] = da[k, i] / np.float32(b[i])
                else:
                    out[k, i] = da[k, i] * np.float32(b[i])
            elif divide:
                moved = -np.float32(x[i]) * db[k, i]
                if with_a:
                    moved += da[k, i]
                out[k, i] = moved / (np.float32(b[i]) + db[k, i])
            elif with_a:
                out[k, i] = da[k, i] * (np.float32(b[i]) + db[k, i]) + np.float32(a[i]) * db[k, i]
            else:
                out[k, i] = np.float32(a[i]) * db[k, i]


@njit(cache=True, nogil=True, error_model="numpy")
def add_noise(samples, noise, own, sigmas):
    """Each sample's own error (tools/bounds.py `_sample`): samples[k, i] += noise[k, i] x float32(own[i] / sigmas)
    (float32 as the samples are)."""
    for k in range(samples.shape[0]):
        for i in range(samples.shape[1]):
            samples[k, i] += noise[k, i] * np.float32(own[i] / sigmas)
