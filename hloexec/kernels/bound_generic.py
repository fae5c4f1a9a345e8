"""The error bounds of the elementwise ops with no first-order form (sqrt, rsqrt, the transcendentals, floor...,
power of one moving operand: tools/bound_generic.py) in one pass per chunk of elements, an add reduce's sums over
its terms in one pass, a select in one pass. The op itself is the shadow's kernel (numpy),
called once per chunk on every argument it needs stacked as rows: the ends of the operand's interval and each
sample's perturbed operand (`unary_arguments`); the rest -- the bound before the rounding, the rounding, the
samples' deviations plus their own-error draws, calibration's block statistics -- is one compiled loop
(`_unary_chunk`), the formulas of ErrorBounds' separate rules (`_moved_by`, `_round`, `_sample`) in their order."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .half import bf16_to_f32, f32_to_bf16, round_bf16, round_f16
from .normal_draws import fill_draws
from .bound_rules import (
    _CHUNK_BLOCKS,
    _block_statistics,
    _moved_apart,
    _nan_max,
    _add_square,
    _round_chunk,
    _tally_blocks,
    over_cores,
)

CHUNK_BLOCKS = 4 * _CHUNK_BLOCKS  # calibration blocks per chunk (one kernel call each: the arguments' rows in cache)


@njit(cache=True, nogil=True, error_model="numpy")
def unary_arguments(a, ea, da, lo, hi, args):
    """The rows the op is evaluated on for elements `lo` to `hi` (into `args[:, :hi - lo]`, float64): where the
    operand has a bound (`ea`, no elements where it has none) a + e and a - e (`_moved_by`'s interval ends), then
    per sample a + d_k (`da`: (samples, n), their bfloat16 bits, decoded here: exact; `_sample`'s perturbed
    operand), or the one row a where it has no samples (no columns). Returns the number of rows written."""
    av, row = a[lo:hi], 0
    if ea.size > 0:
        up, down, ev = args[0], args[1], ea[lo:hi]
        for t in range(av.size):
            e = np.float64(ev[t])
            up[t], down[t] = av[t] + e, av[t] - e
        row = 2
    if da.shape[1] == 0:
        args[row, : av.size] = av
        return row + 1
    for k in range(da.shape[0]):
        out, dv = args[row + k], da[k, lo:hi]
        for t in range(av.size):  # (over views from 0: a loop that vectorizes)
            out[t] = av[t] + np.float64(bf16_to_f32(dv[t]))
    return row + da.shape[0]


@njit(cache=True, nogil=True, error_model="numpy")
def _unary_chunk(flags, x, a, ea, values, rule, draws, bound_out, samples_out, decided_out, block, lo, hi,
                 largest, total, counted):  # fmt: skip
    """Elements `lo` (a multiple of `block`) to `hi` of one op's bound, from `values` (the op on unary_arguments'
    rows): where the operand has a bound (`ea`), b^2 = max(|f(a + e) - x|, |f(a - e) - x|)^2 (NaN: inf), marking
    in `decided_out` where the interval holds 0 (flags' `singular`) or its ends differ (`steps`); the bound after
    the op's own rounding where it `rounds` (round_bounds'; `rule` its scalars), else b; into `samples_out` (none:
    no columns; bfloat16 bits, each rounded as it is stored: kernels/half.f32_to_bf16, no float32 copy) each
    sample's f(a + d_k) - x in float32 plus a standard normal draw times float32(own / SIGMAS)
    (`draws`: (key, sigmas); element i's are kernels/normal_draws' under the instruction's `key`); calibration's block
    statistics (block_ratios') into `largest`, `total`, `counted`. Returns (any own error nonzero, unjudged)."""
    singular, steps, rounds = flags
    key, sigmas = draws
    m, samples = hi - lo, samples_out.shape[0]
    moving, sampled, own_rows = ea.size > 0, samples_out.shape[1] > 0, values.shape[0] - (2 if ea.size > 0 else 0)
    per_sigma = 1.0 / sigmas  # (own x it is own / sigmas exactly: SIGMAS is a power of two)
    scales, squares, before = np.empty(m, np.float32), np.empty(m), np.zeros(m)
    ratios, judged = np.empty(m), np.empty(m, np.bool_)
    xv, av, bound = x[lo:hi], a[lo:hi], bound_out[lo:hi]
    any_own = False
    if moving:  # (each step a loop over views from 0: they vectorize)
        up, down, ev = values[0], values[1], ea[lo:hi]
        for t in range(m):
            moved = _moved_apart(up[t], down[t], xv[t])
            before[t] = math.sqrt(moved * moved)  # (the variance's root, as `_round` takes it)
        if singular:
            decided = decided_out[lo:hi]
            for t in range(m):
                e = np.float64(ev[t])
                decided[t] |= abs(av[t]) <= e and e > 0
        if steps:
            decided = decided_out[lo:hi]
            for t in range(m):
                decided[t] |= up[t] != down[t]
    if rounds:
        any_own = _round_chunk(xv, before, bound, scales, per_sigma, rule, False)
    else:
        for t in range(m):
            bound[t] = before[t]
    if not sampled:
        return any_own, False
    squares[:] = 0
    drawn = np.empty((samples + samples % 2, m), np.float32)  # (fill_draws' rows: whole pairs)
    out = np.empty(m, np.float32)  # (one sample's deviations, before their bfloat16 rounding)
    if rounds:
        fill_draws(key, lo, m, np.empty(0, np.int64), drawn)
    for k in range(samples):
        bits, moved = samples_out[k, lo:hi], values[values.shape[0] - own_rows + min(k, own_rows - 1)]
        for t in range(m):
            out[t] = np.float32(moved[t] - xv[t])
        if rounds:
            own_draws = drawn[k]
            for t in range(m):
                out[t] += own_draws[t] * scales[t]
        for t in range(m):
            _add_square(squares, t, out[t])
            bits[t] = f32_to_bf16(out[t])
    return any_own, _tally_blocks(squares, bound, lo, block, largest, total, counted, ratios, judged)


def unary_pass(evaluate, flags, x, a, ea, da, rule, draws, bound_out, samples_out, decided_out, block, threads=None):
    """One op's bound, rounding-decided marks, samples and calibration statistics (`_unary_chunk`) over all of
    `x`'s elements, its one moving operand `a`: spans of whole blocks on the cores (`over_cores`; numpy's kernels
    release the GIL), each a chunk of CHUNK_BLOCKS blocks at a time, evaluate(rows, lo, hi) (the op on
    unary_arguments' rows for elements lo to hi, its other operands' elements fixed) called once per chunk.
    Returns (any own error nonzero, largest, total, counted, seen, unjudged)."""
    stats = _block_statistics(x.size, block)
    rows = (2 if ea.size > 0 else 0) + max(da.shape[0] if da.shape[1] > 0 else 1, 1)
    chunk = block * CHUNK_BLOCKS

    def span(first, last):
        args, found = np.empty((rows, min(chunk, last - first))), [False, False]
        for lo in range(first, last, chunk):
            hi = min(last, lo + chunk)
            written = unary_arguments(a, ea, da, lo, hi, args)
            values = np.asarray(evaluate(args[:written, : hi - lo], lo, hi), np.float64)
            own, unjudged = _unary_chunk(flags, x, a, ea, values, rule, draws, bound_out, samples_out, decided_out,
                                         block, lo, hi, *stats)  # fmt: skip
            found = [found[0] or own, found[1] or unjudged]
        return found

    spans = over_cores(x.size, block, span, threads)
    return any(s[0] for s in spans), *stats, stats[2].sum(), any(s[1] for s in spans)


@njit(cache=True, nogil=True, error_model="numpy")
def _select_span(p, t, f, x, et, ef, marks, pp, dt, df, bound_out, decided_out, samples_out, block, first, last,
                 largest, total, counted):  # fmt: skip
    """select_pass on elements `first` (a multiple of `block`) to `last`, a chunk of blocks at a time (loops over
    views from 0, the chunk's temporaries in cache)."""
    with_et, with_ef, with_dt, with_df = et.size > 0, ef.size > 0, dt.shape[1] > 0, df.shape[1] > 0
    marks_t, marks_f, undecided = marks
    with_mt, with_mf, with_undecided = marks_t.size > 0, marks_f.size > 0, undecided.size > 0
    chunk = block * _CHUNK_BLOCKS
    squares, ratios, judged = np.empty(chunk), np.empty(chunk), np.empty(chunk, np.bool_)
    moved_t, moved_f = np.empty(chunk), np.empty(chunk)
    unjudged = False
    for lo in range(first, last, chunk):
        hi = min(last, lo + chunk)
        pv, tv, fv, xv, bound, decided = p[lo:hi], t[lo:hi], f[lo:hi], x[lo:hi], bound_out[lo:hi], decided_out[lo:hi]
        for j in range(hi - lo):
            i = lo + j
            a, b = np.float64(et[i]) if with_et else 0.0, np.float64(ef[i]) if with_ef else 0.0
            bound[j] = a if pv[j] else b
            decided[j] = (with_mt and marks_t[i]) if pv[j] else (with_mf and marks_f[i])
            if with_undecided and undecided[i]:
                bound[j] = _nan_max(a, b) + abs(tv[j] - fv[j])
                decided[j] = True
        if samples_out.shape[1] == 0:
            continue
        squares[:] = 0
        for k in range(samples_out.shape[0]):
            bits, chosen = samples_out[k, lo:hi], pp[k, lo:hi] if pp.shape[1] > 0 else pv
            _moved(tv, dt[k, lo:hi], with_dt, moved_t)
            _moved(fv, df[k, lo:hi], with_df, moved_f)
            for j in range(hi - lo):
                deviation = np.float32((moved_t[j] if chosen[j] else moved_f[j]) - xv[j])
                _add_square(squares, j, deviation)
                bits[j] = f32_to_bf16(deviation)
        unjudged |= _tally_blocks(squares, bound, lo, block, largest, total, counted, ratios, judged)
    return unjudged


@njit(inline="always")
def _moved(value, deviations, with_deviations, out):
    """out[:n] = value + deviations (their bfloat16 bits, decoded: exact; float64), or value where there are none."""
    if with_deviations:
        for j in range(value.size):
            out[j] = value[j] + np.float64(bf16_to_f32(deviations[j]))
    else:
        out[: value.size] = value


def select_pass(p, t, f, x, et, ef, marks, pp, dt, df, bound_out, decided_out, samples_out, block, threads=None):
    """A select's bound, rounding-decided marks and samples (tools/bounds.py `_select`, `_sample`) in one pass,
    spans of whole blocks on the cores: the chosen branch's bound (`et`, `ef`; no elements: 0) and marks, and where
    the predicate is rounding-decided (`marks`: (t's, f's, p's); no elements: none) the larger bound (NaN as
    np.maximum) plus the branches' distance, decided; each sample's (`pp`: the predicate's perturbed decisions,
    `dt`, `df`: the branches' deviations as their bfloat16 bits; no columns: none) chosen branch moved, less `x`, in
    float32, into `samples_out` as its bfloat16 bits (none where it has no columns); calibration's block
    statistics (of the float32 deviations, as `_sample`'s before they are stored). Returns (largest, total, counted, seen,
    unjudged)."""
    stats = _block_statistics(x.size, block)
    args = (p, t, f, x, et, ef, marks, pp, dt, df, bound_out, decided_out, samples_out, block)
    spans = over_cores(x.size, block, lambda first, last: _select_span(*args, first, last, *stats), threads)
    return *stats, stats[2].sum(), any(spans)


# term_sums' rows: per output element of a sum, over its terms
BOUNDS_SQUARED, REST_SQUARED, LEAST, BOUNDS, VALUES_SQUARED = range(5)


@njit(cache=True, nogil=True, error_model="numpy")
def _term_sums_span(a, e, d, columns, sums, deviations, first, last):
    """term_sums for output elements `first` to `last` (loops over views from 0: they vectorize)."""
    with_e, with_d, m = e.size > 0, d.shape[1] > 0, last - first
    b2, r2, least, b1, v2 = (sums[BOUNDS_SQUARED, first:last], sums[REST_SQUARED, first:last],
                             sums[LEAST, first:last], sums[BOUNDS, first:last], sums[VALUES_SQUARED, first:last])  # fmt: skip
    b2[:], r2[:], b1[:], v2[:] = 0.0, 0.0, 0.0, 0.0
    least[:] = math.inf if with_e else 0.0
    if not columns:
        lanes, totals = np.zeros((4, _LANES)), np.zeros(_LANES)
        decoded = np.empty(a.shape[1] if with_d else 0, np.float32)  # (a row of one sample's deviations)
        for o in range(m):
            least[o] = _least(e[first + o]) if with_e else 0.0
            lanes[:] = 0.0
            if with_e:
                _bound_lanes(e[first + o], least[o], lanes)
            _value_lanes(a[first + o], lanes)
            b2[o], r2[o], b1[o], v2[o] = lanes[0].sum(), lanes[1].sum(), lanes[2].sum(), lanes[3].sum()
            for k in range(deviations.shape[0] if with_d else 0):
                bits = d[k, first + o]
                for j in range(bits.size):  # (decoded first: a loop that vectorizes, as the sum's does)
                    decoded[j] = bf16_to_f32(bits[j])
                deviations[k, first + o] = np.float32(_row_total(decoded, totals))
        return
    count = a.shape[0]  # (terms along rows: each a contiguous run of output elements)
    for j in range(count if with_e else 0):
        ev, nan = e[j, first:last], False
        for o in range(m):
            value = np.float64(ev[o])
            least[o] = min(least[o], value)
            nan |= value != value
        if nan:  # (np.min's meaning: NaN if one is)
            for o in range(m):
                least[o] = math.nan if ev[o] != ev[o] else least[o]
    for j in range(count if with_e else 0):
        ev = e[j, first:last]
        for o in range(m):
            bound = np.float64(ev[o])
            rest = bound - least[o]
            b2[o] += bound * bound
            r2[o] += rest * rest
            b1[o] += bound
    for j in range(count):
        av = a[j, first:last]
        for o in range(m):
            v2[o] += np.float64(av[o]) * np.float64(av[o])
    total = np.empty(m)
    for k in range(deviations.shape[0] if with_d else 0):
        total[:] = 0.0
        for j in range(count):
            dv = d[k, j, first:last]
            for o in range(m):
                total[o] += np.float64(bf16_to_f32(dv[o]))
        for o in range(m):
            deviations[k, first + o] = np.float32(total[o])


_LANES = 8  # partial sums per quantity along a row (a vector's width of float64: the loop vectorizes)


@njit(inline="always")
def _least(bounds):
    """np.min of a row of bounds (float64): NaN if one is. In _LANES running minima (term j's in lane j % _LANES)
    and a count of NaN: a loop that vectorizes (a bound's sign of 0 may differ: it adds nothing to the rule)."""
    lowest, nan = np.full(_LANES, math.inf), 0
    full = bounds.size - bounds.size % _LANES
    for j0 in range(0, full, _LANES):
        group = bounds[j0 : j0 + _LANES]
        for lane in range(_LANES):
            value = np.float64(group[lane])
            lowest[lane] = value if value < lowest[lane] else lowest[lane]
            nan += value != value
    least = lowest.min()
    for j in range(full, bounds.size):
        value = np.float64(bounds[j])
        least = min(least, value)
        nan += value != value
    return math.nan if nan else least


@njit(inline="always")
def _bound_lanes(bounds, least, lanes):
    """Into `lanes` ((4, _LANES): partial sums, term j's in lane j % _LANES) one row of terms' bounds squared,
    (bound - least)^2 and bounds, in rows 0, 1, 2."""
    full = bounds.size - bounds.size % _LANES
    for j0 in range(0, full, _LANES):  # (whole groups of _LANES: a loop that vectorizes)
        group = bounds[j0 : j0 + _LANES]
        for lane in range(_LANES):
            bound = np.float64(group[lane])
            rest = bound - least
            lanes[0, lane] += bound * bound
            lanes[1, lane] += rest * rest
            lanes[2, lane] += bound
    for j in range(full, bounds.size):
        bound = np.float64(bounds[j])
        rest = bound - least
        lanes[0, j - full] += bound * bound
        lanes[1, j - full] += rest * rest
        lanes[2, j - full] += bound


@njit(inline="always")
def _value_lanes(values, lanes):
    """Into `lanes`' row 3 one row of terms' values squared (as _bound_lanes)."""
    full = values.size - values.size % _LANES
    for j0 in range(0, full, _LANES):
        group = values[j0 : j0 + _LANES]
        for lane in range(_LANES):
            lanes[3, lane] += np.float64(group[lane]) * np.float64(group[lane])
    for j in range(full, values.size):
        lanes[3, j - full] += np.float64(values[j]) * np.float64(values[j])


@njit(inline="always")
def _row_total(deviations, lanes):
    """The sum of a row of float32 deviations in float64, in _LANES partial sums (`lanes`: their scratch)."""
    lanes[:] = 0.0
    full = deviations.size - deviations.size % _LANES
    for j0 in range(0, full, _LANES):
        group = deviations[j0 : j0 + _LANES]
        for lane in range(_LANES):
            lanes[lane] += np.float64(group[lane])
    for j in range(full, deviations.size):
        lanes[j - full] += np.float64(deviations[j])
    return lanes.sum()


def term_sums(a, e, d, columns, sums, deviations, threads=None):
    """What an add reduce's bound rule reads of its terms (tools/bounds.py `_reduce`), per output element, in one
    pass over them (float64, in term order): the sum of their bounds squared, the least bound, the sum of (bound -
    least)^2, the sum of bounds, of values squared, into `sums`' rows (BOUNDS_SQUARED...; (5, outputs)); each
    sample's sum of deviations (rounded once to float32) into `deviations` ((samples, outputs); `d`: (samples, *a's
    shape), their bfloat16 bits (uint16: decoded as they are read, no float32 copy), no elements where there are
    none). `a` (values), `e` (bounds; no elements: 0): (outputs, terms), or
    (terms, outputs) where `columns`; C-ordered. Spans of output elements on the cores (`over_cores`)."""
    outputs = a.shape[1] if columns else a.shape[0]
    terms = a.size // max(outputs, 1)
    over_cores(a.size, max(terms, 1), lambda first, last: _term_sums_span(
        a, e, d, columns, sums, deviations, first // max(terms, 1), last // max(terms, 1)), threads)  # fmt: skip


@njit(cache=True, nogil=True, error_model="numpy")
def _rounded_to(value, rounding):
    """A float32 `value` rounded to the sum's type (`rounding`: 0 f16, 1 bf16, 2 f32: itself)."""
    if rounding == 0:
        return round_f16(value)
    if rounding == 1:
        return round_bf16(value)
    return value


@njit(cache=True, nogil=True, error_model="numpy")
def chained_sums(terms, init, rounding, lanes, out):
    """Each row of `terms` (rows, n; values of the sum's type, held in float32) summed in each order `lanes[m]`
    (-> `out[:, m]`, float64): that many chains, chain j the terms j, j + lanes, ... in order (chain 0 from `init`
    (rows,), the others from 0), then the chains added pairwise (neighbours first; a power of two of them), every
    step rounded to the type (`rounding`: 0 f16, 1 bf16, 2 f32). One chain is row-major order. A step's exact
    sum of two values of a 16-bit type is rounded to float32 first: with 24 bits, at least twice the type's plus
    two, that double rounding is the single one (the accumulation's error in a known or a representative order,
    tools/bound_shared)."""
    chains = np.empty(np.max(lanes), np.float32)
    n = terms.shape[1]
    for r in range(terms.shape[0]):
        for m in range(lanes.size):
            width = lanes[m]
            if width == 1:  # (one chain: in a register, not through memory)
                acc = np.float32(init[r])
                for k in range(n):
                    acc = _rounded_to(np.float32(acc + terms[r, k]), rounding)
                out[r, m] = acc
                continue
            chains[:width] = 0
            chains[0] = init[r]
            for start in range(0, n, width):
                for j in range(min(width, n - start)):
                    chains[j] = _rounded_to(np.float32(chains[j] + terms[r, start + j]), rounding)
            while width > 1:
                width //= 2
                for j in range(width):
                    chains[j] = _rounded_to(np.float32(chains[2 * j] + chains[2 * j + 1]), rounding)
            out[r, m] = chains[0]
