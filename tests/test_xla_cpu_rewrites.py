"""XLA's algebraic simplifier rewrites on XLA:CPU that round differently from the module as written, judged under
XLA:CPU's arithmetic (the `xla-cpu` profile's folded_constant_sums, power_as_products, exp_of_differences:
tools/bound_rewrites.py). Each: XLA:CPU's real result (jaxlib) equals the rewritten form emulated from its rules in
numpy (f16 ops rounded to f16 one by one; f32 flushed below its normals), is consistent, and a change of twice an
element's bound is caught."""

from __future__ import annotations

import numpy as np
import pytest

import hloexec
from hloexec.tools.numerics import judge_run, xla_cpu_arithmetic

pytestmark = pytest.mark.xla

TYPES = {"f16": np.float16, "f32": np.float32}


def ftz(x) -> np.ndarray:
    """x86's FTZ / DAZ on f32: below the smallest normal, a zero of the same sign."""
    x = np.asarray(x, np.float32)
    return np.where(np.abs(x) < np.finfo(np.float32).tiny, np.float32(0) * np.sign(x), x).astype(np.float32)


def rounded(x, dtype) -> np.ndarray:
    """An op's exact (f64) result rounded to `dtype` as XLA:CPU stores it."""
    return ftz(x) if dtype == np.float32 else np.asarray(x).astype(dtype)


def _matches_and_judged(text: str, inputs: list, emulated: np.ndarray, planted_at: int, rtol: float = 0.0):
    """XLA:CPU's result of `text` on `inputs`: equal to `emulated` (within `rtol` where XLA:CPU's own transcendental
    is not emulated), consistent under its arithmetic, and caught with element `planted_at` moved (_judged)."""
    from hloexec.tools.xla_cpu import run_on_xla_cpu

    with np.errstate(all="ignore"):
        xla = run_on_xla_cpu(text, inputs)[0]
        np.testing.assert_allclose(xla, emulated, rtol=rtol) if rtol else np.testing.assert_array_equal(xla, emulated)
    consistent, caught, why = _judged(text, inputs, xla, planted_at)
    assert consistent, why
    assert caught
    return xla


def _judged(text: str, inputs: list, xla: np.ndarray, planted_at: int):
    """(XLA:CPU's verdict is consistent, a change of twice element `planted_at`'s bound away from the shadow is
    caught), under XLA:CPU's arithmetic."""
    verdict, run = judge_run(hloexec.load(text), inputs, {"XLA:CPU": [xla]}, known={"XLA:CPU": xla_cpu_arithmetic()})
    ours = next(b for name, b in run.bounds.items() if name.startswith("xla-cpu"))
    shadow = np.asarray(run.shadow[0], np.float64).reshape(-1)
    bound = np.asarray(ours.bounds[0], np.float64).reshape(-1)
    flat = xla.reshape(-1)
    i = planted_at
    step = 2 * bound[i]
    assert step > 0.5 * np.spacing(np.abs(flat[i]))  # (the bound, not the final rounding's half ulp, decides)
    side = 1.0 if flat[i] >= shadow[i] else -1.0
    moved = flat.copy()
    moved[i] = flat.dtype.type(shadow[i] + side * step)
    while abs(float(moved[i]) - shadow[i]) < step:  # (at least twice the bound after rounding to the type)
        moved[i] = np.nextafter(moved[i], flat.dtype.type(side * np.inf))
    planted, _ = judge_run(
        hloexec.load(text), inputs, {"planted": [moved.reshape(xla.shape)]}, known={"planted": xla_cpu_arithmetic()}
    )
    failing = verdict.to_dict()["outputs"][0]["candidates"][1]
    return verdict.consistent("XLA:CPU"), not planted.consistent("planted"), failing.get("reasons")


# form -> (the inner op, the outer op, c2 (c1: 0.1; their f16 sum, difference rounds), the device's result from a
# and the constants, folded by `fold`)
FOLDED = {
    "(a+c1)+c2": ("add(a, kb)", "add", 0.3, lambda a, c1, c2, fold: a + fold(c1 + c2)),
    "(c1-a)+c2": ("subtract(kb, a)", "add", 0.3, lambda a, c1, c2, fold: fold(c1 + c2) - a),
    "(a-c1)+c2": ("subtract(a, kb)", "add", 0.7, lambda a, c1, c2, fold: a + fold(c2 - c1)),
    "(a+c1)-c2": ("add(a, kb)", "subtract", 0.7, lambda a, c1, c2, fold: a + fold(c1 - c2)),
}


@pytest.mark.parametrize("t", list(TYPES))
@pytest.mark.parametrize("form", list(FOLDED))
def test_xla_cpus_folded_constant_sums_are_consistent(form, t):
    """Measured at 180 (191) of 4,096 f16 elements past their bounds (bench/xla_cpu_rewrites.py): XLA's HandleAdd
    makes (a + 0.1) + 0.3 a + fl(0.1 + 0.3) and (0.1 - a) + 0.3 fl(0.1 + 0.3) - a, the constants' sum rounded
    in the type, where the module's own adds may be exact (bound 0); HandleSubtract's a - c => a + (-c) first
    makes (a - c1) + c2 and (a + c1) - c2 the same. The folded constant's rounding widens every element's bound
    alike."""
    dtype = TYPES[t]
    inner, outer, c2, device = FOLDED[form]
    text = f"""HloModule m
ENTRY e {{ a = {t}[1024] parameter(0)  k = {t}[] constant(0.1)  kb = {t}[1024] broadcast(k), dimensions={{}}
  l = {t}[] constant({c2})  lb = {t}[1024] broadcast(l), dimensions={{}}  x = {t}[1024] {inner}
  ROOT r = {t}[1024] {outer}(x, lb) }}"""
    a = (np.random.default_rng(1).standard_normal(1024) * 2).astype(dtype)

    def fold(c):  # (the constant folded in the type; its rounding is this test's subject)
        assert rounded(c, dtype) != c
        return rounded(c, dtype).astype(np.float64)

    emulated = rounded(device(a.astype(np.float64), np.float64(dtype(0.1)), np.float64(dtype(c2)), fold), dtype)
    _matches_and_judged(text, [a], emulated, int(np.argmax(np.abs(a))))


@pytest.mark.parametrize("t", list(TYPES))
def test_xla_cpus_cube_as_two_products_is_consistent(t):
    """Measured at 129 of 4,096 f16 elements past their bounds (2.2x): XLA's HandlePower makes pow(a, 3)
    a * (a * a), two roundings where the module's pow has one; the inner one carried by |a|."""
    dtype = TYPES[t]
    text = f"""HloModule m
ENTRY e {{ a = {t}[1024] parameter(0)  k = {t}[] constant(3)  kb = {t}[1024] broadcast(k), dimensions={{}}
  ROOT r = {t}[1024] power(a, kb) }}"""
    a = (np.random.default_rng(2).standard_normal(1024) * 2).astype(dtype)
    wide = a.astype(np.float64)
    emulated = rounded(wide * rounded(wide * wide, dtype).astype(np.float64), dtype)
    _matches_and_judged(text, [a], emulated, int(np.argmax(np.abs(a))))


@pytest.mark.parametrize("t", list(TYPES))
def test_xla_cpus_quotient_of_exps_as_exp_of_the_difference_is_consistent(t):
    """Measured at 196 of 4,096 f16 elements past their bounds (5x), f32 non-finite ones near its range's ends:
    XLA's HandleDivide makes exp(a) / exp(b) exp(a - b): the difference's rounding is a relative error of e^(a-b)
    (|a - b| h), and where the module's exps leave the type's range (row 1: |a|, |b| near 100) the rewritten
    form's result is finite or an infinity the module's is not (0 / 0, inf / inf), and in row 2 (a and b near
    +-1000, a - b small) where the shadow's own exps leave f64's, its NaN is no answer: any value goes there."""
    dtype = TYPES[t]
    text = f"""HloModule m
ENTRY e {{ a = {t}[3,512] parameter(0)  b = {t}[3,512] parameter(1)  x = {t}[3,512] exponential(a)
  y = {t}[3,512] exponential(b)  ROOT r = {t}[3,512] divide(x, y) }}"""
    r = np.random.default_rng(3)
    a, b = (r.standard_normal((3, 512)) * 2 for _ in range(2))
    a[1], b[1] = a[1] * 10 + 95 * r.choice([-1, 1], 512), b[1] * 10 + 95 * r.choice([-1, 1], 512)
    a[2] = 1000 * r.choice([-1, 1], 512) + a[2] * 10
    b[2] += a[2]
    a, b = a.astype(dtype), b.astype(dtype)
    d = rounded(a.astype(np.float64) - b.astype(np.float64), dtype)
    with np.errstate(over="ignore"):
        emulated = rounded(np.exp(d.astype(np.float64)).astype(np.float32), dtype)  # (exp in f32: f16's too)
    planted_at = int(np.argmax(np.abs(a[0] - b[0])))
    xla = _matches_and_judged(text, [a, b], emulated, planted_at, rtol=4 * float(np.finfo(dtype).eps))
    assert np.isinf(xla[1]).any() and np.isfinite(xla[2]).all()


@pytest.mark.parametrize("t", ["f32", "bf16"])
def test_xla_cpus_reciprocal_power_of_a_flushed_subnormal_is_an_infinity(t):
    """Measured at 245 (590) of 4,096 f32 (bf16) elements near the subnormals non-finite where the shadow is not:
    XLA's HandlePower makes pow(a, -1) 1 / a, and XLA:CPU's divide reads a subnormal a as a zero of its sign
    (DAZ; bf16 computed in f32): +-inf where 1 / a is finite (~1e38). The bound's marks allow that infinity of
    a's sign where a may be flushed, not the other's."""
    import ml_dtypes

    dtype = np.float32 if t == "f32" else ml_dtypes.bfloat16
    text = f"""HloModule m
ENTRY e {{ a = {t}[256] parameter(0)  k = {t}[] constant(-1)  kb = {t}[256] broadcast(k), dimensions={{}}
  ROOT r = {t}[256] power(a, kb) }}"""
    r = np.random.default_rng(4)
    a = r.standard_normal(256) * 2
    a[:64] = np.exp2(r.uniform(-133, -127, 64)) * r.choice([-1, 1], 64)  # (subnormal in f32 and bf16)
    a = a.astype(dtype)
    emulated = (np.float32(1) / ftz(a.astype(np.float32))).astype(dtype)
    xla = _matches_and_judged(text, [a], emulated, 64 + int(np.argmax(np.abs(a[64:].astype(np.float64)))))
    assert np.isinf(xla[:64]).all() and np.array_equal(np.signbit(xla[:64]), np.signbit(a[:64]))
    wrong = xla.copy()
    wrong[:64] = -wrong[:64]  # (the other infinity)
    candidates = {"XLA:CPU": [xla], "wrong sign": [wrong]}
    verdict, _ = judge_run(hloexec.load(text), [a], candidates, known=dict.fromkeys(candidates, xla_cpu_arithmetic()))
    assert verdict.consistent("XLA:CPU"), verdict.to_dict()["outputs"][0]["candidates"][1]["reasons"]
    assert not verdict.consistent("wrong sign")


@pytest.mark.parametrize("t", list(TYPES))
def test_xla_cpus_factored_sum_may_overflow_where_the_products_do_not(t):
    """Measured at 65 of 4,096 elements near the type's largest value non-finite where the shadow is finite (f16,
    f32): XLA's HandleAdd makes a * 0.25 + b * 0.25 (a power of 2, each product used once) (a + b) * 0.25, and a + b
    overflows where the quarter-sized products' sum does not. The marks allow that infinity (of the sum's sign)."""
    dtype = TYPES[t]
    text = f"""HloModule m
ENTRY e {{ a = {t}[2,128] parameter(0)  b = {t}[2,128] parameter(1)  k = {t}[] constant(0.25)
  kb = {t}[2,128] broadcast(k), dimensions={{}}  x = {t}[2,128] multiply(a, kb)  y = {t}[2,128] multiply(b, kb)
  ROOT r = {t}[2,128] add(x, y) }}"""
    r = np.random.default_rng(6)
    a, b = (r.standard_normal((2, 128)) * 2 for _ in range(2))
    largest = float(np.finfo(dtype).max)
    sign = r.choice([-1, 1], 128)
    a[1], b[1] = sign * largest * r.uniform(0.5, 1, 128), sign * largest * r.uniform(0.5, 1, 128)  # (row 1: a + b
    a, b = a.astype(dtype), b.astype(dtype)  # past the largest, its quarter not)
    with np.errstate(over="ignore"):
        emulated = rounded(rounded(a.astype(np.float64) + b.astype(np.float64), dtype).astype(np.float64) / 4, dtype)
    xla = _matches_and_judged(text, [a, b], emulated, int(np.argmax(np.abs(a[0].astype(np.float64)))))
    assert np.isinf(xla[1]).sum() > 32


def test_xla_cpus_fusions_are_computed_as_written():
    """XLA's AlgebraicSimplifier runs on the computations fusions do not call (MakeNonfusionComputations): inside a
    module's fusion XLA:CPU computes exp(a) / exp(b) + 0.1 + 0.3 and (a / b) / (a / b) as written (1 where b is
    tiny, not NaN). Their bounds are the module's, not the rewritten forms' wider ones: twice the bound of the
    quotient of exps of the largest a - b is caught, and 5 ulps there (under the widened bound they were not)."""
    text = """HloModule m
fused { a = f16[2,512] parameter(0)  b = f16[2,512] parameter(1)  x = f16[2,512] exponential(a)
  y = f16[2,512] exponential(b)  d = f16[2,512] divide(x, y)  k = f16[] constant(0.1)
  kb = f16[2,512] broadcast(k), dimensions={}  l = f16[] constant(0.3)  lb = f16[2,512] broadcast(l), dimensions={}
  s = f16[2,512] add(d, kb)  t = f16[2,512] add(s, lb)  p = f16[2,512] divide(a, b)  q = f16[2,512] divide(p, p)
  ROOT r = f16[2,512] add(t, q) }
ENTRY e { a = f16[2,512] parameter(0)  b = f16[2,512] parameter(1)
  ROOT f = f16[2,512] fusion(a, b), kind=kLoop, calls=fused }"""
    r = np.random.default_rng(7)
    a, b = (r.standard_normal((2, 512)) * 2 for _ in range(2))
    a[1], b[1] = a[1] * 1e-4, b[1] * 1e-4  # (a * b below f16's least value: (a*b) / (a*b) would be NaN)
    a, b = a.astype(np.float16), b.astype(np.float16)
    wide = [v.astype(np.float64) for v in (a, b)]
    e = [rounded(np.exp(v).astype(np.float32), np.float16).astype(np.float64) for v in wide]
    t = rounded(
        rounded(rounded(e[0] / e[1], np.float16).astype(np.float64) + 0.0999755859375, np.float16) + 0.300048828125,
        np.float16,
    )
    p = rounded(wide[0] / wide[1], np.float16).astype(np.float64)
    emulated = rounded(t.astype(np.float64) + rounded(p / p, np.float16), np.float16)
    planted_at = int(np.argmax(wide[0][0] - wide[1][0]))  # (the largest quotient of exps)
    xla = _matches_and_judged(text, [a, b], emulated, planted_at, rtol=4 * float(np.finfo(np.float16).eps))
    assert np.isfinite(xla).all()
    far = xla.copy()  # (5 ulps off e^7 + 1.4 ~ 1104, away from it: within the rewritten form's bound, not the module's)
    far[0, planted_at] += 5 * np.sign(float(xla[0, planted_at]) - float(emulated[0, planted_at]) or 1.0)
    verdict, _ = judge_run(hloexec.load(text), [a, b], {"5 ulps": [far]}, known={"5 ulps": xla_cpu_arithmetic()})
    assert not verdict.consistent("5 ulps")


def test_xla_cpus_divide_by_an_exp_may_overflow_where_the_quotient_does_not():
    """Measured at 16 of 4,096 f16 elements log-uniform over its range infinite where the shadow is finite: XLA's
    HandleDivide makes a / exp(b) a * exp(-b), and exp(-b) overflows f16 (b < -11.1) where exp(b) is a normal
    number and a / exp(b) is finite (|a| < 1). The marks allow the infinity of a's sign there."""
    text = """HloModule m
ENTRY e { a = f16[2,256] parameter(0)  b = f16[2,256] parameter(1)  y = f16[2,256] exponential(b)
  ROOT r = f16[2,256] divide(a, y) }"""
    r = np.random.default_rng(8)
    a, b = r.standard_normal((2, 256)), r.standard_normal((2, 256))
    a[1], b[1] = r.uniform(-0.9, 0.9, 256), r.uniform(-14, -11.5, 256)  # (row 1: exp(-b) past 65,504)
    a, b = a.astype(np.float16), b.astype(np.float16)
    with np.errstate(over="ignore"):
        e = rounded(np.exp(-b.astype(np.float64)).astype(np.float32), np.float16)  # (exp in f32)
        emulated = rounded(a.astype(np.float64) * e.astype(np.float64), np.float16)
    xla = _matches_and_judged(text, [a, b], emulated, int(np.argmax(np.abs(a[0]))), rtol=4 * 2.0**-10)
    assert np.isinf(xla[1]).sum() > 128 and np.isfinite(a[1].astype(np.float64) / np.exp(b[1].astype(np.float64))).all()


@pytest.mark.parametrize("t", list(TYPES))
def test_xla_cpus_log_of_a_power_as_a_product_is_consistent(t):
    """Measured at 2,104 (2,107) of 4,096 f16 (f32) elements on normal inputs non-finite in the shadow where XLA:CPU's
    are finite, and f16 3 past their bounds (2.2x): XLA's HandleLog makes log(pow(a, b)) b * log(|a|) (a select of 0
    where b is 0): finite where pow of a negative a is NaN (any value goes there: it is not the module's answer),
    and log's rounding scaled by b. Row 1: a near 0 or 1, b up to 100 (pow out of f16's range); row 2: pow out of
    f64's (the shadow's log infinite, XLA:CPU's finite: any value goes there too)."""
    dtype = TYPES[t]
    text = f"""HloModule m
ENTRY e {{ a = {t}[3,512] parameter(0)  b = {t}[3,512] parameter(1)  s = {t}[3,512] power(a, b)
  ROOT r = {t}[3,512] log(s) }}"""
    r = np.random.default_rng(9)
    a, b = r.standard_normal((3, 512)) * 2, r.standard_normal((3, 512)) * 2
    a[1], b[1] = r.uniform(0.01, 3, 512), r.uniform(-100, 100, 512)
    a[2], b[2] = r.uniform(10, 100, 512), r.uniform(1000, 3000, 512) * r.choice([-1, 1], 512)
    b[0, :8] = 0  # (the select's 0)
    a, b = a.astype(dtype), b.astype(dtype)
    with np.errstate(all="ignore"):
        ell = rounded(np.log(np.abs(a.astype(np.float64))).astype(np.float32), dtype)  # (log in f32: f16's too)
        emulated = np.where(b == 0, dtype(0), rounded(ell.astype(np.float64) * b.astype(np.float64), dtype))
    planted_at = int(np.argmax(np.where(a[0] > 0, np.abs(b[0].astype(np.float64)), 0)))
    xla = _matches_and_judged(text, [a, b], emulated, planted_at, rtol=4 * float(np.finfo(dtype).eps))
    assert np.isfinite(xla).all() and (a[0] < 0).sum() > 200
