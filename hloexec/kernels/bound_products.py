"""Upper bounds of dots of non-negative terms computed in float32 (the error bounds' dot rules,
tools/bound_dots.py: sum_k a_k^2 e_k^2, sum_k a_k^2 b_k^2, ...; sgemm runs ~2x dgemm here), and never below the
float64 form they replace.

The two operands are scaled by powers of two, each to a largest finite term below 2^top, top =
(126 - bit_length(K)) // 2, so no product and no sum of K of them can overflow float32; a positive term below
2^FLOOR_EXPONENT after scaling is raised to it, so every product of positive terms is a float32 normal (no
underflow anywhere: a term raised is only made larger). Then every rounding is relative: each term rounds once
to float32 (a factor >= 1 - u, u = 2^-24) and the product's float32 sum of K non-negative terms, in any order,
is at least (1 - gamma_K) of its exact sum (gamma_K = K u / (1 - K u), Higham's bound for inner products,
with or without FMA). So the exact dot is at most the computed one times (1 - gamma_K)^-1 (1 - u)^-2 <=
1 + 2 (K + 2) u = 1 + (K + 2) 2^-23 for K <= 2^20 (tools/bound_dots.py multiplies by that and undoes the
scaling; longer contractions keep float64). Infinities and NaNs pass as they would in float64 (inf x 0 = NaN)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .bound_rules import (
    _CHUNK_BLOCKS,
    _NO_KEYS,
    _add_square,
    _after_rounding,
    _block_statistics,
    _own_rounding,
    _tally_blocks,
    over_cores,
)
from .half import bf16_to_f32, bitcast_f64_to_i64, f32_to_bf16
from .normal_draws import fill_draws

FLOOR_EXPONENT = -63  # a scaled positive term is at least 2^this: products of two are float32 normals
MAX_SHIFT = 1000  # scaling exponents stay within +-this (2^s a float64 normal)
# elements per span of these passes split over the cores (over_cores) at least: each span's call costs a few us
SPAN = 1 << 17


def top_exponent(contracted: int) -> int:
    """The largest scaled term's exponent bound for a dot of `contracted` terms: K products of two such terms
    add up below float32's overflow."""
    return (126 - int(contracted).bit_length()) // 2


@njit(cache=True, nogil=True, error_model="numpy")
def _largest_magnitude(x):
    """The largest finite |x[i]|'s bits (0 if none): the largest of the magnitudes' bits, as integers (a loop the
    compiler vectorizes, as it does not a float max)."""
    largest = 0
    for i in range(x.size):
        bits = bitcast_f64_to_i64(np.float64(x[i])) & 0x7FFFFFFFFFFFFFFF
        largest = max(largest, bits if bits < 0x7FF0000000000000 else 0)
    return largest


@njit(cache=True, nogil=True, error_model="numpy")
def _least_magnitude(x):
    """The least nonzero |x[i]|'s bits (float64's infinity's if none; integer compares, as _largest_magnitude)."""
    least = 0x7FF0000000000000
    for i in range(x.size):
        bits = bitcast_f64_to_i64(np.float64(x[i])) & 0x7FFFFFFFFFFFFFFF
        least = min(least, bits if bits > 0 else 0x7FF0000000000000)
    return least


def least_magnitude(x: np.ndarray) -> float:
    """The least nonzero |x| of a real array (inf if none; NaN counts as none). Over the cores (over_cores)."""
    flat = np.ravel(x)
    least = min(over_cores(flat.size, 1, lambda first, last: _least_magnitude(flat[first:last]), span=SPAN))
    return float(np.int64(least).view(np.float64))


@njit(cache=True, nogil=True, error_model="numpy")
def _largest_finite_square(x):
    """The largest finite x[i]^2 (0 if none)."""
    largest = 0.0
    for i in range(x.size):
        v = np.float64(x[i]) * np.float64(x[i])
        if v < math.inf:
            largest = max(largest, v)
    return largest


@njit(cache=True, nogil=True, error_model="numpy")
def _scaled(x, square, scale, out):
    floor = np.float32(math.ldexp(1.0, FLOOR_EXPONENT))
    for i in range(x.size):
        v = abs(np.float64(x[i]))
        if square:
            v = v * v
        t = np.float32(v * scale)
        out[i] = floor if (v > 0) & (t < floor) else t


def scaled_terms(x: np.ndarray, square: bool, top: int, out: np.ndarray) -> int:
    """out = float32(|x| (x^2 where `square`) x 2^s), s such that the largest finite one is below 2^top (s within
    +-MAX_SHIFT); a positive one below 2^FLOOR_EXPONENT after scaling raised to it; infinities and NaNs kept.
    Returns s. Two passes over the cores (over_cores): the largest, then the scaled terms."""
    largest = max(over_cores(x.size, 1, lambda first, last: _largest_magnitude(x[first:last]), span=SPAN))
    shift = _shift(x, largest, square, top)
    scale = math.ldexp(1.0, shift)
    over_cores(x.size, 1, lambda first, last: _scaled(x[first:last], square, scale, out[first:last]), span=SPAN)
    return shift


def _shift(x: np.ndarray, largest_bits: int, square: bool, top: int) -> int:
    """scaled_terms' s from the largest finite |x|'s bits."""
    largest = float(np.int64(largest_bits).view(np.float64))
    if square:
        largest = largest * largest
        if largest == math.inf:  # (a finite x whose square overflows: the largest finite square)
            largest = _largest_finite_square(x)
    if largest > 0:  # (largest < 2^frexp's exponent)
        return min(max(top - math.frexp(largest)[1], -MAX_SHIFT), MAX_SHIFT)
    return 0


def squared_terms(x: np.ndarray, error: np.ndarray, top: int, x_out: np.ndarray, error_out: np.ndarray) -> tuple:
    """scaled_terms(x, True, top, x_out), scaled_terms(error, True, top, error_out) and least_relative(error, x),
    bit for bit, in two passes over the cores instead of five: the largests and the least quotient, then both
    operands' scaled squares. Returns (x's s, error's s, the least relative error's lower bound)."""
    spans = over_cores(x.size, 1, lambda first, last: _extents(x[first:last], error[first:last]), span=SPAN)
    shifts = [_shift(v, max(span[k] for span in spans), True, top) for k, v in enumerate((x, error))]
    scales = [math.ldexp(1.0, shift) for shift in shifts]

    def scaled(first, last):
        _scaled(x[first:last], True, scales[0], x_out[first:last])
        _scaled(error[first:last], True, scales[1], error_out[first:last])

    over_cores(x.size, 1, scaled, span=SPAN)
    return shifts[0], shifts[1], _least(spans)


@njit(cache=True, nogil=True, error_model="numpy")
def _extents(x, error):
    """(_largest_magnitude(x)'s bits, _largest_magnitude(error)'s bits, _least_quotient_bits(error, x)...) in one
    loop."""
    largest_x, largest_error = 0, 0
    bits = 0x7FF0000000000000
    infinite = 0
    for i in range(x.size):
        e, v = np.float64(error[i]), abs(np.float64(x[i]))
        x_bits = bitcast_f64_to_i64(v)
        e_bits = bitcast_f64_to_i64(e) & 0x7FFFFFFFFFFFFFFF
        largest_x = max(largest_x, x_bits if x_bits < 0x7FF0000000000000 else 0)
        largest_error = max(largest_error, e_bits if e_bits < 0x7FF0000000000000 else 0)
        infinite += not ((e < math.inf) & (v < math.inf))
        bits = min(bits, bitcast_f64_to_i64(e / v if v > 0 else math.inf))
    return largest_x, largest_error, bits, infinite


@njit(cache=True, nogil=True, error_model="numpy")
def _unscaled(product, factor, shift, out, accumulate):
    if abs(shift) < MAX_SHIFT:
        scale = factor * math.ldexp(1.0, shift)
        for i in range(out.size):
            v = np.float64(product[i]) * scale
            out[i] = out[i] + v if accumulate else v
    else:
        for i in range(out.size):
            v = math.ldexp(np.float64(product[i]) * factor, shift)
            out[i] = out[i] + v if accumulate else v


def add_unscaled(product: np.ndarray, factor: float, shift: int, out: np.ndarray, accumulate: bool) -> None:
    """out (+)= float64(product) x factor x 2^shift (a float32 product of scaled terms back to its scale, times the
    factor that makes it an upper bound; added to out where `accumulate`, else written over it)."""
    over_cores(
        out.size,
        1,
        lambda first, last: _unscaled(product[first:last], factor, shift, out[first:last], accumulate),
        span=SPAN,
    )


@njit(inline="always")
def _perturbed(value, deviation, floor):
    zero = np.float32(0)
    v = np.float32(value) + (zero if abs(deviation) < floor else deviation)
    return zero if abs(v) < floor else v


@njit(cache=True, nogil=True, error_model="numpy")
def _perturbed_span(values, deviations, floor, out, first, last):
    for k in range(out.shape[0]):  # (a row at a time: one-dimensional loops vectorize, 2-4x faster)
        _perturbed_row(values[first:last], deviations[k, first:last], floor, out[k, first:last])


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _perturbed_row(values, deviations, floor, out):
    for i in range(out.size):
        out[i] = _perturbed(values[i], deviations[i], floor)


@njit(cache=True, nogil=True, error_model="numpy")
def _perturbed_bits_span(values, bits, floor, out, first, last):
    for k in range(out.shape[0]):
        _perturbed_bits_row(values[first:last], bits[k, first:last], floor, out[k, first:last])


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _perturbed_bits_row(values, bits, floor, out):
    for i in range(out.size):
        out[i] = _perturbed(values[i], bf16_to_f32(bits[i]), floor)


def perturbed_float32(values: np.ndarray, deviations: np.ndarray, floor: float, out: np.ndarray) -> None:
    """out[k, i] = float32(values[i]) + deviations[k, i], magnitudes below `floor` (of the deviation, and of the
    sum) 0: the operands of a float32 product of samples, where the deviations of exact zeros (a causal mask's
    probabilities) are often float32 subnormals, which add and multiply ~100x slower (compared first: a compare
    takes them at full speed). `deviations`: float32, or bfloat16 bits (uint16: the stored samples read as they
    are, no float32 copy of them first). Over the cores (over_cores)."""
    kernel = _perturbed_bits_span if deviations.dtype == np.uint16 else _perturbed_span
    over_cores(values.size, 1, lambda first, last: kernel(values, deviations, floor, out, first, last), span=SPAN // 4)


def finish_samples(moved, x, own, key, sigmas, bound, block, out):
    """A float32 product of samples (`moved`: (samples, n), (a + da)(b + db)) made the dot's samples as kept, in one
    pass over the cores (the separate passes' bits): less float32(x) (as numpy subtracts x rounded to float32),
    plus each sample's own-error draw (bound_rules.add_noise's: draw[k, i] x float32(own[i] / sigmas) under `key`;
    `own` empty: none), their squares' block statistics against `bound` (bound_rules.block_ratios': what the
    calibration reads), and the result rounded to bfloat16 bits into `out` (uint16, ml_dtypes' rounding). Returns
    the statistics as block_ratios does."""
    stats = _block_statistics(bound.size, block)
    spans = over_cores(
        bound.size, block, lambda first, last: _finish_span(moved, x, own, key, sigmas, bound, block, out, first, last,
                                                             *stats)
    )  # fmt: skip
    return *stats, stats[2].sum(), any(spans)


@njit(cache=True, nogil=True, error_model="numpy")
def _finish_span(moved, x, own, key, sigmas, bound, block, out, first, last, largest, total, counted):
    """finish_samples on elements `first` (a multiple of `block`) to `last`, a chunk of calibration blocks at a
    time (its draws, squares and ratios in cache). Returns whether an element is unjudged (block_ratios')."""
    samples, noisy = moved.shape[0], own.size > 0
    per_sigma = 1.0 / sigmas  # (a multiply: exact, sigmas is a power of two)
    chunk = block * _CHUNK_BLOCKS
    drawn = np.empty((samples + samples % 2, chunk), np.float32)  # (fill_draws' whole pairs)
    squares, ratios, judged = np.empty(chunk), np.empty(chunk), np.empty(chunk, np.bool_)
    unjudged = False
    for lo in range(first, last, chunk):  # (over views from 0: loops that vectorize)
        hi = min(last, lo + chunk)
        if noisy:
            fill_draws(key, lo, hi - lo, _NO_KEYS, drawn)
        squares[:] = 0
        values = x[lo:hi]
        for k in range(samples):
            row, kept, draws = moved[k, lo:hi], out[k, lo:hi], drawn[k, : hi - lo]
            if noisy:
                part = own[lo:hi]
                for t in range(hi - lo):
                    v = row[t] - np.float32(values[t])
                    v += draws[t] * np.float32(part[t] * per_sigma)
                    _add_square(squares, t, v)
                    kept[t] = f32_to_bf16(v)
            else:
                for t in range(hi - lo):
                    v = row[t] - np.float32(values[t])
                    _add_square(squares, t, v)
                    kept[t] = f32_to_bf16(v)
        unjudged |= _tally_blocks(squares, bound[lo:hi], lo, block, largest, total, counted, ratios, judged)
    return unjudged


def unscaling(product: np.ndarray, factor: float, shift: int) -> tuple[np.ndarray, float]:
    """(p, scale) with float64(p[i]) x scale what add_unscaled makes of product[i] x factor x 2^shift, bit for
    bit: the product and its scale where that is a float64 normal (|shift| < MAX_SHIFT), else the product
    unscaled into float64 by add_unscaled and 1 (rare: terms beyond float64's range once scaled)."""
    if abs(shift) < MAX_SHIFT:
        return product, factor * math.ldexp(1.0, shift)
    unscaled = np.empty(product.size)
    add_unscaled(product, factor, shift, unscaled, False)
    return unscaled, 1.0


def dot_variance(total, from_b, from_a, squares, scales, x, sums_a, least_b, sums_b, least_a, inverse, accumulation,
                 operand_u, operand_spread, noise, noise_floor, arithmetic, rounding=None, absolute=None):  # fmt: skip
    """A dot's bound before its final rounding, squared, per element (tools/bound_dots.py says the rule) of its
    output (B, M, N) (batch, lhs free, rhs free; flat), written into `total`: (sqrt(errors) + shared)^2 +
    arithmetic, errors = the products from_b (sum_k a^2 e_b^2) + from_a (sum_k e_a^2 b^2) read as add_unscaled
    makes them (each float64(product) times its entry of `scales`, `unscaling`'s: from_b's, from_a's, squares';
    empty: that operand has no errors), no float64 copy of them first; shared = |sums_a[b, m]|
    least_b[b, n] + |sums_b[b, n]| least_a[b, m] (no columns: that operand has no errors); arithmetic (into
    `arithmetic`) = (operand_u (|x| + operand_spread sqrt(squares)))^2 (operands rounded to the algorithm's bits; 0:
    none) + accumulation (squares + x^2). Where `squares` is empty it is bounded by errors x `inverse` (1 / r^2, r
    an operand's least relative error: tools/bound_dots.py; 0: that operand's terms are all 0, and so is the sum of
    squares). Returns whether noise (squares + x^2) + noise_floor <= errors on every element
    (bound_dots.float32_noise). Spans of whole rows over the cores (over_cores), a row at a time
    (_dot_variance_row: a loop that vectorizes).

    `rounding`: (bound, own, rule) -- the dot's final rounding in the same pass (a row's total and arithmetic
    kept in cache, `total` and `arithmetic` not read: empty): `bound` (float32 or float64) its bound after it,
    ErrorBounds._round's (kernels/bound_rules.round_bounds at |x| + sqrt(total), `rule` its scalars; None: no
    rounding, sqrt(total)), `own` its own error sqrt(rounding's^2 + arithmetic), SIGMAS sigmas: the same bits
    as those passes one after another. A dot's rule (tools/bound_elementwise.rounding_rule): rounded once (no
    exact-value rule), no reduce-precision floor, no wider type's ulps, so the rounding loop has no branch."""
    if rounding is not None and rounding[2] is not None and any(rounding[2][5:8]):
        raise ValueError(f"not a dot's rounding rule: {rounding[2]}")
    columns = sums_b.shape[1]
    products = (from_b, from_a, squares, scales)
    args = (x, sums_a, least_b, sums_b, least_a, inverse, accumulation, operand_u, operand_spread)
    absolute = np.empty(0) if absolute is None else absolute
    bound, own, rule = rounding if rounding is not None else (np.empty(0), np.empty(0), None)
    rounds = (rounding is not None, rule is not None, *(rule or _NO_RULE))
    width = max(columns, 1)
    fails = over_cores(
        x.size,
        width,
        lambda first, last: _dot_variance_rows(
            total,
            *products,
            *args,
            noise,
            noise_floor,
            arithmetic,
            absolute,
            bound,
            own,
            *rounds,
            first // width,
            last // width,
        ),
        span=SPAN,
    )
    return sum(fails) == 0


_NO_RULE = (0, 0.0, 0.0, 0, 0.0, 0.0, 0.0, False, 0.0, False, 0.0)  # (round_bounds' scalars: not read)


@njit(cache=True, nogil=True, error_model="numpy")
def _dot_variance_rows(total, from_b, from_a, squares, scales, x, sums_a, least_b, sums_b, least_a, inverse,
                       accumulation, operand_u, operand_spread, noise, noise_floor, arithmetic, absolute, bound, own, fused,
                       rounds, nmant, tiny, half_ulps, wide_nmant, wide_tiny, wide_ulps, precision_scale, exact_rule,
                       largest, has_inf, largest_error, first, last):  # fmt: skip
    """dot_variance on rows first..last-1 of the output's B x M rows (`fused`: its rounding too, `rounds`: with a
    rule); returns how many elements fail its test."""
    rule = (nmant, tiny, half_ulps, wide_nmant, wide_tiny, wide_ulps, precision_scale, exact_rule, largest, has_inf,
            largest_error)  # fmt: skip
    with_b, with_a = least_b.shape[1] > 0, least_a.shape[1] > 0
    rows, columns = sums_a.shape[1], sums_b.shape[1]
    none = np.zeros(columns)  # (an operand without errors: no shared part from it)
    row_total, row_arithmetic = np.empty(columns if fused else 0), np.empty(columns if fused else 0)
    fails = 0
    for row in range(first, last):
        b, m = row // rows, row % rows
        rhs_least, rhs_sums = least_b[b] if with_b else none, sums_b[b] if with_a else none
        i, j = row * columns, (row + 1) * columns
        fails += _dot_variance_row(
            row_total if fused else total[i:j],
            from_b[i:j] if from_b.size else from_b,
            from_a[i:j] if from_a.size else from_a,
            squares[i:j] if squares.size else squares,
            scales,
            x[i:j],
            abs(sums_a[b, m]) if with_b else 0.0,
            rhs_least,
            rhs_sums,
            least_a[b, m] if with_a else 0.0,
            inverse,
            accumulation,
            operand_u,
            operand_spread,
            noise,
            noise_floor,
            row_arithmetic if fused else arithmetic[i:j],
            absolute[i:j] if absolute.size else absolute,
        )
        if fused:
            _round_row(x[i:j], row_total, row_arithmetic, bound[i:j], own[i:j], rounds, rule)
    return fails


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _round_row(x, total, arithmetic, bound, own, rounds, rule):
    """A row's final rounding (dot_variance's `rounding`): round_bounds' bound and own error (`rounds`: a rule; a
    dot's: arithmetic ulps only), then own = sqrt(own^2 + arithmetic), each as numpy rounds it."""
    for n in range(x.size):
        b = math.sqrt(total[n])
        rounding = _own_rounding(abs(np.float64(x[n])) + b, rule, True) if rounds else 0.0
        bound[n] = _after_rounding(b, rounding, rule[10]) if rounds else b
        own[n] = math.sqrt(rounding * rounding + arithmetic[n])


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _dot_variance_row(total, from_b, from_a, squares, scales, x, lhs_sum, rhs_least, rhs_sums, lhs_least, inverse,
                      accumulation, operand_u, operand_spread, noise, noise_floor, arithmetic, absolute):  # fmt: skip
    """dot_variance on one row of the output; returns how many elements fail its noise test."""
    estimated, subnormal = squares.size == 0, absolute.size > 0
    with_b, with_a = from_b.size > 0, from_a.size > 0
    cb, ca, cs = scales[0], scales[1], scales[2]
    fails = 0
    for n in range(total.size):
        # (the errors as add_unscaled adds them: from_b's, then from_a's added; 0 where neither operand has errors)
        e = np.float64(from_b[n]) * cb if with_b else 0.0
        if with_a:
            v = np.float64(from_a[n]) * ca
            e = e + v if with_b else v
        v = np.float64(x[n])
        if estimated:
            s = e * inverse if inverse > 0 else 0.0
        else:
            s = np.float64(squares[n]) * cs
        spread = s + v * v
        own = accumulation * spread
        if operand_u > 0:
            rounded = operand_u * (abs(v) + operand_spread * math.sqrt(s))
            own += rounded * rounded
        if subnormal:
            own += absolute[n] * absolute[n]
        moved = math.sqrt(e) + (lhs_sum * rhs_least[n] + abs(rhs_sums[n]) * lhs_least)
        total[n] = moved * moved + own
        arithmetic[n] = own
        fails += not (noise * spread + noise_floor <= e)
    return fails


@njit(cache=True, nogil=True, error_model="numpy")
def _least_quotient_bits(error, value):
    """(the least quotient error[i] / |value[i]|'s bits, how many errors or values are not finite) (non-negative
    floats order as their bits do: integer compares, a loop that vectorizes)."""
    bits = 0x7FF0000000000000
    infinite = 0
    for i in range(value.size):
        e, v = np.float64(error[i]), abs(np.float64(value[i]))
        infinite += not ((e < math.inf) & (v < math.inf))
        bits = min(bits, bitcast_f64_to_i64(e / v if v > 0 else math.inf))
    return bits, infinite


def least_relative(error: np.ndarray, value: np.ndarray) -> float:
    """A lower bound of the least relative error error[i] / |value[i]| over the elements with value[i] != 0: inf
    where there are none, 0 where an error or value is not finite or a quotient is below float64's normals (each
    quotient rounded to nearest, then the least lowered by 2^-50 of it; at most float64's largest finite value).
    Over the cores (over_cores)."""
    spans = over_cores(
        value.size, 1, lambda first, last: _least_quotient_bits(error[first:last], value[first:last]), span=SPAN
    )
    return _least(spans)


def _least(spans: list) -> float:
    """least_relative's result from its spans' (..., least quotient's bits, non-finite count) (their last two)."""
    least = float(np.int64(min(span[-2] for span in spans)).view(np.float64))
    if any(span[-1] for span in spans) or least < 2.2250738585072014e-308:
        return 0.0
    return min(least, 1.7976931348623157e308) * (1 - 2.0**-50) if least < math.inf else math.inf


@njit(cache=True, nogil=True, error_model="numpy")
def _window_products(terms, errors, present, propagated, later, whole, reach):
    n, w = terms.shape
    before = np.empty(w)
    for i in range(n):
        running = 1.0
        for k in range(w):
            before[k] = running
            running *= terms[i, k]
        after, spread, steps, most = 1.0, 0.0, 0.0, 1.0
        for k in range(w - 1, -1, -1):
            spread += errors[i, k] * before[k] * after
            steps += present[i, k] * after
            v = terms[i, k] + errors[i, k]
            most *= v if not v <= 1.0 else 1.0  # (NaN kept)
            after *= terms[i, k]
        propagated[i], later[i], whole[i], reach[i] = spread, steps, running, most


def window_products(terms, errors, present) -> tuple:
    """Per row of `terms` (products' terms' magnitudes, in the order they are multiplied; float64 (rows, n)), with
    their bounds `errors` and `present` (1 where a step multiplies a term): (sum_k e_k prod_{j != k} t_j, the first
    order error; sum_k present_k prod_{j > k} t_j, what the later factors make of step k's error; prod_k t_k;
    prod_k max(t_k + e_k, 1), the most a partial product's interval reaches) in one pass, no temporaries."""
    rows = len(terms)
    out = tuple(np.empty(rows) for _ in range(4))
    _window_products(terms, errors, np.broadcast_to(present, terms.shape), *out)
    return out
