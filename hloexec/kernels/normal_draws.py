"""The error bounds' samples' own-error draws (tools/bounds.py, kernels/bound_rules.py): standard normal draws
computed where they are used from a counter-based generator, so no pool of draws is held or read.

Samples 2p and 2p + 1 of element i (or of a group of elements that make one rounding error, group g) take the two
32-bit halves of one 64-bit hash: SplitMix64's output function (Stafford's Mix13) of the Weyl term key + counter x
GOLDEN, counter = i x pairs + p (a group's GROUP_COUNTER + g x pairs + p; pairs: half the samples, rounded up),
`key` a random 64-bit number per instruction (from the observer's rng). A half u becomes a draw through the
inverse normal CDF, tabulated: its top bit is the sign, its low 23 bits m a tail probability w / 2 with w =
(2m + 1) 2^-24 (the midpoints of 2^23 equal cells of (0, 1), exact in float32), and the magnitude is the mean of
|Z| over the part of the tail that w's table cell stands for (TAIL_MEANS, indexed by w's float32 exponent and
top CELL_BITS mantissa bits: 1/256 of a binade, 24 binades, 24 KB). So P(|draw| > t) is the normal's at every
cell edge and tails reach 5.47 sigma (the last 2^-24 of probability); mean 0, variance 1 - 4e-7, fourth moment
3 - 2e-6 (12,288 values). No branch, but the table's read keeps the loop scalar (~7 ns an element for four
draws: AVX2 has no 64-bit multiply, and LLVM does not gather from the table).

A single rounding's error is uniform, not normal: the elementwise ops' own errors (kernels/bound_rules'
elementwise pass: one rounding each) draw from `fill_rounding_draws`, uniform of the same variance, four per
hash (its 16-bit quarters) and no table: its loop vectorizes (~1 ns an element for four draws, 2026-11-30).
Sums, dots and the transcendentals keep the normal draws (an error of many roundings, or of an approximation)."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
from numba import njit

from .half import bitcast_f32_to_u32, bitcast_u32_to_f32

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # the Weyl sequence's step (2^64 / the golden ratio, odd)
GROUP_COUNTER = np.uint64(1 << 63)  # groups' counters from here: their Weyl terms the elements' + 2^63, never one
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
CELL_BITS = 8  # cells per binade of w: 2^this
_FIRST_EXPONENT = 103  # float32's biased exponent of 2^-24, w's smallest
_BINADES = 127 - _FIRST_EXPONENT
_U32 = np.uint32


def _tail_means() -> np.ndarray:
    """E(|Z| | w in the cell) for each cell of w (float32, in index order; w / 2 a tail probability P(Z > z)): over the
    2^-23-wide intervals of the uniform that the cell's points (2m + 1) 2^-24 stand for, from the normal's
    density at the ends (E(Z | a < Z <= b) = (pdf(a) - pdf(b)) / P(a < Z <= b)); a cell no point falls in
    (below 2^-15 a binade has fewer points than cells) is never read: 0."""
    normal = NormalDist()
    scale = 2**CELL_BITS
    means = np.zeros(_BINADES * scale)
    for cell in range(means.size):
        binade, step = divmod(cell, scale)
        low = 2.0 ** (binade + _FIRST_EXPONENT - 127)
        start, stop = low * (1 + step / scale), low * (1 + (step + 1) / scale)
        # the points (2m + 1) 2^-24 in [start, stop): m from first to last
        first, last = np.ceil((start * 2**24 - 1) / 2), np.ceil((stop * 2**24 - 1) / 2) - 1
        if last < first:
            continue
        w_low, w_high = first * 2.0**-23, (last + 1) * 2.0**-23  # the uniform's interval they stand for
        z_high = np.inf if w_low == 0 else -normal.inv_cdf(w_low / 2)
        z_low = -normal.inv_cdf(w_high / 2)
        means[cell] = (normal.pdf(z_low) - (0.0 if z_high == np.inf else normal.pdf(z_high))) / ((w_high - w_low) / 2)
    return means.astype(np.float32)


TAIL_MEANS = _tail_means()
TAIL_MEANS.flags.writeable = False


@njit(inline="always")
def mix64(weyl):
    """SplitMix64's output function of a Weyl term key + counter x GOLDEN (uint64)."""
    z = (weyl ^ (weyl >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit(inline="always")
def normal_of(u):
    """A standard normal draw (float32) from 32 uniform bits `u` (uint32): the sign from the top bit, the
    magnitude TAIL_MEANS' at w = (2 x the low 23 bits + 1) 2^-24 = 1.m - (1 - 2^-24) (exact: 24 significant
    bits)."""
    w = bitcast_u32_to_f32(_U32(_U32(0x3F800000) | (u & _U32(0x7FFFFF)))) - np.float32(1.0 - 2.0**-24)
    cell = _U32(bitcast_f32_to_u32(w) >> _U32(23 - CELL_BITS)) - _U32(_FIRST_EXPONENT << CELL_BITS)
    return bitcast_u32_to_f32(_U32(bitcast_f32_to_u32(TAIL_MEANS[cell]) | (u & _U32(0x80000000))))


@njit(inline="always")
def fill_draws(key, first, count, keys, out):
    """out[k, t] for t < `count`: sample k's draw for element `first` + t, or for group keys[t] where keys has
    elements and keys[t] >= 0 (one draw per group per sample); `key` the instruction's (uint64). `out` has an even
    number of rows (an odd number of samples: one row more), is C-ordered, and its rows are cut to `count` here
    (contiguous rows: loops that vectorize)."""
    pairs = out.shape[0] // 2
    step = np.uint64(pairs) * GOLDEN  # (the Weyl terms of consecutive elements: one add apart, no multiply)
    for p in range(pairs):
        own = key + (np.uint64(first) * np.uint64(pairs) + np.uint64(p)) * GOLDEN
        shared = key + (GROUP_COUNTER + np.uint64(p)) * GOLDEN
        low, high = out[2 * p, :count], out[2 * p + 1, :count]
        if keys.size == 0:
            for t in range(count):  # (no branch: the loops vectorize)
                _split(mix64(own), low, high, t)
                own += step
        else:
            for t in range(count):
                g = keys[t]
                _split(mix64(shared + np.uint64(g) * step if g >= 0 else own), low, high, t)
                own += step


ROUNDING_SCALE = np.float32(np.sqrt(3) * 2.0**-16)  # (an odd multiple of 2^-16 in (-1, 1) times it: variance 1)


@njit(inline="always")
def uniform_of(z, j):
    """Rounding draw j (0-3) of hash `z` (uint64): its 16-bit quarter j, f, as (2f - 65535) 2^-16 (the 65,536 odd
    multiples of 2^-16 in (-1, 1), equally likely: mean 0, variance (1 - 2^-32) / 3) times sqrt(3): a uniform of
    variance 1 - 2^-32 within +-sqrt(3), symmetric about 0 (float32's rounding of the product is too)."""
    f = np.int32((z >> np.uint64(16 * j)) & np.uint64(0xFFFF))
    return np.float32(2 * f - 65535) * ROUNDING_SCALE


@njit(inline="always")
def fill_rounding_draws(key, first, count, keys, out):
    """fill_draws' rows for a single rounding's error: uniform draws of variance 1 (`uniform_of`). Samples 4q to
    4q + 3 of element i (or group g) take the four quarters of one hash, counter i x quads + q (GROUP_COUNTER + g x
    quads + q; quads: the samples / 4 rounded up); `out` has a multiple of 4 rows, C-ordered. No branch and no
    table: the loops vectorize (a group's hash a select)."""
    quads = out.shape[0] // 4
    step = np.uint64(quads) * GOLDEN
    for q in range(quads):
        own = key + (np.uint64(first) * np.uint64(quads) + np.uint64(q)) * GOLDEN
        shared = key + (GROUP_COUNTER + np.uint64(q)) * GOLDEN
        r0, r1, r2, r3 = out[4 * q, :count], out[4 * q + 1, :count], out[4 * q + 2, :count], out[4 * q + 3, :count]
        if keys.size == 0:
            for t in range(count):
                z = mix64(own + np.uint64(t) * step)
                r0[t], r1[t], r2[t], r3[t] = uniform_of(z, 0), uniform_of(z, 1), uniform_of(z, 2), uniform_of(z, 3)
        else:
            for t in range(count):
                g = keys[t]
                z = mix64(shared + np.uint64(g) * step if g >= 0 else own + np.uint64(t) * step)
                r0[t], r1[t], r2[t], r3[t] = uniform_of(z, 0), uniform_of(z, 1), uniform_of(z, 2), uniform_of(z, 3)


@njit(inline="always")
def _split(z, low, high, t):
    """The two draws of hash `z` into low[t] (its low half's) and high[t]."""
    low[t] = normal_of(_U32(z & np.uint64(0xFFFFFFFF)))
    high[t] = normal_of(_U32(z >> np.uint64(32)))


@njit(cache=True, nogil=True)
def standard_normals(key, first, keys, out):
    """fill_draws of all of `out`'s columns as a kernel of its own (tests)."""
    fill_draws(key, first, out.shape[1], keys, out)


@njit(cache=True, nogil=True)
def rounding_draws(key, first, keys, out):
    """fill_rounding_draws of all of `out`'s columns as a kernel of its own (tests)."""
    fill_rounding_draws(key, first, out.shape[1], keys, out)
