"""May-be-non-finite marks (tools/bound_overflow.py): the verdict accepts a non-finite element where an order or a
rounding the device's arithmetic allows can make one of its kind, and only there (docs/verdicts.md "Values an
order may make non-finite"). The devices' results are emulated in numpy from their documented rules; the limits
from IEEE 754's rounding (binary16: the largest finite 65504, its ulp 32: from 65520 up a value rounds to inf)."""

from __future__ import annotations

import numpy as np

import hloexec
from hloexec.tools.bound_overflow import DROPPED_NAN, NAN, NEG_INF, POS_INF, range_marks, rounding_limit
from hloexec.tools.numerics import judge_run
from hloexec.tools.shadow_runs import shadow_run

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


# 4 partitions, each a row of x: its f16 sum (XLA:CPU's: every step rounded to f16), all-gathered, add and max
# all-reduced; and y's one element per device, add all-reduced (f16: its partial sums travel in f16).
SPMD = """HloModule spmd_marks, num_partitions=4
add { a = f16[] parameter(0)  b = f16[] parameter(1)  ROOT s = f16[] add(a, b) }
max { a = f16[] parameter(0)  b = f16[] parameter(1)  ROOT m = f16[] maximum(a, b) }
ENTRY e {
  x = f16[1,8] parameter(0), sharding={devices=[4,1]0,1,2,3}
  y = f16[1] parameter(1), sharding={devices=[4]0,1,2,3}
  z = f16[] constant(0)
  s = f16[1] reduce(x, z), dimensions={1}, to_apply=add
  g = f16[4] all-gather(s), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, dimensions={0}
  r = f16[1] all-reduce(s), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  m = f16[1] all-reduce(s), channel_id=3, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=max
  u = f16[1] all-reduce(y), channel_id=4, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  ROOT out = (f16[4], f16[1], f16[1], f16[1]) tuple(g, r, m, u), sharding={{replicated}, {replicated}, {replicated}, {replicated}}
}"""
ROWS = np.array(
    [
        [1, 2, 3, 4, 5, 6, 7, 8],
        [40000, 40000, -20000, -20000, 0, 0, 0, 0],  # (exact 40,000; index order: 80,000 is +inf in f16)
        [-1, 2, -3, 4, -5, 6, -7, 8],
        [0.5, 0.25, 1, 2, 4, 8, 16, 32],
    ],
    np.float16,
)
Y = TERMS  # (one per device: the all-reduce's exact sum 0; 80,000 past f16's range in some orders, either way)


def _spmd_verdict(candidates, text=SPMD, inputs=(ROWS, Y), devices=("xla-cpu",)):
    import hloexec.spmd as spmd
    from hloexec.tools.numerics import Runner

    exe = hloexec.load(text)
    per_device = spmd.split_inputs(exe.module, list(inputs), 4)
    runner = Runner({"partitions": 4, "replicas": 1, "report": lambda message: None})
    return judge_run(exe, per_device, candidates, runner, devices=list(devices))


def _xla_cpus_outputs(ring_start: int = 0) -> list:
    """Every device's outputs as XLA:CPU's arithmetic makes them (f16 steps; an all-reduce's sum in group order
    from device `ring_start`): one participant's +inf reaches every participant's all-gather and all-reduces."""
    sums = np.array([_f16_sum(row, range(8)) for row in ROWS])
    order = [(ring_start + k) % 4 for k in range(4)]
    return [sums, np.array([_f16_sum(sums, order)]), np.array([sums.max()]), np.array([_f16_sum(Y, order)])]


def test_marks_travel_with_the_participant_each_element_comes_from():
    """Device 1's f16 row sum may be +inf (its positive parts, 80,000, pass f16's range; its negative ones do not):
    the all-gather carries that mark to element 1 on every device, and the add and max all-reduces carry it to
    their results; the all-reduce of y (40,000 twice, -40,000 twice: exact 0) may overflow either way in the
    group's orders (from device 0 +inf, from device 2 -inf, a tree NaN). XLA:CPU's results emulated in numpy f16:
    consistent (before: the marks stayed on device 1, and an all-reduce's own sums were never marked: every one
    flagged). Where nothing may overflow a non-finite element is still caught: a NaN in device 0's sum, -inf or
    NaN where only +inf may come, a NaN in the max all-reduce."""
    device = _xla_cpus_outputs()
    assert np.isposinf(device[0][1]) and np.isposinf(device[1][0]) and np.isposinf(device[2][0])
    assert np.isposinf(device[3][0]) and np.isneginf(_xla_cpus_outputs(2)[3][0])
    with np.errstate(invalid="ignore"):
        tree = np.float16(_f16_sum(Y, [0, 1]) + _f16_sum(Y, [2, 3]))
    assert np.isnan(tree)
    planted = {}
    for name, (out, at, value) in {
        "NaN in device 0's sum": (0, 0, np.nan),
        "-inf in device 1's": (0, 1, -np.inf),
        "NaN in device 1's": (0, 1, np.nan),
        "NaN in the add all-reduce": (1, 0, np.nan),
        "NaN in the max all-reduce": (2, 0, np.nan),
    }.items():
        planted[name] = [o.copy() for o in device]
        planted[name][out][at] = value
    rings = {"from device 0": device, "from device 2": _xla_cpus_outputs(2)}
    rings["a tree"] = [*device[:3], np.array([tree])]
    verdict, run = _spmd_verdict({**rings, **planted})
    for name in rings:
        assert verdict.consistent(name), name
    for name in planted:
        assert not verdict.consistent(name), name
    marks = run.bounds["xla-cpu"].nonfinite
    assert marks[0].tolist() == [0, POS_INF, 0, 0] and marks[1] == POS_INF and marks[2] == POS_INF
    assert marks[3] == POS_INF | NEG_INF | NAN


# each device's f32 rows' max (4,096 elements: XLA:CPU gives it to YNNPACK, which ignores NaN terms), all-gathered
# and add all-reduced
DROPPING = """HloModule spmd_dropped, num_partitions=4
add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
max { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT m = f32[] maximum(a, b) }
ENTRY e {
  x = f32[2,2048] parameter(0), sharding={devices=[4,1]0,1,2,3}
  z = f32[] constant(-inf)
  m = f32[2] reduce(x, z), dimensions={1}, to_apply=max
  g = f32[8] all-gather(m), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, dimensions={0}
  r = f32[2] all-reduce(m), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  ROOT out = (f32[8], f32[2]) tuple(g, r), sharding={{replicated}, {replicated}}
}"""


def test_a_nan_a_participants_max_reduce_drops_may_be_any_value_on_every_participant():
    """Device 1's first row holds a NaN: XLA:CPU's max over its 4,096 elements ignores it (the xla-cpu profile's
    nan_ignoring_reductions; emulated as numpy's fmax, IEEE's maxNum), so every device's all-gathered element 2
    and add all-reduced element 0 are finite where the shadow's are NaN: consistent under XLA:CPU's arithmetic,
    not under the reference's (HLO's maximum propagates NaN); a NaN planted where the shadow is finite is caught."""
    x = np.random.default_rng(0).standard_normal((8, 2048)).astype(np.float32)
    x[2, 100] = np.nan
    maxima = np.fmax.reduce(x, axis=1, initial=-np.inf).astype(np.float32)
    summed = maxima.reshape(4, 2).sum(axis=0, dtype=np.float32)  # (f32 sums in group order: within the bound)
    device = [maxima, summed]
    planted = [maxima.copy(), summed]
    planted[0][3] = np.nan
    verdict, run = _spmd_verdict({"XLA:CPU's": device, "planted": planted}, DROPPING, (x,), ("xla-cpu", "reference"))
    assert verdict.by_device["xla-cpu"].consistent("XLA:CPU's")
    assert not verdict.by_device["reference"].consistent("XLA:CPU's")
    assert not verdict.by_device["xla-cpu"].consistent("planted")
    marks = run.bounds["xla-cpu"].nonfinite
    assert (marks[0] & DROPPED_NAN).tolist() == [0, 0, DROPPED_NAN, 0, 0, 0, 0, 0] and marks[1][0] & DROPPED_NAN


DOT_OF_A_PRODUCT = """HloModule m
ENTRY e { a = f32[4,8] parameter(0)  c = f32[4,8] parameter(1)  b = f32[8,3] parameter(2)
  p = f32[4,8] multiply(a, c)
  ROOT d = f32[4,3] dot(p, b), lhs_contracting_dims={1}, rhs_contracting_dims={0} }"""


def _dot_of_a_product(b, monkeypatch) -> tuple[np.ndarray, int]:
    """DOT_OF_A_PRODUCT's marks (the reference's) and how many kernels dot_marks evaluated: a's and c's largest
    elements (1e19) at different places, so p's reach estimated from its operands' (their product, 1e38) is
    far past its own (1e19), and 8 of them past f32's range."""
    from hloexec.tools import bounds as bounds_module

    a, c = np.ones((4, 8), np.float32), np.ones((4, 8), np.float32)
    a[0, 0], c[0, 1] = 1e19, 1e19
    inside, evaluated = [False], [0]
    marks, kernel = bounds_module.dot_marks, bounds_module.ErrorBounds._kernel

    def counted_marks(*args):
        inside[0] = True
        try:
            marks(*args)
        finally:
            inside[0] = False

    def counted_kernel(self, inst):
        evaluated[0] += inside[0]
        return kernel(self, inst)

    monkeypatch.setattr(bounds_module, "dot_marks", counted_marks)
    monkeypatch.setattr(bounds_module.ErrorBounds, "_kernel", counted_kernel)
    exe = hloexec.load(DOT_OF_A_PRODUCT)
    run = shadow_run(exe, [a, c, b], devices=[exe.options.device])
    return run.bounds[exe.options.device.name].nonfinite[0], evaluated[0]


def test_a_dot_whose_estimated_reach_passes_f32s_range_reads_its_operands_own_first(monkeypatch):
    """Kept reaches are estimates (a product's: its operands' multiplied): where K of them pass f32's range but the
    operands' own do not, no float64 dot of |A| + e and |B| + e is evaluated and nothing is marked; where the
    operands' own do reach it, the dot is evaluated and marks every kind where |A| |B| does (numpy's float64)."""
    b = np.ones((8, 3), np.float32)
    marks, evaluated = _dot_of_a_product(b, monkeypatch)
    assert evaluated == 0 and not marks.any()
    b[0, 2] = 1e20  # (p[0, 0] = 1e19 times it: 1e39, past f32's 3.4e38 in column 2 of row 0 only)
    marks, evaluated = _dot_of_a_product(b, monkeypatch)
    p = np.ones((4, 8)) * np.array([[1e19, 1e19, 1, 1, 1, 1, 1, 1]] + [[1] * 8] * 3)
    expected = (p @ b.astype(np.float64)) >= rounding_limit(np.float32)[0]
    assert evaluated == 1 and expected.sum() == 1
    assert ((marks == NAN | POS_INF | NEG_INF) == expected).all()
