"""Comparing hloexec's outputs with XLA:CPU's (jax's) for the differential tests.

`ulp_distance` counts representable values between two float arrays (NaN == NaN); `assert_close` checks
one output against the reference with a tolerance in ULPs (0 = bit-exact; ints and pred are always
compared exactly) or, for sums, an absolute bound array. XLA:CPU flushes f32 / f64 denormals (FTZ),
so ours are flushed before comparing.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16
FLOAT_BITS = {np.dtype(np.float16): np.int16, np.dtype(BF16): np.int16, np.dtype(np.float32): np.int32,
              np.dtype(np.float64): np.int64}
TINY = {np.dtype(np.float32): np.finfo(np.float32).tiny, np.dtype(np.float64): np.finfo(np.float64).tiny}


def is_float(dtype) -> bool:
    return np.dtype(dtype) in FLOAT_BITS


def flush_denormals(a: np.ndarray, where=True) -> np.ndarray:
    """`a` with its f32 / f64 denormals flushed to (signed) zero, those at `where` only."""
    tiny = TINY.get(a.dtype)
    if tiny is None:
        return a
    return np.where((np.abs(a) < tiny) & where, np.copysign(np.zeros_like(a), a), a)


def _ordered(a: np.ndarray) -> np.ndarray:
    """Float bits -> int64 keys whose order and differences count ULPs (+0 and -0 one apart)."""
    i = a.view(FLOAT_BITS[a.dtype]).astype(np.int64)
    sign_min = np.int64(np.iinfo(FLOAT_BITS[a.dtype]).min)
    return np.where(i < 0, sign_min - i - 1, i)


def ulp_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    kg, kw = _ordered(got), _ordered(want)
    with np.errstate(over="ignore"):
        same_side = (kg >= 0) == (kw >= 0)
        dist = np.where(same_side, np.abs(kg - kw).astype(np.float64),
                        np.abs(kg.astype(np.float64)) + np.abs(kw.astype(np.float64)))
    both_nan = np.isnan(got.astype(np.float64)) & np.isnan(want.astype(np.float64))
    return np.where(both_nan, 0.0, dist)


def max_ulp(got, want) -> float:
    got, want = flush_denormals(np.asarray(got)), np.asarray(want)
    if got.size == 0:
        return 0.0
    return float(ulp_distance(got, want).max())


def assert_close(got, want, *, ulps: float = 0, bound=None, flush: bool = True, what: str = ""):
    """`got` matches `want` in dtype and shape, then bit-exactly (ints, pred, ulps == 0), within `ulps`,
    or within the absolute `bound` (an array broadcastable to the shape). `flush=False` for results no
    arithmetic produced (bitcast-convert), where XLA keeps denormals."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    if not is_float(got.dtype):
        if not np.array_equal(got, want):
            bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
            raise AssertionError(f"{what}: {bad.size} of {got.size} differ; first at flat {bad[0]}: "
                                 f"got {got.reshape(-1)[bad[0]]!r}, want {want.reshape(-1)[bad[0]]!r}")
        return
    if flush:
        got = flush_denormals(got)
    if bound is not None:
        g, w = got.astype(np.float64), want.astype(np.float64)
        ok = (np.abs(g - w) <= bound) | (np.isnan(g) & np.isnan(w)) | (g == w)
        if not ok.all():
            k = np.flatnonzero(~ok.reshape(-1))[0]
            raise AssertionError(f"{what}: {(~ok).sum()} of {got.size} outside the bound; first at flat {k}: "
                                 f"got {g.reshape(-1)[k]!r}, want {w.reshape(-1)[k]!r}, "
                                 f"bound {np.broadcast_to(bound, g.shape).reshape(-1)[k]!r}")
        return
    dist = ulp_distance(got, want)
    if dist.max(initial=0) > ulps:
        k = int(np.argmax(dist.reshape(-1)))
        raise AssertionError(f"{what}: {(dist > ulps).sum()} of {got.size} over {ulps} ULP (max {dist.max():g}); "
                             f"worst at flat {k}: got {got.reshape(-1)[k]!r}, want {want.reshape(-1)[k]!r}")


def sum_bound(abs_terms: np.ndarray, n_terms: int, dtype) -> np.ndarray:
    """Error bound for a sum of `n_terms` products/terms whose absolute sum is `abs_terms`, in either
    order: n * eps * sum|terms| (Higham's bound for recursive summation) plus one rounding of the result."""
    eps = float(np.finfo(np.dtype(dtype)).eps) if np.dtype(dtype) != np.dtype(BF16) else 2.0 ** -7
    return (n_terms + 1) * eps * abs_terms.astype(np.float64)


def flatten(value) -> list:
    """A (nested) tuple result as a flat list of arrays, in jax's leaf order."""
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in flatten(v)]
    return [value]


def as_if_xla_rounded_f64_to_f16_twice(x: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """XLA:CPU's f64 -> f16 `ref`, as it is on hosts where XLA rounds through f32 (two roundings).

    That convert depends on the host: LLVM lowers it through f32 (two roundings, as XLA's evaluator does and
    hloexec does; NaNs come out canonical) unless the CPU has AVX512-FP16, where one instruction (vcvtpd2ph)
    rounds once and keeps the NaN's top payload bits. Where the two differ, `ref` must hold one of them; those
    elements become the through-f32 value."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        once, twice = x.astype(np.float16), x.astype(np.float32).astype(np.float16)
    got, once_bits, twice_bits = np.asarray(ref).view(np.uint16), once.view(np.uint16), twice.view(np.uint16)
    nan = np.isnan(x)       # numpy's casts keep payloads that XLA's do not: NaNs are checked on their own below
    differ = (once_bits != twice_bits) & ~nan
    assert np.all((got[differ] == once_bits[differ]) | (got[differ] == twice_bits[differ]))
    assert np.all(np.isnan(np.asarray(ref)[nan]) & (np.signbit(np.asarray(ref)[nan]) == np.signbit(x[nan])))
    canonical_nan = np.where(np.signbit(x), np.uint16(0xFE00), np.uint16(0x7E00)).view(np.float16)
    return np.where(nan, canonical_nan, np.where(differ, twice, ref))


def bits_agreement(got, want) -> tuple[float, float]:
    """(fraction of elements bit-identical, largest distance in ULPs of the output's scale) of `got` against
    XLA:CPU's `want`: the scale's ULP is the spacing of the type at max |want| (finite), so a 1-ULP slip of a
    small element counts as a fraction of one. NaN == NaN; f32/f64 denormals flushed where XLA:CPU's arithmetic
    flushed them (its result is zero; a denormal it kept -- a bitcast's, a copy's -- is compared as it is)."""
    want = np.asarray(want)
    got = flush_denormals(np.asarray(got), want == 0)
    if got.size == 0:
        return 1.0, 0.0
    same = float(np.mean(ulp_distance(got, want) == 0))
    w, g = want.astype(np.float64).reshape(-1), got.astype(np.float64).reshape(-1)
    finite = np.isfinite(w)
    scale = float(np.max(np.abs(w[finite]), initial=0.0))
    nmant = ml_dtypes.finfo(want.dtype).nmant
    ulp = 2.0 ** (np.floor(np.log2(scale)) - nmant) if scale > 0 else float(ml_dtypes.finfo(want.dtype).smallest_subnormal)
    with np.errstate(invalid="ignore"):
        diff = np.where((np.isnan(g) & np.isnan(w)) | (g == w), 0.0, np.abs(g - w))
    return same, float(np.nan_to_num(diff, nan=np.inf).max() / ulp)
