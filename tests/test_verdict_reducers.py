"""Reduces and reduce-windows whose reducer no single-op rule knows (tools/bound_reducers.py: the reducer folded
step by step on whole arrays): jax's `lax.cumlogsumexp` (a logaddexp with a select for infinities), a complex
`jnp.max` / `jnp.min` (real parts, then imaginary ones), a Kahan sum and an online softmax written with
`lax.reduce` over tuples. On main every one was unbounded (not judged: any value passed). Each: XLA:CPU's result
and numpy's emulations (the reducer's ops each rounded to the program's type, folded in order and in a blocked or
pairwise order a device may take) are consistent, and an element 3x its bound off is caught."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hloexec
from hloexec.tools.numerics import judge_run
from hloexec.tools.shadow_runs import xla_cpu_arithmetic
from hloexec.tools.xla_cpu import run_on_xla_cpu

_TYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}

# jax 0.10.2's lowering of lax.cumlogsumexp((x * y).astype(t), axis=1)
CUMLOGSUMEXP = """HloModule cumlogsumexp
region {{
  a = {t}[] parameter(0)  b = {t}[] parameter(1)
  d = {t}[] subtract(a, b)  unordered = pred[] compare(d, d), direction=NE  both = {t}[] add(a, b)
  m = {t}[] maximum(a, b)  ad = {t}[] abs(d)  nd = {t}[] negate(ad)  e = {t}[] exponential(nd)
  l = {t}[] log-plus-one(e)  lse = {t}[] add(m, l)
  ROOT s = {t}[] select(unordered, both, lse)
}}
ENTRY e {{
  x = f32[4,32] parameter(0)  y = f32[4,32] parameter(1)  p = f32[4,32] multiply(x, y)
  c = {t}[4,32] convert(p)  init = {t}[] constant(-inf)
  ROOT r = {t}[4,32] reduce-window(c, init), window={{size=1x32 pad=0_0x31_0}}, to_apply=region
}}"""


def _logaddexp(a, b):
    """jax's reducer in numpy, every op rounded to the arrays' type."""
    d = a - b
    return np.where(d != d, a + b, np.maximum(a, b) + np.log1p(np.exp(-np.abs(d))))


def _scan(m, combine, block: int):
    """The inclusive scan of `m`'s rows by `combine`: in order (one block of them all), or in blocks of `block` (each block's
    running values, then the blocks' totals carried: a two-level scan's order)."""
    out = np.empty_like(m)
    for start in range(0, m.shape[1], block):
        acc = m[:, start]
        out[:, start] = acc
        for j in range(start + 1, min(start + block, m.shape[1])):
            acc = combine(acc, m[:, j])
            out[:, j] = acc
    for start in range(block, m.shape[1], block):
        carry = out[:, start - 1]
        out[:, start : start + block] = combine(carry[:, None], out[:, start : start + block])
    return out


def _verdicts(verdict, index=0) -> dict:
    return {c.name: (c.consistent, c.bound_violations, c.unbounded) for c in verdict.outputs[index].candidates}


def _caught(exe, inputs, run, verdict, places, index=0) -> None:
    """An element of output `index` moved 3x its bound off (2x after the type's rounding) at each of `places` is
    caught, alone (one candidate a place)."""
    bound = run.bounds[verdict.device].bounds[index]
    candidates = {}
    for at in places:
        far = [np.asarray(o).copy() for o in run.shadow]
        far[index][at] += 3 * bound[at]
        far = [f.astype(np.asarray(o).dtype) for f, o in zip(far, run.outputs)]
        assert abs(complex(far[index][at]) - complex(run.shadow[index][at])) > 2 * bound[at], at
        candidates[str(at)] = far
    got = _verdicts(judge_run(exe, inputs, candidates)[0], index)
    assert all(got[str(at)][:2] == (False, 1) for at in places), got


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_a_cumlogsumexp_is_bounded_by_its_reducers_steps(dtype):
    """lax.cumlogsumexp's reduce-window (a logaddexp guarded by a select, -inf its init and padding): XLA:CPU's
    result, numpy's in order and numpy's two-level scan (blocks of 8) are consistent; the bound stays within a few
    ulps of the value; an element 3x its bound off is caught at the first, a middle and the last window."""
    text, t = CUMLOGSUMEXP.format(t=dtype), _TYPES[dtype]
    r = np.random.default_rng(11)
    x, y = (r.standard_normal((4, 32)).astype(np.float32) for _ in range(2))
    m = (x * y).astype(t)
    [xla] = run_on_xla_cpu(text, [x, y])
    candidates = {"xla": [xla], "in order": [_scan(m, _logaddexp, 32)], "blocked": [_scan(m, _logaddexp, 8)]}
    exe = hloexec.load(text)
    verdict, run = judge_run(exe, [x, y], candidates, known={"xla": xla_cpu_arithmetic()})
    assert run.bounds[verdict.device].unbounded == {}
    got = _verdicts(verdict)
    assert all(got[n] == (True, 0, 0) for n in ("hloexec", *candidates)), got
    bound, exact = run.bounds[verdict.device].bounds[0], np.asarray(run.shadow[0])
    ulp = float(ml_dtypes.finfo(t).eps) * np.maximum(np.abs(exact), 1.0)
    assert np.all(np.isfinite(bound)) and np.median(bound / ulp) < 8, np.median(bound / ulp)
    _caught(exe, [x, y], run, verdict, [(0, 0), (2, 15), (3, 31)])


# jax's lowering of jnp.max(x * y, axis=1) of c64 values (and jnp.min: LT for GT)
COMPLEX_MAX = """HloModule cmax
region {{
  a = c64[] parameter(0)  ar = f32[] real(a)  b = c64[] parameter(1)  br = f32[] real(b)
  eq = pred[] compare(ar, br), direction=EQ  ai = f32[] imag(a)  bi = f32[] imag(b)
  by_imag = pred[] compare(ai, bi), direction={d}  by_real = pred[] compare(ar, br), direction={d}
  p = pred[] select(eq, by_imag, by_real)
  ROOT s = c64[] select(p, a, b)
}}
ENTRY e {{
  x = c64[16,64] parameter(0)  y = c64[16,64] parameter(1)  m = c64[16,64] multiply(x, y)
  init = c64[] constant(({init}, 0))
  ROOT r = c64[16] reduce(m, init), dimensions={{1}}, to_apply=region
}}"""


@pytest.mark.parametrize("direction", ["GT", "LT"])
def test_a_complex_max_or_min_is_bounded_by_its_comparisons(direction):
    """jnp.max / jnp.min of complex products (ordered by real part, then imaginary part): XLA:CPU's result and
    numpy's (the complex64 products' lexicographic extreme) are consistent; the row's extreme keeps its product's
    bound where the real parts are apart, and where two real parts lie within their bounds of each other either
    one is allowed (a device whose rounding orders them the other way: a tie as computed); 3x the bound off is caught."""
    text = COMPLEX_MAX.format(d=direction, init="-inf" if direction == "GT" else "inf")
    r = np.random.default_rng(12)
    x, y = ((r.standard_normal((16, 64)) + 1j * r.standard_normal((16, 64))).astype(np.complex64) for _ in range(2))
    m = x * y
    pick = np.argmax if direction == "GT" else np.argmin
    extreme = pick(m.real, axis=1)
    # row 0: a second element (times 1: exact) whose real part is the extreme's rounded product's: the exact real
    # parts' order is the extreme's product's rounding error's sign (a tie, as computed, that its imaginary part,
    # 3 further out, breaks)
    e = m[0, extreme[0]]
    x[0, 40], y[0, 40] = e + np.complex64(3j if direction == "GT" else -3j), 1
    m = x * y
    order = [np.lexsort((row.imag, row.real)) for row in m]
    numpy_ = np.array([row[o[-1] if direction == "GT" else o[0]] for row, o in zip(m, order)])
    [xla] = run_on_xla_cpu(text, [x, y])
    exe = hloexec.load(text)
    verdict, run = judge_run(exe, [x, y], {"xla": [xla], "numpy": [numpy_]})
    assert run.bounds[verdict.device].unbounded == {}
    got = _verdicts(verdict)
    assert all(got[n] == (True, 0, 0) for n in ("hloexec", "xla", "numpy")), got
    bound = run.bounds[verdict.device].bounds[0]
    assert np.all(np.isfinite(bound)) and np.median(bound / np.abs(run.shadow[0])) < 1e-6, bound
    other = numpy_.copy()  # (the near-tie's other element: rounding may order them either way)
    other[0] = m[0, 40] if numpy_[0] == m[0, extreme[0]] else m[0, extreme[0]]
    assert other[0] != numpy_[0]
    assert _verdicts(judge_run(exe, [x, y], {"other": [other]})[0])["other"] == (True, 0, 0)
    _caught(exe, [x, y], run, verdict, [(3,), (9,)])


# jax's lowering of a Kahan sum and an online softmax's (max, rescaled sum), lax.reduce over tuples of
# (m = (x * y).astype(t), its init), reducing dimension 1
TUPLE_REDUCE = """HloModule reduced
kahan {{
  sa = {t}[] parameter(0)  ca = {t}[] parameter(1)  sb = {t}[] parameter(2)  cb = {t}[] parameter(3)
  c = {t}[] add(ca, cb)  y = {t}[] subtract(sb, c)  s = {t}[] add(sa, y)  d = {t}[] subtract(s, sa)
  cc = {t}[] subtract(d, y)
  ROOT r = ({t}[], {t}[]) tuple(s, cc)
}}
online {{
  m1 = {t}[] parameter(0)  sa = {t}[] parameter(1)  m2 = {t}[] parameter(2)  sb = {t}[] parameter(3)
  m = {t}[] maximum(m1, m2)  d1 = {t}[] subtract(m1, m)  e1 = {t}[] exponential(d1)  w1 = {t}[] multiply(sa, e1)
  d2 = {t}[] subtract(m2, m)  e2 = {t}[] exponential(d2)  w2 = {t}[] multiply(sb, e2)  s = {t}[] add(w1, w2)
  ROOT r = ({t}[], {t}[]) tuple(m, s)
}}
ENTRY e {{
  x = f32[16,{n}] parameter(0)  y = f32[16,{n}] parameter(1)  p = f32[16,{n}] multiply(x, y)
  v = {t}[16,{n}] convert(p)  fill = {t}[] constant({fill})  w = {t}[16,{n}] broadcast(fill), dimensions={{}}
  i0 = {t}[] constant({i0})  i1 = {t}[] constant(0)
  ROOT r = ({t}[16], {t}[16]) reduce(v, w, i0, i1), dimensions={{1}}, to_apply={reducer}
}}"""
# reducer -> (the second input's fill, the first init)
_TUPLES = {"kahan": ("0", "0"), "online": ("1", "-inf")}


def _kahan(a, b):
    (s1, c1), (s2, c2) = a, b
    y = s2 - (c1 + c2)
    s = s1 + y
    return s, (s - s1) - y


def _online(a, b):
    (m1, s1), (m2, s2) = a, b
    m = np.maximum(m1, m2)
    return m, s1 * np.exp(m1 - m) + s2 * np.exp(m2 - m)


def _fold(pairs, combine, pairwise: bool):
    """`combine` folded over the last axis of `pairs` (two arrays): in order, or pairwise (a tree)."""
    a, b = pairs
    if not pairwise:
        acc = a[:, 0], b[:, 0]
        for j in range(1, a.shape[1]):
            acc = combine(acc, (a[:, j], b[:, j]))
        return list(acc)
    while a.shape[1] > 1:
        a, b = combine((a[:, 0::2], b[:, 0::2]), (a[:, 1::2], b[:, 1::2]))
    return [a[:, 0], b[:, 0]]


@pytest.mark.parametrize("reducer", sorted(_TUPLES))
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_a_reduce_whose_reducer_mixes_its_results_is_bounded_by_its_steps(reducer, dtype):
    """A Kahan sum ((sum, compensation)) and an online softmax ((max, rescaled sum)) over 64 terms a row: XLA:CPU's
    result and numpy's folds (in order, and pairwise: a tree a device may take for a reducer it takes as
    associative) are consistent; 3x an element's bound off is caught in the sum, the max and the rescaled sum."""
    fill, i0 = _TUPLES[reducer]
    n, t = 64, _TYPES[dtype]
    text = TUPLE_REDUCE.format(t=dtype, n=n, fill=fill, i0=i0, reducer=reducer)
    r = np.random.default_rng(13)
    x, y = (r.standard_normal((16, n)).astype(np.float32) for _ in range(2))
    m = (x * y).astype(t)
    pairs = m, np.full_like(m, float(fill))
    combine = _kahan if reducer == "kahan" else _online
    candidates = {
        "xla": run_on_xla_cpu(text, [x, y]),
        "in order": _fold(pairs, combine, False),
        "pairwise": _fold(pairs, combine, True),
    }
    exe = hloexec.load(text)
    verdict, run = judge_run(exe, [x, y], candidates, known={"xla": xla_cpu_arithmetic()})
    assert run.bounds[verdict.device].unbounded == {}
    for index in (0, 1):
        got = _verdicts(verdict, index)
        assert all(got[c] == (True, 0, 0) for c in ("hloexec", *candidates)), (index, got)
        assert np.all(np.isfinite(run.bounds[verdict.device].bounds[index]))
    for index in (0, 1) if reducer == "online" else (0,):  # (Kahan's compensation: exactly 0 is allowed its bound)
        _caught(exe, [x, y], run, verdict, [(4,), (11,)], index)


# ragged-dot (XLA's importer tests' forms, its lhs a computed value: tanh): a non-contracting ragged dim (MoE
# experts: rows in groups, each group's rows times its rhs slice; rows past the groups 0), a contracting one (one
# dot per group of k: a leading group dim), a batch one (a plain dot)
RAGGED_DOTS = {
    "non-contracting": (
        "f32[24,16]",
        "f32[3,16,8]",
        "f32[24,8]",
        "lhs_contracting_dims={1}, rhs_contracting_dims={1}, lhs_ragged_dims={0}, rhs_group_dims={0}",
    ),
    "contracting": (
        "f32[12,24]",
        "f32[24,8]",
        "f32[3,12,8]",
        "lhs_contracting_dims={1}, rhs_contracting_dims={0}, lhs_ragged_dims={1}",
    ),
    "batch": (
        "f32[3,12,16]",
        "f32[3,16,8]",
        "f32[3,12,8]",
        "lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}, "
        "lhs_ragged_dims={0}",
    ),
}


def _ragged_dot(mode, lhs, rhs, sizes, t):
    """numpy's ragged-dot by its definition (StableHLO's), a matmul per group: t's operands, products and sums in
    f32 (16-bit types accumulate in f32), the result rounded to t."""
    a, b = lhs.astype(np.float32), rhs.astype(np.float32)
    ends = np.cumsum(sizes)
    if mode == "non-contracting":
        out = np.zeros((a.shape[0], b.shape[2]), np.float32)
        for g, (s, e) in enumerate(zip(ends - sizes, ends)):
            out[s:e] = a[s:e] @ b[g]
    elif mode == "contracting":
        out = np.stack([a[:, s:e] @ b[s:e] for s, e in zip(ends - sizes, ends)])
    else:
        out = np.matmul(a, b)
    return out.astype(t)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("mode", sorted(RAGGED_DOTS))
def test_a_ragged_dot_is_bounded_as_the_dot_it_is_group_by_group(mode, dtype):
    """A ragged-dot (XLA:CPU cannot run it) is bounded as the dot each group computes: numpy's per-group matmul
    (f32 accumulation) is consistent, rows past the groups are exact zeros, and an element 3x its bound off is
    caught in the first and the last group (on main: unbounded, any value passed)."""
    lhs_t, rhs_t, out_t, dims = (s.replace("f32", dtype) for s in RAGGED_DOTS[mode])
    text = f"""HloModule ragged
ENTRY e {{ a = {lhs_t} parameter(0)  b = {rhs_t} parameter(1)  g = s64[3] parameter(2)
          t = {lhs_t} tanh(a)
          ROOT r = {out_t} ragged-dot(t, b, g), {dims} }}"""
    t = _TYPES[dtype]
    r = np.random.default_rng(14)
    shapes = [tuple(int(n) for n in s[s.index("[") + 1 : -1].split(",")) for s in (lhs_t, rhs_t)]
    a, b = (r.standard_normal(s).astype(t) for s in shapes)
    sizes = np.array([7, 0, 9] if mode == "non-contracting" else [5, 10, 9], np.int64)
    numpy_ = _ragged_dot(mode, np.tanh(a.astype(np.float32)).astype(t), b, sizes, t)
    exe = hloexec.load(text)
    verdict, run = judge_run(exe, [a, b, sizes], {"numpy": [numpy_]})
    assert run.bounds[verdict.device].unbounded == {}
    got = _verdicts(verdict)
    assert got["hloexec"] == (True, 0, 0) and got["numpy"] == (True, 0, 0), got
    bound = run.bounds[verdict.device].bounds[0]
    if mode == "non-contracting":
        assert np.all(bound[16:] < 1e-30) and np.all(run.shadow[0][16:] == 0)  # (past the groups: exact zeros)
    places = {"non-contracting": [(0, 0), (15, 7)], "contracting": [(0, 0, 0), (2, 11, 7)], "batch": [(0, 0, 0)]}
    _caught(exe, [a, b, sizes], run, verdict, places[mode])
