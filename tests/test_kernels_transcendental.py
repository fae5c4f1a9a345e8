"""The vectorizable transcendentals of fused kernels (kernels/scalar.py `*_wide`, used for f32 / f16 / bf16)
against numpy's float64 functions rounded once to the type: f16 and bf16 bit-identical over every bit
pattern, f32 within 1 ULP over 2M values spread across the exponent range, special values included."""

import ml_dtypes
import numpy as np
import pytest

from hloexec.kernels import fusion
from hloexec.kernels.irbuild import Builder
from hloexec.options import Options

BF16 = ml_dtypes.bfloat16
OPS = ("exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "logistic")
REFERENCE = {"exponential": np.exp, "exponential-minus-one": np.expm1, "log": np.log, "log-plus-one": np.log1p,
             "tanh": np.tanh, "logistic": lambda x: 1 / (1 + np.exp(-x))}
# (dtype, significant bits, exponent of the smallest normal as frexp gives it, quiet-NaN bit)
TYPES = {"f16": (np.float16, 11, -13, 1 << 9), "bf16": (BF16, 8, -125, 1 << 6),
         "f32": (np.float32, 24, -125, 1 << 22)}


def run_all_ops(et, x, out_et=None, excess_precision=False):
    """Every op of OPS applied to x by one generated kernel (a tuple-rooted fusion), converted to `out_et`."""
    s, out = f"{et}[{x.size}]", f"{out_et or et}[{x.size}]"
    b = Builder()
    p = b.param(0, s)
    outs = [b.op(op, s, p) for op in OPS]
    if out_et:
        outs = [b.op("convert", out, o) for o in outs]
    kernel = fusion.compile_fusion(b.build(b.op("tuple", "(" + ", ".join([out] * len(OPS)) + ")", *outs)),
                                   Options(excess_precision=excess_precision))
    assert kernel is not None
    assert "np.tanh" not in kernel.source and "np.exp" not in kernel.source and "np.log" not in kernel.source
    return dict(zip(OPS, kernel(x)))


def round_once(w, et):
    """float64 -> type `et` with a single rounding to nearest even (independent of the kernels' converters)."""
    dtype, bits, emin, _ = TYPES[et]
    _, e = np.frexp(w)
    quantum = np.maximum(e, emin) - bits                   # exponent of the last significant bit
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.ldexp(np.rint(np.ldexp(w, -quantum)), quantum)
        return r.astype(dtype)                             # exact, or inf past the largest finite value


def reference(op, x, et):
    with np.errstate(all="ignore"):
        return round_once(REFERENCE[op](x.astype(np.float64)), et)


def uint(a):
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def check_nans(got, want, et):
    """NaN exactly where the reference is NaN, and quiet."""
    got_nan = np.isnan(got.astype(np.float32))
    assert np.array_equal(got_nan, np.isnan(want.astype(np.float32)))
    assert np.all(uint(got[got_nan]) & TYPES[et][3])
    return got_nan


def assert_bits_equal(got, want, et, what):
    nan = check_nans(got, want, et)
    wrong = np.flatnonzero((uint(got) != uint(want)) & ~nan)
    assert wrong.size == 0, (what, wrong.size, got[wrong[:8]], want[wrong[:8]])


def all_f16():
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


@pytest.mark.parametrize("et", ["f16", "bf16"])
def test_half_types_correctly_rounded_for_every_bit_pattern(et):
    x = all_f16().view(TYPES[et][0])
    for op, got in run_all_ops(et, x).items():
        assert_bits_equal(got, reference(op, x, et), et, op)


def test_excess_precision_still_rounds_transcendentals_to_the_type():
    """With excess precision (f16 values carried unrounded in f32) the transcendentals' results are the
    correctly rounded f16 values all the same."""
    x = all_f16()
    for op, got in run_all_ops("f16", x, out_et="f32", excess_precision=True).items():
        assert_bits_equal(got, reference(op, x, "f16").astype(np.float32), "f32", op)


def ordered(a):
    """float32 bits -> integers whose differences count ULPs (-0 and +0 both 0)."""
    i = a.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def test_f32_within_one_ulp():
    r = np.random.default_rng(7)
    specials = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 2.0, 0.5, 1e-45, -1e-45,
                           1.1754942e-38, 3.4028235e38, -3.4028235e38, 88.72283, 88.72284, -87.33654, -103.27893,
                           -103.97208, -103.97209, 9.010913, -9.010913, 17.32868, -17.32868, 2 ** -29, -2 ** -29,
                           np.nextafter(np.float32(-1), np.float32(0)), np.nextafter(np.float32(-1), np.float32(-2))])
    x = np.concatenate([r.integers(0, 1 << 32, 1_500_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        r.uniform(-110, 110, 500_000).astype(np.float32), specials])
    for op, got in run_all_ops("f32", x).items():
        want = reference(op, x, "f32")
        nan = check_nans(got, want, "f32")
        ulps = np.abs(ordered(got) - ordered(want))[~nan]
        assert ulps.max() <= 1, (op, x[~nan][np.argmax(ulps)])
        # 1 ULP only where the exact value lies within 2**-51 of a rounding boundary (or numpy's float64 is
        # 1 ULP off there): expected ~0 in 2M values, none measured
        assert np.count_nonzero(ulps) <= 20, op
        assert np.array_equal(np.signbit(got[~nan]), np.signbit(want[~nan])), op
