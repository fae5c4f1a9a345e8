"""The error bounds of the unary elementwise ops with no first-order form (sqrt, rsqrt, the transcendentals,
floor...: tools/bound_generic.py) in one pass per chunk of elements. The op itself is the shadow's kernel (numpy),
called once per chunk on every argument it needs stacked as rows: the ends of the operand's interval and each
sample's perturbed operand (`unary_arguments`); the rest -- the bound before the rounding, the rounding, the
samples' deviations plus their own-error draws, calibration's block statistics -- is one compiled loop
(`_unary_chunk`), the formulas of ErrorBounds' separate rules (`_moved_by`, `_round`, `_sample`) in their order."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .bound_rules import _CHUNK_BLOCKS, _block_statistics, _moved_apart, _nan_max, _rounded, _tally_blocks, over_cores

CHUNK_BLOCKS = 4 * _CHUNK_BLOCKS  # calibration blocks per chunk (one kernel call each: the arguments' rows in cache)


@njit(cache=True, nogil=True, error_model="numpy")
def unary_arguments(a, ea, da, lo, hi, args):
    """The rows the op is evaluated on for elements `lo` to `hi` (into `args[:, :hi - lo]`, float64): where the
    operand has a bound (`ea`, no elements where it has none) a + e and a - e (`_moved_by`'s interval ends), then
    per sample a + d_k (`da`: (samples, n), float32; `_sample`'s perturbed operand), or the one row a where it has
    no samples (no columns). Returns the number of rows written."""
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
            out[t] = av[t] + np.float64(dv[t])
    return row + da.shape[0]


@njit(cache=True, nogil=True, error_model="numpy")
def _unary_chunk(flags, x, a, ea, values, rule, draws, bound_out, samples_out, decided_out, block, lo, hi,
                 largest, total, counted):  # fmt: skip
    """Elements `lo` (a multiple of `block`) to `hi` of one op's bound, from `values` (the op on unary_arguments'
    rows): where the operand has a bound (`ea`), b^2 = max(|f(a + e) - x|, |f(a - e) - x|)^2 (NaN: inf), marking
    in `decided_out` where the interval holds 0 (flags' `singular`) or its ends differ (`steps`); the bound after
    the op's own rounding where it `rounds` (round_bounds'; `rule` its scalars), else b; into `samples_out` (none:
    no columns) each sample's f(a + d_k) - x in float32 plus a standard normal draw times float32(own / SIGMAS)
    (`draws`: (pool, start, sigmas); element i's of sample k is pool[start + k n + i]); calibration's block
    statistics (block_ratios') into `largest`, `total`, `counted`. Returns (any own error nonzero, unjudged)."""
    singular, steps, rounds = flags
    pool, start, sigmas = draws
    n, m, samples = x.size, hi - lo, samples_out.shape[0]
    moving, sampled, own_rows = ea.size > 0, samples_out.shape[1] > 0, values.shape[0] - (2 if ea.size > 0 else 0)
    per_sigma = 1.0 / sigmas  # (own x it is own / sigmas exactly: SIGMAS is a power of two)
    scales, squares = np.empty(m, np.float32), np.empty(m, np.float32)
    ratios, judged = np.empty(m), np.empty(m, np.bool_)
    xv, av, bound = x[lo:hi], a[lo:hi], bound_out[lo:hi]
    any_own = False
    for t in range(m):
        v, before = xv[t], 0.0
        if moving:
            up, down, e = values[0, t], values[1, t], np.float64(ea[lo + t])
            before = _moved_apart(up, down, v)
            if singular and abs(av[t]) <= e and e > 0:
                decided_out[lo + t] = True
            if steps and up != down:
                decided_out[lo + t] = True
            before = math.sqrt(before * before)
        if rounds:
            own, bound[t] = _rounded(v, before, abs(v) + before, rule)
            scales[t] = np.float32(own * per_sigma)  # (a standard normal draw times it: the own error's)
            any_own |= own != 0
        else:
            bound[t] = before
    if not sampled:
        return any_own, False
    squares[:] = 0
    for k in range(samples):
        out, moved = samples_out[k, lo:hi], values[values.shape[0] - own_rows + min(k, own_rows - 1)]
        for t in range(m):
            out[t] = np.float32(moved[t] - xv[t])
        if rounds:
            own_draws = pool[start + k * n + lo : start + k * n + hi]
            for t in range(m):
                out[t] += own_draws[t] * scales[t]
        for t in range(m):
            squares[t] += out[t] * out[t]
    return any_own, _tally_blocks(squares, bound, lo, block, largest, total, counted, ratios, judged)


def unary_pass(kernel, flags, x, a, ea, da, rule, draws, bound_out, samples_out, decided_out, block, threads=None):
    """One unary op's bound, rounding-decided marks, samples and calibration statistics (`_unary_chunk`) over all
    of `x`'s elements: spans of whole blocks on the cores (`over_cores`; numpy's kernel releases the GIL), each a
    chunk of CHUNK_BLOCKS blocks at a time, `kernel` (the op) called once per chunk on its unary_arguments' rows.
    Returns (any own error nonzero, largest, total, counted, seen, unjudged)."""
    stats = _block_statistics(x.size, block)
    rows = (2 if ea.size > 0 else 0) + max(da.shape[0] if da.shape[1] > 0 else 1, 1)
    chunk = block * CHUNK_BLOCKS

    def span(first, last):
        args, found = np.empty((rows, min(chunk, last - first))), [False, False]
        for lo in range(first, last, chunk):
            hi = min(last, lo + chunk)
            written = unary_arguments(a, ea, da, lo, hi, args)
            values = np.asarray(kernel(args[:written, : hi - lo]), np.float64)
            own, unjudged = _unary_chunk(flags, x, a, ea, values, rule, draws, bound_out, samples_out, decided_out,
                                         block, lo, hi, *stats)  # fmt: skip
            found = [found[0] or own, found[1] or unjudged]
        return found

    spans = over_cores(x.size, block, span, threads)
    return any(s[0] for s in spans), *stats, stats[2].sum(), any(s[1] for s in spans)


@njit(cache=True, nogil=True, error_model="numpy")
def _select_span(p, t, f, x, et, ef, marks, pp, dt, df, bound_out, decided_out, samples_out, block, first, last,
                 largest, total, counted):  # fmt: skip
    """select_pass on elements `first` (a multiple of `block`) to `last`."""
    with_et, with_ef, with_pp, with_dt, with_df = (
        et.size > 0,
        ef.size > 0,
        pp.shape[1] > 0,
        dt.shape[1] > 0,
        df.shape[1] > 0,
    )
    marks_t, marks_f, undecided = marks
    with_mt, with_mf, with_undecided = marks_t.size > 0, marks_f.size > 0, undecided.size > 0
    sampled = samples_out.shape[1] > 0
    m = last - first
    squares, ratios, judged = np.empty(m, np.float32), np.empty(m), np.empty(m, np.bool_)
    for i in range(first, last):
        a, b = np.float64(et[i]) if with_et else 0.0, np.float64(ef[i]) if with_ef else 0.0
        bound = a if p[i] else b
        decided = (with_mt and marks_t[i]) if p[i] else (with_mf and marks_f[i])
        if with_undecided and undecided[i]:
            bound = _nan_max(a, b) + abs(t[i] - f[i])
            decided = True
        bound_out[i], decided_out[i] = bound, decided
    if not sampled:
        return False
    squares[:] = 0
    for k in range(samples_out.shape[0]):
        out = samples_out[k, first:last]
        for j in range(m):
            i = first + j
            chosen = pp[k, i] if with_pp else p[i]
            moved = (t[i] + np.float64(dt[k, i]) if with_dt else t[i]) if chosen else (
                f[i] + np.float64(df[k, i]) if with_df else f[i])  # fmt: skip
            out[j] = np.float32(moved - x[i])
            squares[j] += out[j] * out[j]
    return _tally_blocks(squares, bound_out[first:last], first, block, largest, total, counted, ratios, judged)


def select_pass(p, t, f, x, et, ef, marks, pp, dt, df, bound_out, decided_out, samples_out, block, threads=None):
    """A select's bound, rounding-decided marks and samples (tools/bounds.py `_select`, `_sample`) in one pass,
    spans of whole blocks on the cores: the chosen branch's bound (`et`, `ef`; no elements: 0) and marks, and where
    the predicate is rounding-decided (`marks`: (t's, f's, p's); no elements: none) the larger bound (NaN as
    np.maximum) plus the branches' distance, decided; each sample's (`pp`: the predicate's perturbed decisions,
    `dt`, `df`: the branches' deviations; no columns: none) chosen branch moved, less `x`, in float32 (none where
    `samples_out` has no columns); calibration's block statistics. Returns (largest, total, counted, seen,
    unjudged)."""
    stats = _block_statistics(x.size, block)
    args = (p, t, f, x, et, ef, marks, pp, dt, df, bound_out, decided_out, samples_out, block)
    spans = over_cores(x.size, block, lambda first, last: _select_span(*args, first, last, *stats), threads)
    return *stats, stats[2].sum(), any(spans)
