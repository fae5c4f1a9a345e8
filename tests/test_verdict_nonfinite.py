"""May-be-non-finite marks (tools/bound_overflow.py): the verdict accepts a non-finite element where an order or a
rounding the device's arithmetic allows can make one of its kind, and only there (docs/verdicts.md "Values an
order may make non-finite"). The devices' results are emulated in numpy from their documented rules; the limits
from IEEE 754's rounding (binary16: the largest finite 65504, its ulp 32: from 65520 up a value rounds to inf)."""

from __future__ import annotations

import numpy as np

import hloexec
from hloexec.tools.bound_overflow import NAN, NEG_INF, POS_INF, range_marks, rounding_limit
from hloexec.tools.numerics import judge_run

SUM = """HloModule m
add { a = f16[] parameter(0)  b = f16[] parameter(1)  ROOT s = f16[] add(a, b) }
ENTRY e { x = f16[4] parameter(0)  z = f16[] constant(0)
  ROOT s = f16[] reduce(x, z), dimensions={0}, to_apply=add }"""
TERMS = np.array([40000, 40000, -40000, -40000], np.float16)  # (exact sum 0; 80,000 past f16's range either way)


def _f16_sum(terms, order) -> np.float16:
    """An f16 sum with every step rounded to f16 (numpy's f16 add: IEEE's), terms in `order`."""
    acc = np.float16(0)
    with np.errstate(over="ignore", invalid="ignore"):
        for k in order:
            acc = np.float16(acc + terms[k])
    return acc


def test_the_rounding_limit_is_where_ieee_rounds_to_infinity():
    assert rounding_limit(np.float16)[0] == 65520.0
    with np.errstate(over="ignore"):
        assert np.float16(np.float32(65519.99)) == 65504 and np.isinf(np.float16(np.float32(65520.0)))
    x = np.array([65510.0, -65515.0, 100.0, -65500.0])
    marks = range_marks(x, np.array([10.0, 4.0, 1.0, np.inf]), np.float16)
    assert marks.tolist() == [POS_INF, 0, 0, 0]  # (no rule, an infinite bound: nothing said)
    assert not range_marks(x[2:3], np.array([1.0]), np.float16).any()


def test_a_nan_where_the_devices_sum_cannot_overflow_is_caught_though_the_baseline_overflows():
    """Under the reference arithmetic f16 sums accumulate in f32: 80,000 is finite, the sum 0; the baseline (f16
    steps in index order) is +inf. Before, a NaN was accepted wherever the baseline was non-finite."""
    exe = hloexec.load(SUM)
    assert np.isinf(_f16_sum(TERMS, range(4)))
    f32_sum = np.float16(np.add.reduce(TERMS.astype(np.float32)))
    verdict, run = judge_run(exe, [TERMS], {"f32 sum": [f32_sum], "NaN": [np.array(np.nan, np.float16)]})
    assert not run.bounds[verdict.device].nonfinite[0].any()
    assert verdict.consistent("f32 sum")
    assert not verdict.consistent("NaN")
    assert any("non-finite" in r for o in verdict.outputs for c in o.candidates if c.name == "NaN" for r in c.reasons)


def test_an_f16_sum_rounded_every_step_may_overflow_either_way_in_its_orders():
    """Every step rounded to f16 (XLA:CPU's 16-bit sums): index order +inf, reversed -inf, pairs of the two infinities NaN."""
    exe = hloexec.load(SUM)
    with np.errstate(invalid="ignore"):
        pairs = np.float16(_f16_sum(TERMS, [0, 1]) + _f16_sum(TERMS, [2, 3]))
    orders = {"index": [_f16_sum(TERMS, range(4))], "reversed": [_f16_sum(TERMS, range(3, -1, -1))], "pairs": [pairs]}
    assert np.isposinf(orders["index"][0]) and np.isneginf(orders["reversed"][0]) and np.isnan(pairs)
    verdict, run = judge_run(exe, [TERMS], orders, devices=["xla-cpu"])
    assert run.bounds["xla-cpu"].nonfinite[0] == POS_INF | NEG_INF | NAN
    for name in orders:
        assert verdict.consistent(name), name


def test_a_division_by_an_interval_holding_zero_may_be_infinite_not_nan():
    """f16(1 + 2^-20) - f16(1) is 0 in f16 (the exact difference 2^-20 lies within the operands' rounding): a
    device divides 2^-14 by 0, +inf; 2^-14 / +-0 is never NaN. Before, any non-finite kind was accepted where the
    baseline's (+inf) was non-finite."""
    text = """HloModule m
ENTRY e { a = f32[2] parameter(0)  b = f32[2] parameter(1)
  ha = f16[2] convert(a)  hb = f16[2] convert(b)  d = f16[2] subtract(ha, hb)
  c = f16[] constant(6.1035e-05)  cs = f16[2] broadcast(c), dimensions={}
  ROOT q = f16[2] divide(cs, d) }"""
    a = np.array([1 + 2.0**-20, 3.0], np.float32)
    b = np.array([1.0, 1.0], np.float32)
    with np.errstate(divide="ignore"):
        device = np.float16(6.1035e-05) / (a.astype(np.float16) - b.astype(np.float16))
    assert np.isposinf(device[0]) and np.isfinite(device[1])
    planted = device.copy()
    planted[0] = np.nan
    verdict, run = judge_run(hloexec.load(text), [a, b], {"f16": [device], "NaN": [planted]})
    assert run.bounds[verdict.device].nonfinite[0].tolist() == [POS_INF | NEG_INF, 0]
    assert verdict.consistent("f16")
    assert not verdict.consistent("NaN")


def test_a_finite_program_has_no_marks_and_a_planted_nan_is_caught():
    """An f16 softmax-like row program: nothing near f16's range, nothing marked; a NaN planted in hloexec's own
    result is caught (where nothing could overflow), as an infinity is."""
    text = """HloModule m
add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
ENTRY e { x = f16[8,256] parameter(0)  e = f16[8,256] exponential(x)  w = f32[8,256] convert(e)
  z = f32[] constant(0)  s = f32[8] reduce(w, z), dimensions={1}, to_apply=add
  sb = f32[8,256] broadcast(s), dimensions={0}  q = f32[8,256] divide(w, sb)
  ROOT t = f16[8,256] convert(q) }"""
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float16)
    exe = hloexec.load(text)
    own = exe.run(x)
    out = np.array(own[0] if isinstance(own, (tuple, list)) else own)
    nan, inf = out.copy(), out.copy()
    nan[3, 17], inf[5, 2] = np.nan, np.inf
    verdict, run = judge_run(exe, [x], {"NaN": [nan], "inf": [inf]})
    assert not run.bounds[verdict.device].nonfinite[0].any()
    assert verdict.consistent("hloexec")
    assert not verdict.consistent("NaN") and not verdict.consistent("inf")


def test_marks_are_carried_through_a_broadcast_a_dot_and_an_elementwise_op():
    """A sum that may be +inf, -inf or NaN (XLA:CPU's arithmetic), broadcast, contracted with finite weights (inf * w,
    inf - inf: every kind), then exp: exp(+inf) = inf and exp(NaN) = NaN may be, -inf's exp(-inf) = 0 is finite,
    1 from the exact exp(0): the bound reaches it."""
    text = """HloModule m
add { a = f16[] parameter(0)  b = f16[] parameter(1)  ROOT s = f16[] add(a, b) }
ENTRY e { x = f16[64] parameter(0)  w = f16[8,2] parameter(1)  z = f16[] constant(0)
  s = f16[] reduce(x, z), dimensions={0}, to_apply=add
  b = f16[4,8] broadcast(s), dimensions={}
  d = f16[4,2] dot(b, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT e = f16[4,2] exponential(d) }"""
    x = np.concatenate([np.full(32, 3000.0), np.full(32, -3000.0)]).astype(np.float16)
    w = np.full((8, 2), 0.5, np.float16)
    verdict, run = judge_run(
        hloexec.load(text), [x, w], {"NaN": [np.full((4, 2), np.nan, np.float16)]}, devices=["xla-cpu"]
    )
    bounds = run.bounds["xla-cpu"]
    assert (bounds.nonfinite[0] == POS_INF | NAN).all()
    assert (bounds.bounds[0] >= 1.0).all()
    assert verdict.consistent("NaN")
