"""The per-element error bounds' hot rules (tools/bounds.py, tools/bound_samples.py) as one pass per element: each
kernel reads its arrays once and writes its results, with no temporaries (the numpy forms they replace made ~30
array passes per element of each rule). The formulas are the bound rules' (their docstrings say why); here only
how they are computed. Arrays come in 1-D (callers ravel them); scalars describe the types."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .half import (
    F32_TINY,
    bf16_to_f32,
    bitcast_f64_to_i64,
    bitcast_i64_to_f64,
    f32_to_bf16,
    f64_to_f32,
    sample_value,
)
from .normal_draws import fill_draws, fill_rounding_draws
from .threads import ranges, run_blocks


_TWO_TO_MINUS_64, _TWO_TO_64 = 2.0**-64, 2.0**64
_CHUNK_BLOCKS = 16  # calibration blocks per chunk of the passes that read samples (their temporaries: a chunk's)
SPLIT_FROM = 1 << 16  # elements of a pass from which it is split over the cores (`over_cores`; bench/README.md)
SPAN = 1 << 15  # elements per span of a split pass at least
_NO_KEYS = np.empty(0, np.int64)  # (add_noise's draws: no groups)


@njit(inline="always")
def _ulp(magnitude, nmant, tiny):
    """tools/compare.ulp_at for one element: the ulp of a type of `nmant` stored significand bits at |magnitude|,
    floored at the ulp of its smallest normal `tiny`; a non-finite magnitude's is 1's."""
    m = abs(magnitude)
    m = m if math.isfinite(m) else 1.0
    m = m if m >= tiny else tiny
    field = (bitcast_f64_to_i64(m) >> 52) - nmant
    # (no branch, no call: the loops vectorize) below f64's normals a subnormal power of two, made from a normal
    # one 2^64 larger, exactly (field >= -63: m is normal; 2^-1075 and below round to 0, as ldexp's)
    subnormal = bitcast_i64_to_f64(max(field + 64, 1) << 52) * _TWO_TO_MINUS_64
    return bitcast_i64_to_f64(field << 52) if field >= 1 else subnormal


@njit(inline="always")
def _inverse_power(power):
    """1 / `power`, a normal power of two, from its exponent bits (exact)."""
    return bitcast_i64_to_f64((2046 - (bitcast_f64_to_i64(power) >> 52)) << 52)


@njit(inline="always")
def _nan_min(a, b):
    """np.minimum's meaning: NaN if either is."""
    if a != a or b != b:
        return math.nan
    return a if a < b else b


@njit(inline="always")
def _own_rounding(magnitude, rule, ulps_only=False):
    """An element's own rounding error bound at `magnitude` before the exact-value rule (`_rounded`); `ulps_only`
    (a constant): the rule has no reduce-precision floor and no wider type's ulps (an arithmetic op's)."""
    nmant, tiny, half_ulps, wide_nmant, wide_tiny, wide_ulps, precision_scale = rule[:7]
    own = half_ulps * _ulp(magnitude, nmant, tiny)
    if not ulps_only and precision_scale > 0:
        own = max(own, precision_scale * magnitude) if magnitude == magnitude else math.nan
    if not ulps_only and wide_ulps > 0:
        own += wide_ulps * _ulp(magnitude, wide_nmant, wide_tiny)
    return own


@njit(inline="always")
def _a_value_of_the_type(v, rule):
    """Whether `v` is a value of the rule's type (nothing rounds it): a multiple of its ulp at |v| of at most its
    largest, or an infinity where the type has them."""
    nmant, tiny, largest, has_inf = rule[0], rule[1], rule[8], rule[9]
    if math.isinf(v):
        return has_inf
    # v / its ulp, as v times the ulp's inverse (both powers of two, the inverse a normal f64 where the ulp is:
    # the same real number rounded, no division), a whole number where v is on the type's grid (every f64 is on
    # f64's: its ulp may be subnormal, 0 steps then)
    steps = 0.0 if nmant >= 52 else v * _inverse_power(_ulp(v, nmant, tiny))
    return abs(v) <= largest and steps == math.floor(steps)


@njit(inline="always")
def _after_rounding(b, own, cap):
    """The bound after a rounding of bound `own` of a value of bound `b`: min(sqrt(b^2 + own^2), b + own x cap)."""
    return _nan_min(math.sqrt(b * b + own * own), b + own * cap)


@njit(inline="always")
def _rounded(v, b, magnitude, rule):
    """One element's own rounding and its bound after it (round_bounds' rule; `rule` its scalars, in its
    argument order from `nmant` on): v the value, b the bound before the rounding, `magnitude` where the ulp is
    taken. Returns (own, bound)."""
    own = _own_rounding(magnitude, rule)
    if rule[7] and b == 0 and _a_value_of_the_type(v, rule):  # (exact_rule: exact operands, x of the type)
        own = 0.0
    return own, _after_rounding(b, own, rule[10])


@njit(inline="always")
def _round_chunk(x, before, bound, scales, per_sigma, rule, ulps_only):
    """`_rounded` of a chunk's elements (values `x`, bounds before the rounding `before`, each at |x| + before)
    into `bound`, and own x `per_sigma` into `scales` (float32: a draw of variance 1 times it is the samples' own
    error). Two loops: one with no branch on the data for every element (it vectorizes), then the exact-value rule
    on the elements with a bound 0 only (few: the rule's test in the first loop made it ~30% slower). `ulps_only`
    (a constant): the rule is an arithmetic op's (`_own_rounding`; the loop ~25% faster without the tests).
    Returns whether any own error is nonzero."""
    exact_rule, cap, any_own = rule[7], rule[10], False
    for t in range(bound.size):
        v, b = np.float64(x[t]), before[t]
        own = _own_rounding(abs(v) + b, rule, ulps_only)
        bound[t] = _after_rounding(b, own, cap)
        scales[t] = np.float32(own * per_sigma)
        any_own |= own != 0 and not (exact_rule and b == 0)
    if exact_rule:
        for t in range(bound.size):
            if before[t] == 0:
                v = np.float64(x[t])
                if _a_value_of_the_type(v, rule):
                    bound[t], scales[t] = _after_rounding(0.0, 0.0, cap), 0
                else:
                    any_own |= _own_rounding(abs(v), rule, ulps_only) != 0
    return any_own


@njit(cache=True, nogil=True, error_model="numpy")
def largest_reach(x, e):
    """max |x_i| + e_i over the elements whose e_i is finite (e empty: max |x_i|; one pass: tools/bound_overflow.py,
    a value's interval reaching a magnitude that rounds to an infinity, the usual answer far below)."""
    reach = 0.0
    if e.size:
        for i in range(x.size):
            t = abs(np.float64(x[i])) + (np.float64(e[i]) if np.float64(e[i]) < math.inf else 0.0)
            reach = max(reach, t)
    else:
        for i in range(x.size):
            reach = max(reach, abs(np.float64(x[i])))
    return reach


@njit(cache=True, nogil=True, error_model="numpy")
def holds_zero(d, e):
    """Whether some interval d_i +- e_i (0 < e_i < inf: an element with no bound says nothing) holds 0
    (tools/bound_overflow.py: a divisor that may be 0)."""
    for i in range(d.size):
        if abs(np.float64(d[i])) <= np.float64(e[i]) and 0 < np.float64(e[i]) < math.inf:
            return True
    return False


def round_bounds(x, variance, at, own_out, bound_out, *rule, threads=None):
    """`_round_span` over the elements, spans of them on the cores (`over_cores`)."""
    whole = at.size == 0

    def span(first, last):
        part = slice(first, last)
        _round_span(x[part], variance[part], at if whole else at[part], own_out[part], bound_out[part], *rule)

    over_cores(x.size, 1, span, threads)


@njit(cache=True, nogil=True, error_model="numpy")
def _round_span(x, variance, at, own_out, bound_out, nmant, tiny, half_ulps, wide_nmant, wide_tiny, wide_ulps,
                precision_scale, exact_rule, largest, has_inf, largest_error):  # fmt: skip
    """A value's own rounding and its bound after it, per element (tools/bounds.py `_round`):
    b = sqrt(variance), the bound before the rounding; its magnitude |x| + a (a: `at`'s element, b where `at` has
    no elements); own = half_ulps x the ulp (`nmant`, `tiny`) there, at least precision_scale x the magnitude
    (reduce-precision; 0: none), plus wide_ulps x an ulp of the wider type (transcendentals; 0: none); 0 where
    `exact_rule` and b == 0 and x is a value of the type (a multiple of its ulp at |x|, at most `largest`, or an
    infinity where the type `has_inf`). bound = min(sqrt(b^2 + own^2), b + own x largest_error)."""
    rule = (nmant, tiny, half_ulps, wide_nmant, wide_tiny, wide_ulps, precision_scale, exact_rule, largest, has_inf,
            largest_error)  # fmt: skip
    own_at = at.size > 0
    for i in range(x.size):
        v = np.float64(x[i])
        b = math.sqrt(variance[i])
        own_out[i], bound_out[i] = _rounded(v, b, abs(v) + (at[i] if own_at else b), rule)


@njit(inline="always")
def _nan_max(a, b):
    """np.maximum's meaning: NaN if either is."""
    if a != a or b != b:
        return math.nan
    return a if a > b else b


@njit(inline="always")
def _first_order_at(multiply, same, va, vb, ea, eb, with_a, with_b):
    """first_order_variance of one element: values `va`, `vb`, bounds `ea`, `eb` (f64; used where `with_a`,
    `with_b`)."""
    v = 0.0
    if with_a:
        if not multiply:
            d = (2.0 if same else 1.0) * ea
        elif same:
            d = (2 * abs(va) + ea) * ea
        else:
            d = abs(vb) * ea
        v += d * d
    if with_b:
        d = abs(va) * eb if multiply else eb
        v += d * d
    if multiply and with_a and with_b:
        both = ea * eb
        v += both * both
    return v


@njit(cache=True, nogil=True, error_model="numpy")
def first_order_variance(multiply, same, a, b, ea, eb, out):
    """A 1-Lipschitz elementwise op's or a multiply's bound before its rounding, squared (tools/bounds.py
    `_elementwise`): per operand with errors (`ea` / `eb`: its bound, no elements where it has none), what it
    moves the value by: its bound times its places (`same`: one value in both, x + x), for a multiply the other's
    magnitude times it ((2 |a| + e_a) e_a for x * x); squares added in operand order, a multiply's e_a e_b last
    (what both do together). `a`, `b`: the operands' values (b is a for a unary op)."""
    with_a, with_b = ea.size > 0, eb.size > 0
    for i in range(out.size):
        out[i] = _first_order_at(
            multiply,
            same,
            np.float64(a[i]),
            np.float64(b[i]),
            np.float64(ea[i]) if with_a else 0.0,
            np.float64(eb[i]) if with_b else 0.0,
            with_a,
            with_b,
        )


@njit(inline="always")
def _moved_apart(up, down, x):
    """max(|up - x|, |down - x|), NaN as np.maximum, then NaN -> inf (tools/bounds.py `_moved_by`)."""
    d = _nan_max(abs(up - x), abs(down - x))
    return math.inf if d != d else d


@njit(inline="always")
def _divide_variance(same, xi, va, vb, ea, eb, with_a, with_b):
    """A divide's bound before its rounding, squared, and whether its element is rounding-decided (tools/bounds.py
    `_evaluated` on a / b: the quotient at the ends of each operand's interval, then at the four corners of
    both beyond what each did alone; a divisor's interval holding 0 decides it). Scalars: the value `xi`, the
    operands' values and bounds (used where `with_a`, `with_b`)."""
    v, moved_a, moved_b, decided = 0.0, 0.0, 0.0, False
    if with_a:
        if same:  # (x / x: both places move at once)
            moved_a = _moved_apart((va + ea) / (va + ea), (va - ea) / (va - ea), xi)
            decided = abs(va) <= ea and ea > 0
        else:
            moved_a = _moved_apart((va + ea) / vb, (va - ea) / vb, xi)
        v += moved_a * moved_a
    if with_b:
        moved_b = _moved_apart(va / (vb + eb), va / (vb - eb), xi)
        decided = abs(vb) <= eb and eb > 0
        v += moved_b * moved_b
    if with_a and with_b:
        worst = 0.0
        for sa in (1.0, -1.0):
            for sb in (1.0, -1.0):
                worst = _nan_max(worst, abs((va + sa * ea) / (vb + sb * eb) - xi))
        excess = worst - moved_a - moved_b
        excess = math.inf if excess != excess else max(excess, 0.0)
        v += excess * excess
    return v, decided


@njit(inline="always")
def _lane_sum(r):
    """The sum of `r` (float64) as eight sums of every eighth element, added pairwise at the end: eight chains of
    adds at once where one sum in element order waits for each add (its ~4 cycles an element were a quarter of
    the block statistics' time); as accurate or more."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    whole = r.size - r.size % 8
    for t in range(0, whole, 8):
        s0, s1, s2, s3 = s0 + r[t], s1 + r[t + 1], s2 + r[t + 2], s3 + r[t + 3]
        s4, s5, s6, s7 = s4 + r[t + 4], s5 + r[t + 5], s6 + r[t + 6], s7 + r[t + 7]
    for t in range(whole, r.size):
        s0 += r[t]
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@njit(inline="always")
def _add_square(squares, t, d):
    """Element t's sample deviation `d` (float32) squared into its tally `squares` (float64): exact, and no
    deviation a float32 can hold underflows (float32 squares of those below ~1e-19 were 0 or subnormal: a softmax's
    1e-32 probabilities, bounds ~1e-34, showed ratio 0 and were cut by their block's larger elements' factor) or
    overflows (those past ~1.8e19 made their op unjudged); the sum of four of them rounded as float64."""
    squares[t] += np.float64(d) * np.float64(d)


@njit(inline="always")
def _tally_blocks(squares, bound, lo, block, largest, total, counted, ratios, judged):
    """The statistics of the blocks of a chunk starting at element `lo` (a multiple of `block`) (block_ratios: per
    block its largest ratio, their total, how many): `squares`, its samples' sums of squares (`_add_square`), `bound` its bounds
    (views from the chunk's start); `ratios` (f64) and `judged` (bool), a chunk's temporaries. Returns whether an
    element is unjudged (non-finite samples under a finite bound). Each element's ratio first, in a loop without
    a branch (it vectorizes); per block then their sum (`_lane_sum`), the largest as the largest bit pattern (of ratios >= 0: the order of their values) or NaN where one
    is (0 / 0 where e^2 underflows), and the count."""
    n, unjudged = bound.size, False
    for t in range(n):
        q, e = squares[t], bound[t]
        ok = math.isfinite(q) and e > 0 and e < math.inf
        ratios[t] = q / (np.float64(e) * np.float64(e)) if ok else 0.0
        judged[t] = ok
        unjudged |= not math.isfinite(q) and e < math.inf
    for j in range(lo // block, (lo + n + block - 1) // block):
        ratio, seen = (
            ratios[j * block - lo : min(n, (j + 1) * block - lo)],
            judged[j * block - lo : (j + 1) * block - lo],
        )
        summed = _lane_sum(ratio)
        top, nan, count = 0, False, 0
        for t in range(ratio.size):
            r = ratio[t]
            nan |= r != r
            top = max(top, bitcast_f64_to_i64(r) if r == r else 0)
            count += seen[t]
        largest[j], total[j], counted[j] = math.nan if nan else bitcast_i64_to_f64(top), summed, count
    return unjudged


def block_ratios(deviations, bound, block, threads=None):
    """`_block_ratios_span` over all blocks, spans of them on the cores (`over_cores`). Returns (largest, total,
    counted, seen, unjudged)."""
    stats = _block_statistics(bound.size, block)
    spans = over_cores(bound.size, block, lambda first, last: _block_ratios_span(deviations, bound, block, first,
                                                                                   last, *stats), threads)  # fmt: skip
    return *stats, stats[2].sum(), any(spans)


@njit(cache=True, nogil=True, error_model="numpy")
def _block_ratios_span(deviations, bound, block, first, last, largest, total, counted):
    """Per block of `block` consecutive elements (the last one shorter), what calibration reads
    (tools/bound_samples.calibrate): the largest and the sum of r = (sum over the samples of a deviation's square,
    in float64: `_add_square`) / bound^2 over the elements with a finite positive bound and finite samples
    ("seen"), and how many were seen, into `largest`, `total`, `counted` at their blocks' places. `deviations`:
    (samples, n). Elements `first` (a multiple of `block`) to `last` only. Returns whether a finite bound has
    non-finite samples (unjudged: then the bound is kept as it is)."""
    chunk = block * _CHUNK_BLOCKS
    squares, ratios, judged = np.empty(chunk), np.empty(chunk), np.empty(chunk, np.bool_)
    unjudged = False
    for lo in range(first, last, chunk):  # (sample by sample along a chunk, over views from 0: loops that vectorize)
        hi = min(last, lo + chunk)
        squares[:] = 0
        for k in range(deviations.shape[0]):
            row = deviations[k, lo:hi]
            for t in range(hi - lo):
                _add_square(squares, t, row[t])
        unjudged |= _tally_blocks(squares, bound[lo:hi], lo, block, largest, total, counted, ratios, judged)
    return unjudged


NEAR = 16.0  # participation_ratios counts the elements within this factor of the block's largest ratio (4x in sigma)
LONE = 3.0  # ... and takes as tight alone the elements whose bound is below the block's third smallest / LONE


def participation_ratios(deviations, bound, block, largest, cut, out, lone, threads=None):
    """Per block of `block` consecutive elements where `cut` is True, how many independent draws the samples of its
    tight ones are at least worth, into `out` (the other blocks' left as they are): over the elements whose ratio
    r = (sum over the samples of d_k^2) / bound^2 is at least `largest` (the block's largest r) / NEAR, with a
    finite positive bound and finite samples, the Gram matrix G of their samples' directions (G[k, l] = the sum of
    d_k d_l / sum_k d_k^2; `deviations`: (4, n), SAMPLES = 4, float or bfloat16 bits as kept) and its
    participation ratio P = trace(G)^2 / |G|^2 (1 to 4; 0 where no element counts): at most G's rank, so at most
    the number of independent draws the directions are made of; 1 where they all carry one (a broadcast value's
    draws times a factor) or one is tight alone; m directions drawn independently give E|G|^2 = m + m (m - 1) / 4
    (P ~ 4 m / (m + 3): 3.95 for 256). And the block's lone elements, into `lone` = (members (blocks, 2) int64,
    their largest r, their P) (-1, 0, 0 where none): the elements (finite positive bound, samples finite, not all 0)
    whose bound is below the third smallest such bound / LONE (the block's tightest by their rule, one or two).
    Spans of blocks on the cores (over_cores)."""
    members, ratio, draws = lone
    over_cores(bound.size, block, lambda first, last: _participation_span(deviations, bound, block, largest, cut, out,
                                                                           members, ratio, draws, first, last),
               threads)  # fmt: skip


@njit(inline="always")
def _sums_of_squares(d0, d1, d2, d3, t):
    """An element's four samples (as kept: sample_value) in float64 and their sum of squares."""
    a, b = np.float64(sample_value(d0[t])), np.float64(sample_value(d1[t]))
    c, d = np.float64(sample_value(d2[t])), np.float64(sample_value(d3[t]))
    return a, b, c, d, a * a + b * b + c * c + d * d


@njit(inline="always")
def _lone_members(d0, d1, d2, d3, judged, lo, members, ratio, draws, j):
    """participation_ratios' lone elements of the block from `lo` (block `j`; `judged`: its elements' bounds where
    judged, else infinite): the three smallest (branch-free insertion), then the elements below the last of them /
    LONE, their largest ratio and their directions' participation ratio (P = 1 for one)."""
    s1 = s2 = s3 = math.inf
    for t in range(judged.size):
        m = judged[t]
        s1, m = min(s1, m), max(s1, m)
        s2, m = min(s2, m), max(s2, m)
        s3 = min(s3, m)
    found, top = 0, 0.0
    g00 = g11 = g22 = g33 = g01 = g02 = g03 = g12 = g13 = g23 = 0.0
    for i in range(judged.size):
        e = judged[i]
        if not e * LONE < s3:  # (at most two below the third smallest; all of at most two judged)
            continue
        t = lo + i
        a, b, c, d, q = _sums_of_squares(d0, d1, d2, d3, t)
        members[j, found] = t
        found += 1
        top = max(top, q / (e * e))
        g00, g11, g22, g33 = g00 + a * a / q, g11 + b * b / q, g22 + c * c / q, g33 + d * d / q
        g01, g02, g03 = g01 + a * b / q, g02 + a * c / q, g03 + a * d / q
        g12, g13, g23 = g12 + b * c / q, g13 + b * d / q, g23 + c * d / q
    trace = g00 + g11 + g22 + g33
    squares = g00 * g00 + g11 * g11 + g22 * g22 + g33 * g33
    squares += 2 * (g01 * g01 + g02 * g02 + g03 * g03 + g12 * g12 + g13 * g13 + g23 * g23)
    ratio[j], draws[j] = top, trace * trace / squares if squares > 0 else 0.0


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
def _participation_span(deviations, bound, block, largest, cut, out, members, ratio, draws, first, last):
    """participation_ratios from element `first` (a multiple of `block`) to `last`. Ten sums in registers, no
    branch in the loop, reassociated (a statistic: the loop vectorizes)."""
    n = bound.size
    d0, d1, d2, d3 = deviations[0], deviations[1], deviations[2], deviations[3]
    judged = np.empty(block)  # (the block's bounds where judged, else infinite: its lone elements')
    for j in range(first // block, (last + block - 1) // block):
        if not cut[j]:
            continue
        floor = largest[j] / NEAR
        g00 = g11 = g22 = g33 = g01 = g02 = g03 = g12 = g13 = g23 = 0.0
        lo = j * block
        for t in range(lo, min(n, lo + block)):
            e = np.float64(bound[t])
            a, b, c, d, q = _sums_of_squares(d0, d1, d2, d3, t)
            seen = (e > 0) & (e < math.inf) & (q > 0) & (q < math.inf)
            judged[t - lo] = e if seen else math.inf
            keep = seen & (q >= floor * (e * e))
            w = 1.0 / q if keep else 0.0  # (selects: a non-finite sample is not multiplied by 0)
            a, b, c, d = a if keep else 0.0, b if keep else 0.0, c if keep else 0.0, d if keep else 0.0
            g00, g11, g22, g33 = g00 + a * a * w, g11 + b * b * w, g22 + c * c * w, g33 + d * d * w
            g01, g02, g03 = g01 + a * b * w, g02 + a * c * w, g03 + a * d * w
            g12, g13, g23 = g12 + b * c * w, g13 + b * d * w, g23 + c * d * w
        trace = g00 + g11 + g22 + g33
        squares = g00 * g00 + g11 * g11 + g22 * g22 + g33 * g33
        squares += 2 * (g01 * g01 + g02 * g02 + g03 * g03 + g12 * g12 + g13 * g13 + g23 * g23)
        out[j] = trace * trace / squares if squares > 0 else 0.0
        _lone_members(d0, d1, d2, d3, judged[: min(n, lo + block) - lo], lo, members, ratio, draws, j)


def scale_blocks(bound, factor, block, out, threads=None):
    """out = bound x its block's factor (blocks of `block` consecutive elements), spans of blocks on the cores."""
    over_cores(bound.size, block, lambda first, last: _scale_span(bound, factor, block, out, first, last), threads)


@njit(cache=True, nogil=True, error_model="numpy")
def _scale_span(bound, factor, block, out, first, last):
    """scale_blocks from element `first` (a multiple of `block`) to `last`. A float32 `out` (its bound and factor
    float32) is the float64 product (exact: 24 x 24 bits) rounded once, float32's own product bit for bit, and
    where a block has a product below float32's normals (the bounds of a softmax's tiny probabilities) rounded by
    f64_to_f32: a float32 multiply with a subnormal result took ~25x a normal one (1M such on the GPT step)."""
    narrow = out.itemsize == 4
    for j in range(first // block, (last + block - 1) // block):
        scale = factor[j]
        source, target = bound[j * block : (j + 1) * block], out[j * block : (j + 1) * block]
        low = False
        for t in range(source.size if narrow else 0):
            product = np.float64(source[t]) * np.float64(scale)
            low |= (abs(product) < F32_TINY) & (product != 0)
        if low:
            for t in range(source.size):
                target[t] = f64_to_f32(np.float64(source[t]) * np.float64(scale))
        else:
            for t in range(source.size):  # (over views from 0: a loop that vectorizes)
                target[t] = np.float64(source[t]) * np.float64(scale) if narrow else source[t] * scale


# the ops elementwise_pass computes (tools/bound_elementwise.py)
ADD, SUBTRACT, NEGATE, CONVERT, MULTIPLY, DIVIDE = range(6)


@njit(inline="always")
def _stored(d, t, draws, scales, rounds, squares, bits):
    """Sample deviation `d` of element t plus its own error (draws[t] x scales[t] where the op `rounds`) into
    `bits` (its bfloat16 bits: kernels/half.f32_to_bf16), its square added to `squares` (`_add_square`:
    calibration reads them before their rounding to bfloat16). A select, no branch: the loops vectorize."""
    own = draws[t] * scales[t]  # (read whether or not used: a select, not a branch around loads)
    d = d + own if rounds else d
    _add_square(squares, t, d)
    bits[t] = f32_to_bf16(d)


@njit(inline="always")
def _sample_row(kind, x, a, b, da, db, with_a, with_b, draws, scales, rounds, squares, bits):
    """One sample's deviations of an elementwise_pass op from its operands' (computed in float32, as the samples
    are; `da` / `db`: their bfloat16 bits, decoded here (a shift: exact), unused where `with_a` / `with_b` is
    False: that operand has none, its deviations 0): np.add / np.subtract / np.negative / np.positive on them; a
    multiply's da (b + db) + a db, a divide's (da - x db) / (b + db); each `_stored` with its own error in the same
    loop. One loop per case, nothing decided inside it (loops the compiler vectorizes)."""
    zero = np.float32(0)
    if kind == MULTIPLY and with_a and with_b:
        for t in range(bits.size):
            ra, rb = bf16_to_f32(da[t]), bf16_to_f32(db[t])
            _stored(ra * (np.float32(b[t]) + rb) + np.float32(a[t]) * rb, t, draws, scales, rounds, squares, bits)
    elif kind == MULTIPLY and with_a:
        for t in range(bits.size):
            _stored(bf16_to_f32(da[t]) * np.float32(b[t]), t, draws, scales, rounds, squares, bits)
    elif kind == MULTIPLY and with_b:
        for t in range(bits.size):
            _stored(np.float32(a[t]) * bf16_to_f32(db[t]), t, draws, scales, rounds, squares, bits)
    elif kind == DIVIDE and with_a and with_b:
        for t in range(bits.size):
            ra, rb = bf16_to_f32(da[t]), bf16_to_f32(db[t])
            _stored((ra - np.float32(x[t]) * rb) / (np.float32(b[t]) + rb), t, draws, scales, rounds, squares, bits)
    elif kind == DIVIDE and with_a:
        for t in range(bits.size):
            _stored(bf16_to_f32(da[t]) / np.float32(b[t]), t, draws, scales, rounds, squares, bits)
    elif kind == DIVIDE and with_b:
        for t in range(bits.size):
            rb = bf16_to_f32(db[t])
            _stored(-np.float32(x[t]) * rb / (np.float32(b[t]) + rb), t, draws, scales, rounds, squares, bits)
    elif (kind == ADD or kind == SUBTRACT) and with_b:
        sign = np.float32(-1 if kind == SUBTRACT else 1)
        for t in range(bits.size):
            d = (bf16_to_f32(da[t]) if with_a else zero) + sign * bf16_to_f32(db[t])
            _stored(d, t, draws, scales, rounds, squares, bits)
    elif with_a and kind != MULTIPLY and kind != DIVIDE:
        sign = np.float32(-1 if kind == NEGATE else 1)
        for t in range(bits.size):
            _stored(sign * bf16_to_f32(da[t]), t, draws, scales, rounds, squares, bits)
    else:
        none = -zero if kind == NEGATE else zero
        for t in range(bits.size):
            _stored(none, t, draws, scales, rounds, squares, bits)


@njit(inline="always")
def _divide_loop(same, x, a, b, ea, eb, with_a, with_b, before, decided):
    """`_divide_variance` of each element, its root into `before`, into `decided`."""
    for t in range(before.size):
        variance, decided[t] = _divide_variance(
            same, np.float64(x[t]), np.float64(a[t]), np.float64(b[t]),
            np.float64(ea[t]) if with_a else 0.0, np.float64(eb[t]) if with_b else 0.0, with_a, with_b,
        )  # fmt: skip
        before[t] = math.sqrt(variance)


@njit(inline="always")
def _first_order_loop(multiply, same, a, b, ea, eb, with_a, with_b, before):
    """`_first_order_at` of each element, its root into `before`."""
    for t in range(before.size):
        before[t] = math.sqrt(_first_order_at(
            multiply, same, np.float64(a[t]), np.float64(b[t]),
            np.float64(ea[t]) if with_a else 0.0, np.float64(eb[t]) if with_b else 0.0, with_a, with_b,
        ))  # fmt: skip


@njit(cache=True, nogil=True, error_model="numpy")
def _bounds_before(kind, same, x, a, b, ea, eb, before, decided):
    """elementwise_pass' bounds before the rounding (the variances' roots) of a chunk (a divide's
    rounding-decided elements into `decided`; `ea`, `eb`: none where empty): loops with their flags constant (inlined), which the compiler
    vectorizes: a divide's one per case of which operands have errors (with the flags read inside it stayed
    scalar: 2.2x slower), the others' one for a multiply and one for the rest (an add's, a convert's 10-15%
    faster). Each further case compiles its loop again (cold: ~1 s each): only these. A function of its own: the
    span's other loops compile as before."""
    with_a, with_b = ea.size > 0, eb.size > 0
    if kind == DIVIDE:
        if with_a and with_b:
            _divide_loop(same, x, a, b, ea, eb, True, True, before, decided)
        elif with_a:
            _divide_loop(same, x, a, b, ea, eb, True, False, before, decided)
        elif with_b:
            _divide_loop(same, x, a, b, ea, eb, False, True, before, decided)
        else:
            _divide_loop(same, x, a, b, ea, eb, False, False, before, decided)
    elif kind == MULTIPLY:
        _first_order_loop(True, same, a, b, ea, eb, with_a, with_b, before)
    else:
        _first_order_loop(False, same, a, b, ea, eb, with_a, with_b, before)


@njit(cache=True, nogil=True, error_model="numpy")
def _elementwise_span(kind, same, rounds, x, a, b, ea, eb, da, db, rule, draws, bound_out, samples_out, decided_out,
                      block, first, last, largest, total, counted):  # fmt: skip
    """One elementwise op's whole bound in one pass over its elements (tools/bound_elementwise.py): the bound
    before its rounding (first_order_variance's rule; a divide's at its operands' interval ends and corners,
    `_divide_variance`), its own rounding where it `rounds` (round_bounds'; `rule` its scalars; none: a negate),
    the samples' deviations (`da`, `db`: the operands' (samples, n), no columns where an operand has none; into
    `samples_out`, or none when it has no columns) plus each sample's own error: a draw of variance 1 times
    own / SIGMAS (`draws`: (key, keys, sigmas); element i's draws are kernels/normal_draws.fill_rounding_draws'
    (uniform: one rounding's error) under the instruction's `key`, its group keys[i]'s where keys[i] >= 0: one
    error for its group), and calibration's block
    statistics (block_ratios', from the samples and the bound as written, into
    `largest`, `total`, `counted` at their blocks' places). `decided_out`: a divide's rounding-decided elements.
    Elements `first` (a multiple of `block`) to `last` only. Returns (any own error nonzero, unjudged). A chunk of
    blocks at a time, step by step along it: loops over views from 0 (the compiler vectorizes them: no negative
    index to wrap), the chunk's temporaries in cache. The operands' samples are read and the result's written as
    their bfloat16 bits (uint16; tools/bound_store.py's SAMPLE_STORAGE): a sample's deviations are computed in
    float32 (a chunk's, in cache), the block statistics taken from them, and each rounded to bfloat16 as it is
    stored (kernels/half.f32_to_bf16: nearest even, NaN kept NaN), so no float32 copy of either is made."""
    samples = samples_out.shape[0]
    sampled = samples_out.shape[1] > 0
    with_a, with_b = da.shape[1] > 0, db.shape[1] > 0
    key, keys, sigmas = draws
    per_sigma = 1.0 / sigmas  # (own x it is own / sigmas exactly: SIGMAS is a power of two)
    chunk = block * _CHUNK_BLOCKS
    bounds_before, scales, squares = np.empty(chunk), np.empty(chunk, np.float32), np.empty(chunk)
    drawn = np.empty((4 * ((samples + 3) // 4), chunk), np.float32)  # (fill_rounding_draws' rows: whole fours)
    ratios, judged = np.empty(chunk), np.empty(chunk, np.bool_)
    any_own, unjudged = False, False
    for lo in range(first, last, chunk):
        hi = min(last, lo + chunk)
        xv, av, bv, eav, ebv, bound = x[lo:hi], a[lo:hi], b[lo:hi], ea[lo:hi], eb[lo:hi], bound_out[lo:hi]
        before = bounds_before[: hi - lo]
        _bounds_before(kind, same, xv, av, bv, eav, ebv, before, decided_out[lo:hi])
        if rounds:
            any_own |= _round_chunk(xv, before, bound, scales[: hi - lo], per_sigma, rule, True)
        else:
            bound[:] = before
        if not sampled:
            continue
        squares[:] = 0
        if rounds:
            fill_rounding_draws(key, lo, hi - lo, keys[lo:hi] if keys.size > 0 else keys, drawn)
        for k in range(samples):
            _sample_row(kind, xv, av, bv, da[k, lo:hi], db[k, lo:hi], with_a, with_b, drawn[k, : hi - lo], scales,
                        rounds, squares, samples_out[k, lo:hi])  # fmt: skip
        unjudged |= _tally_blocks(squares, bound, lo, block, largest, total, counted, ratios, judged)
    return any_own, unjudged


def elementwise_pass(kind, same, rounds, x, a, b, ea, eb, da, db, rule, draws, bound_out, samples_out, decided_out,
                     block, threads=None):  # fmt: skip
    """`_elementwise_span` over all of `x`'s elements, spans of whole blocks on the cores (`over_cores`). Returns
    (any own error nonzero, largest, total, counted, seen, unjudged): calibration's statistics per block."""
    if rounds and (rule[5] or rule[6]):
        raise ValueError("elementwise_pass rounds by an arithmetic op's rule (no wider type's ulps, no precision)")
    args = (kind, same, rounds, x, a, b, ea, eb, da, db, rule, draws, bound_out, samples_out, decided_out, block)
    stats = _block_statistics(x.size, block)
    spans = over_cores(x.size, block, lambda first, last: _elementwise_span(*args, first, last, *stats), threads)
    return any(s[0] for s in spans), *stats, stats[2].sum(), any(s[1] for s in spans)


@njit(inline="always")
def _exponent(power):
    """np.frexp(power)[1] of a positive power of two, from its exponent bits (a subnormal one's from it made normal
    by an exact 2^64: no call, the loops vectorize)."""
    field = bitcast_f64_to_i64(power) >> 52
    scaled = (bitcast_f64_to_i64(power * _TWO_TO_64) >> 52) - 64
    return (field if field > 0 else scaled) - 1022


def rounding_groups(x, other, source, count, nmant, tiny, other_nmant, other_tiny, groups_out, threads=None):
    """tools/bound_samples.shared_rounding's groups (`_number_groups` over spans of the elements on the cores):
    element i's group is (BINADE_OFFSET + binade) * count + source[i] (binade: the exponent of x's ulp (`nmant`,
    `tiny`)) where the other operand's ulp in its type (`other_nmant`, `other_tiny`) is at least x's (both powers
    of two: the exponents compared), else -1. Returns whether any element has a group."""
    types = (nmant, tiny, other_nmant, other_tiny)
    span = lambda i, j: _number_groups(x, other, source, count, *types, groups_out, i, j)  # noqa: E731
    return any(over_cores(x.size, 1, span, threads))


BINADE_OFFSET = 1100  # an ulp's exponent is at least float64's least subnormal's, -1073: groups from 0


@njit(cache=True, nogil=True, error_model="numpy")
def _number_groups(x, other, source, count, nmant, tiny, other_nmant, other_tiny, groups_out, first, last):
    """rounding_groups on elements `first` to `last`. Returns whether any has a group."""
    coarse_seen = False
    xs, others, sources, groups = x[first:last], other[first:last], source[first:last], groups_out[first:last]
    for i in range(xs.size):  # (over views from 0: a loop that vectorizes)
        binade = _exponent(_ulp(xs[i], nmant, tiny))
        coarse = _exponent(_ulp(others[i], other_nmant, other_tiny)) >= binade
        groups[i] = (BINADE_OFFSET + binade) * count + sources[i] if coarse else -1
        coarse_seen |= coarse
    return coarse_seen


def add_noise(samples, key, own, sigmas, rounding=False, threads=None):
    """Each sample's own error (tools/bounds.py `_sample`): samples[k, i] += draw[k, i] x float32(own[i] / sigmas)
    (float32 as the samples are; the draws kernels/normal_draws' under the instruction's `key`: normal, or where
    the own error is a single `rounding`, uniform as the elementwise pass draws them); spans of elements on the
    cores."""
    span = lambda first, last: _add_noise_span(samples, key, own, sigmas, rounding, first, last)  # noqa: E731
    over_cores(own.size, 1, span, threads)


@njit(cache=True, nogil=True, error_model="numpy")
def _add_noise_span(samples, key, own, sigmas, rounding, first, last):
    """add_noise on elements `first` to `last`, a chunk of draws at a time."""
    per_sigma = 1.0 / sigmas  # (a multiply: exact, SIGMAS is a power of two)
    chunk = 1 << 12  # (its draws in cache)
    count = samples.shape[0]
    rows = 4 * ((count + 3) // 4) if rounding else count + count % 2  # (whole fours, or fill_draws' whole pairs)
    drawn = np.empty((rows, chunk), np.float32)
    for lo in range(first, last, chunk):
        hi = min(last, lo + chunk)
        if rounding:
            fill_rounding_draws(key, lo, hi - lo, _NO_KEYS, drawn)
        else:
            fill_draws(key, lo, hi - lo, _NO_KEYS, drawn)
        part = own[lo:hi]
        for k in range(samples.shape[0]):
            row, draws = samples[k, lo:hi], drawn[k, : hi - lo]
            for i in range(part.size):  # (over views from 0: a loop that vectorizes)
                row[i] += draws[i] * np.float32(part[i] * per_sigma)


def over_cores(n: int, granule: int, run, threads: int | None = None, span: int = 0) -> list:
    """run(first, last) over spans covering elements 0..n-1, their edges multiples of `granule`, on the calling
    thread and the pool's (kernels/threads.py; `threads` as run_blocks') where n reaches SPLIT_FROM; their results
    in span order. The spans follow from n alone, and each element's results and each block's statistics are
    computed by one span as a single pass computes them: the same bits whichever threads run them. `span`:
    elements per span at least (default SPAN; longer where a pass is light and each span's call costs)."""
    if n < SPLIT_FROM:
        return [run(0, n)]
    spans = ranges(n, n // max(span, SPAN), granule)
    results: list = [None] * len(spans)

    def one(i):
        results[i] = run(spans[i].start, spans[i].stop)

    # (no lingering: a pool thread done with its spans sleeps at once rather than spin for a next call, which comes
    # after the next instruction's other work, past the spin: on the GPT step spinning cost 0.2-0.5 s of CPU)
    run_blocks(len(spans), one, threads, linger=False)
    return results


def _block_statistics(n: int, block: int) -> tuple:
    """Zeroed (largest, total, counted) per block of `block` consecutive elements of n."""
    blocks = (n + block - 1) // block
    return np.zeros(blocks), np.zeros(blocks), np.zeros(blocks, np.int64)
