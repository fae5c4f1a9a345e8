"""Error bounds of complex programs (tools/bound_complex.py): a complex element's bound is on the modulus of its
error. A c64 and a c128 program shaped like a conjugate-gradient step (dots, a conjugate as jax writes it:
complex(real(z), -imag(z)), a divide by a dot, a multiply, add, abs and a max of it, exp, sqrt, a sum) had no rule
(the bounds' compiled rules failed on complex operands: an internal error); now XLA:CPU's result and numpy's in the
program's type are consistent, and one element changed by 1% of the output's scale, or by 4x its bound, is
caught in every output."""

from __future__ import annotations

import os

import numpy as np
import pytest

import hloexec
import hloexec.spmd as spmd
from hloexec.tools.bounds import ErrorBounds
from hloexec.tools.numerics import Runner
from hloexec.tools.compare import ulp_at
from hloexec.tools.shadow_runs import judge_run
from hloexec.tools.xla_cpu import run_on_xla_cpu

CG_STEP = """HloModule cg
max_{r} {{ x = {r}[] parameter(0)  y = {r}[] parameter(1)  ROOT m = {r}[] maximum(x, y) }}
add_{c} {{ x = {c}[] parameter(0)  y = {c}[] parameter(1)  ROOT s = {c}[] add(x, y) }}
ENTRY e {{
  a = {c}[16,16] parameter(0)  b = {c}[16] parameter(1)
  ax = {c}[16] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  r = {c}[16] subtract(b, ax)
  re = {r}[16] real(r)  im = {r}[16] imag(r)  nim = {r}[16] negate(im)
  cj = {c}[16] complex(re, nim)
  rr = {c}[] dot(cj, r), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}
  rb = {c}[16] broadcast(rr), dimensions={{}}
  q = {c}[16] divide(r, rb)
  m = {c}[16] multiply(q, ax)
  s = {c}[16] add(m, b)
  ab = {r}[16] abs(s)  zero = {r}[] constant(0)
  mx = {r}[] reduce(ab, zero), dimensions={{0}}, to_apply=max_{r}
  ex = {c}[16] exponential(q)
  sq = {c}[16] sqrt(s)
  czero = {c}[] constant((0, 0))
  sm = {c}[] reduce(s, czero), dimensions={{0}}, to_apply=add_{c}
  ROOT t = ({c}[16], {r}[], {c}[16], {c}[16], {c}[]) tuple(s, mx, ex, sq, sm)
}}
"""
TYPES = {"c64": (np.complex64, "f32"), "c128": (np.complex128, "f64")}


def _cg_step(a, b) -> list:
    """The module's outputs in numpy, every op in the inputs' complex type (a device computing in it)."""
    ax = a @ b
    r = b - ax
    q = r / np.dot(np.conj(r), r)
    s = q * ax + b
    return [s, np.max(np.abs(s)), np.exp(q), np.sqrt(s), np.sum(s)]


@pytest.mark.parametrize("ctype", sorted(TYPES))
def test_a_complex_program_is_bounded_and_a_changed_element_is_caught(ctype):
    dtype, rtype = TYPES[ctype]
    text = CG_STEP.format(c=ctype, r=rtype)
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((16, 16)) + 1j * rng.standard_normal((16, 16))).astype(dtype)
    b = (rng.standard_normal(16) + 1j * rng.standard_normal(16)).astype(dtype)
    xla = run_on_xla_cpu(text, [a, b])
    emulated = [np.asarray(v, o.dtype) for v, o in zip(_cg_step(a, b), xla)]
    exe = hloexec.load(text)
    candidates = {"xla": xla, "numpy": emulated}
    _, run = judge_run(exe, [a, b], {})
    bounds = run.bounds[exe.options.device.name].bounds
    for k, out in enumerate(xla):
        flat = np.abs(np.ravel(out))
        big = int(np.argmax(flat))
        scale = float(flat.max())
        bumped = [o.copy() for o in xla]
        bumped[k].reshape(-1)[big] += np.asarray(0.01 * scale, out.dtype)  # (1% of the output's scale)
        candidates[f"1% of output {k}"] = bumped
        some = min(3, out.size - 1)  # (an element of moderate size)
        bound = max(float(np.ravel(bounds[k])[some]), 0.5 * float(ulp_at(flat[some], out.dtype)))
        assert np.isfinite(bound) and bound < 1e-4 * scale, (k, bound)
        far = [o.copy() for o in xla]
        far[k].reshape(-1)[some] += np.asarray(4 * bound, out.dtype)
        candidates[f"4x bound of output {k}"] = far
    verdict, run = judge_run(exe, [a, b], candidates)
    assert run.bounds[exe.options.device.name].unbounded == {}
    for k, output in enumerate(verdict.outputs):
        got = {c.name: (c.consistent, c.bound_violations, c.unbounded) for c in output.candidates}
        for name in ("hloexec", "xla", "numpy"):
            assert got[name] == (True, 0, 0), (k, name, got)
        for j in range(len(xla)):
            for change in ("1%", "4x bound"):
                expected = (False, 1, 0) if j == k else (True, 0, 0)
                assert got[f"{change} of output {j}"] == expected, (k, j, change, got)


def test_a_c64_dot_accumulates_in_f32():
    """A c64 dot's parts are f32 sums (of 2K products each): numpy's complex64 matrix-vector product of 512 terms
    is consistent (its accumulation was taken for f64's, c64's significand unknown: its bound 2^-29 of that, and
    a correct result failed), and a change 4x an element's bound is caught."""
    text = """HloModule d
ENTRY e { a = c64[8,512] parameter(0)  b = c64[512] parameter(1)
          ROOT d = c64[8] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0} }"""
    rng = np.random.default_rng(2)
    a = (rng.standard_normal((8, 512)) + 1j * rng.standard_normal((8, 512))).astype(np.complex64)
    b = (rng.standard_normal(512) + 1j * rng.standard_normal(512)).astype(np.complex64)
    correct = a @ b
    exe = hloexec.load(text)
    _, run = judge_run(exe, [a, b], {})
    bound = float(run.bounds[exe.options.device.name].bounds[0][5])
    far = correct.copy()
    far[5] += np.complex64(4 * bound)
    verdict, _ = judge_run(exe, [a, b], {"numpy": [correct], "far": [far]})
    got = {c.name: (c.consistent, c.bound_violations, c.unbounded) for c in verdict.outputs[0].candidates}
    assert got["numpy"] == (True, 0, 0) and got["far"] == (False, 1, 0), got


CG_FILE = "corpus/external/files/jax_cpu_lineax_cg_c128_opt.hlo"


@pytest.mark.skipif(not os.environ.get("HLOEXEC_SHARED"), reason="needs HLOEXEC_SHARED (the corpus)")
def test_the_lineax_conjugate_gradient_file_runs_to_a_verdict():
    """lineax's c128 conjugate-gradient solve (two while loops of complex dots, divides, conjugates) runs to a
    verdict with every instruction bounded (it failed inside the bounds: an internal error) and its own result
    consistent. Its values have at most 9 elements: they were never calibrated, and through the loops' first-order
    propagation the second solve's bounds grew to 2e23 x its outputs' scale (the first's 0.5%); each element cut
    by its own samples (one draw's margin), both are ~2e-12 of the scale (the loops correct their roundings)."""
    exe = hloexec.load(open(os.path.join(os.environ["HLOEXEC_SHARED"], CG_FILE)).read())
    inputs = spmd.random_global_inputs(exe.module, 0)
    verdict, run = judge_run(exe, inputs, {})
    bounds = run.bounds[exe.options.device.name]
    assert bounds.unbounded == {}
    for bound, exact in zip(bounds.bounds, run.shadow):
        assert np.all(bound < 1e-9 * np.max(np.abs(exact)))      # (main: 5e-3 and 3e23 x the scale)
    assert all(c.consistent for o in verdict.outputs for c in o.candidates)


ELEMENTWISE = ["multiply", "divide", "add", "subtract", "exponential", "sqrt", "log", "tanh", "abs", "rsqrt", "power"]


@pytest.mark.parametrize("op", ELEMENTWISE)
def test_xla_cpus_complex_elementwise_results_are_within_their_bounds(op):
    """Each complex op's rule on a rounded operand (a product of c64 inputs over six orders of magnitude; the
    transcendentals' near the unit circle): XLA:CPU's c64 result is consistent on 1024 elements, so is numpy's
    (complex64 arithmetic), and one element changed by 1% of its own modulus is caught."""
    binary = op in ("multiply", "divide", "add", "subtract", "power")
    result = "f32" if op == "abs" else "c64"
    text = f"""HloModule o
ENTRY e {{ x = c64[1024] parameter(0)  y = c64[1024] parameter(1)  w = c64[1024] parameter(2)
          a = c64[1024] multiply(x, w)
          ROOT t = {result}[1024] {op}(a{", y" if binary else ""}) }}"""
    rng = np.random.default_rng(1)
    x, y, w = (
        (rng.standard_normal(1024) + 1j * rng.standard_normal(1024)) * np.exp(rng.uniform(-3, 3, 1024))
        for _ in range(3)
    )
    if op in ("exponential", "tanh", "power"):  # (moduli near 1: exp's and tanh's values stay finite)
        x, y, w = 1.5 * x / np.abs(x), y / np.abs(y), w / np.abs(w)
    x, y, w = (v.astype(np.complex64) for v in (x, y, w))
    a = x * w
    numpy_ops = {"multiply": np.multiply, "divide": np.divide, "add": np.add, "subtract": np.subtract,
                 "exponential": np.exp, "sqrt": np.sqrt, "log": np.log, "tanh": np.tanh, "abs": np.abs,
                 "rsqrt": lambda v: 1 / np.sqrt(v), "power": np.power}  # fmt: skip
    emulated = numpy_ops[op](a, y) if binary else numpy_ops[op](a)
    [xla] = run_on_xla_cpu(text, [x, y, w])
    bumped = xla.copy()
    bumped[100] += np.abs(xla[100]) * 0.01
    verdict, run = judge_run(hloexec.load(text), [x, y, w], {"xla": [xla], "numpy": [emulated], "bumped": [bumped]})
    got = {c.name: (c.consistent, c.bound_violations, c.unbounded) for c in verdict.outputs[0].candidates}
    assert got["xla"] == got["numpy"] == got["hloexec"] == (True, 0, 0), got
    assert got["bumped"] == (False, 1, 0), got


ALL_REDUCE = """HloModule ar, num_partitions=4
add { x = c64[] parameter(0)  y = c64[] parameter(1)  ROOT s = c64[] add(x, y) }
ENTRY e {
  x = c64[16,16] parameter(0), sharding={devices=[1,4]0,1,2,3}
  sq = c64[16,16] multiply(x, x)
  ar = c64[16,16] all-reduce(sq), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  ROOT t = c64[16,16] sqrt(ar), sharding={devices=[1,4]0,1,2,3}
}
"""


def test_a_complex_add_all_reduce_is_bounded():
    """An add all-reduce of c64 values sums one term per participant (its squares: the moduli's; it failed squaring
    complex values into float64, an internal error): numpy's result (c64 squares, summed in group order in c64,
    c64 sqrt) is consistent, one element 1% off is caught."""
    exe = hloexec.load(ALL_REDUCE)
    inputs = spmd.random_global_inputs(exe.module, 0)
    per_device = spmd.split_inputs(exe.module, inputs, 4)
    total = np.zeros((16, 16), np.complex64)
    for shard in per_device:
        total = total + shard[0] * shard[0]
    correct = np.tile(np.sqrt(total), (1, 4))
    bumped = correct.copy()
    bumped[3, 5] *= np.complex64(1.01)
    runner = Runner({"partitions": 4, "replicas": 1, "report": lambda message: None})
    verdict, run = judge_run(exe, per_device, {"numpy": [correct], "bumped": [bumped]}, runner)
    got = {c.name: (c.consistent, c.bound_violations, c.unbounded) for c in verdict.outputs[0].candidates}
    assert run.bounds[exe.options.device.name].unbounded == {}
    assert got["numpy"] == (True, 0, 0) and got["bumped"] == (False, 1, 0), got


MOVES_AND_SUMS = """HloModule many
add { x = c64[] parameter(0)  y = c64[] parameter(1)  ROOT s = c64[] add(x, y) }
ENTRY e {
  x = c64[8,8] parameter(0)  y = c64[8,8] parameter(1)  i = s32[3,1] parameter(2)  u = c64[3,8] parameter(3)
  m = c64[8,8] multiply(x, y)
  t = c64[8,8] transpose(m), dimensions={1,0}
  c = c64[16,8] concatenate(m, t), dimensions={0}
  z = c64[] constant((0,0))
  p = c64[18,8] pad(c, z), padding=1_1x0_0
  sc = c64[8,8] scatter(m, i, u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
  rw = c64[8,4] reduce-window(sc, z), window={size=1x2 stride=1x2}, to_apply=add
  g = c64[3,8] gather(m, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}
  k = s32[] constant(2)
  ds = c64[2,8] dynamic-slice(p, k, k), dynamic_slice_sizes={2,8}
  du = c64[18,8] dynamic-update-slice(p, g, k, k)
  cmp = pred[8,8] compare(m, t), direction=EQ
  sel = c64[8,8] select(cmp, m, t)
  sg = c64[8,8] sign(m)
  ng = c64[8,8] negate(sel)
  dv = c64[8,8] divide(sg, ng)
  cv = c128[8,8] convert(dv)
  ROOT r = (c64[8,4], c64[2,8], c64[18,8], c128[8,8]) tuple(rw, ds, du, cv)
}
"""


@pytest.mark.filterwarnings("error::numpy.exceptions.ComplexWarning")
def test_complex_moves_sums_and_selects_are_bounded():
    """Complex values moved (transpose, concatenate, pad, gather, dynamic-(update-)slice), summed (scatter-add,
    reduce-window), compared and selected, sign, divide and converted to c128: every instruction bounded, no
    complex bound cast to real (the moved bounds came back complex: their imaginary parts were dropped with a
    warning), XLA:CPU's result consistent and one element per output 1% off caught."""
    rng = np.random.default_rng(0)

    def draw(shape):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)

    inputs = [draw((8, 8)), draw((8, 8)), np.array([[1], [4], [6]], np.int32), draw((3, 8))]
    xla = run_on_xla_cpu(MOVES_AND_SUMS, inputs)
    candidates = {"xla": xla}
    for k, out in enumerate(xla):
        bumped = [o.copy() for o in xla]
        bumped[k].reshape(-1)[np.argmax(np.abs(out))] *= 1.01
        candidates[f"bumped {k}"] = bumped
    exe = hloexec.load(MOVES_AND_SUMS)
    verdict, run = judge_run(exe, inputs, candidates)
    assert run.bounds[exe.options.device.name].unbounded == {}
    for k, output in enumerate(verdict.outputs):
        got = {c.name: (c.consistent, c.bound_violations, c.unbounded) for c in output.candidates}
        assert got["xla"] == got["hloexec"] == (True, 0, 0), (k, got)
        for j in range(len(xla)):
            assert got[f"bumped {j}"] == ((False, 1, 0) if j == k else (True, 0, 0)), (k, j, got)


CONVOLUTION = """HloModule cv
ENTRY e { x = c64[2,3,32] parameter(0)  w = c64[4,3,3] parameter(1)  y = c64[2,3,32] parameter(2)
          m = c64[2,3,32] multiply(x, y)
          ROOT c = c64[2,4,30] convolution(m, w), window={size=3}, dim_labels=bf0_oi0->bf0 }"""


@pytest.mark.filterwarnings("error::numpy.exceptions.ComplexWarning")
def test_a_complex_convolution_is_bounded():
    """A c64 convolution with a window is bounded as a dot of the terms it counts, on their moduli (its squares
    were complex, cast to real with a warning; its accumulation taken for f64's): XLA:CPU's result is consistent,
    one element 1% off is caught."""
    rng = np.random.default_rng(4)
    inputs = [
        (rng.standard_normal(s) + 1j * rng.standard_normal(s)).astype(np.complex64)
        for s in ((2, 3, 32), (4, 3, 3), (2, 3, 32))
    ]
    [xla] = run_on_xla_cpu(CONVOLUTION, inputs)
    bumped = xla.copy()
    bumped[1, 2, 7] *= 1.01
    exe = hloexec.load(CONVOLUTION)
    verdict, run = judge_run(exe, inputs, {"xla": [xla], "bumped": [bumped]})
    got = {c.name: (c.consistent, c.bound_violations, c.unbounded) for c in verdict.outputs[0].candidates}
    assert run.bounds[exe.options.device.name].unbounded == {}
    assert got["xla"] == got["hloexec"] == (True, 0, 0) and got["bumped"] == (False, 1, 0), got


CANCELS = """HloModule cancels
ENTRY e { x = c64[1024] parameter(0)  c = c64[1024] parameter(1)
  p = c64[1024] exponential(x)
  s = c64[1024] add(p, c)
  ROOT t = c64[1024] subtract(s, p) }"""


def _cancelling_inputs(seed: int) -> list:
    """Unit-modulus exp(x) (x imaginary) and c of modulus 1e-4: t = (p + c) - p is c plus the add's rounding at
    |p|'s ulp, p's own error (XLA's exp: ulps of f32) cancelling."""
    rng = np.random.default_rng(seed)
    x = 1j * rng.uniform(-3, 3, 1024)
    c = 1e-4 * np.exp(1j * rng.uniform(-3, 3, 1024))
    return [x.astype(np.complex64), c.astype(np.complex64)]


def _rules_only(monkeypatch) -> None:
    """The bounds as the rules make them, not calibrated by the samples (main's for complex values: they had none)."""
    monkeypatch.setattr(ErrorBounds, "_calibrate", staticmethod(lambda bound, *args, **kwargs: bound))


def test_complex_samples_see_errors_cancel_and_a_1pct_change_the_rules_pass_is_caught(monkeypatch):
    """Complex values' samples are complex deviations carried through the ops, so an error that cancels in the
    program cancels in them: (exp(x) + c) - exp(x) keeps exp's error out of its samples, and the bound calibrated by
    them is >= 4x tighter than the rules' (which add exp's error twice). XLA:CPU's and numpy's complex64 results are
    consistent; one element changed by 1% of the output's scale is caught, where the rules alone (main: complex
    values had no samples) pass it."""
    inputs = _cancelling_inputs(3)
    exe = hloexec.load(CANCELS)
    [xla] = run_on_xla_cpu(CANCELS, inputs)
    x, c = inputs
    p = np.exp(x)
    emulated = (p + c) - p
    bumped = xla.copy()
    bumped[100] += np.complex64(0.01 * np.abs(xla).max())
    candidates = {"xla": [xla], "numpy": [emulated], "bumped": [bumped]}
    verdict, run = judge_run(exe, inputs, candidates)
    sampled = np.asarray(run.bounds[exe.options.device.name].bounds[0])
    got = {c.name: (c.consistent, c.bound_violations, c.unbounded) for c in verdict.outputs[0].candidates}
    assert got["xla"] == got["numpy"] == got["hloexec"] == (True, 0, 0), got
    assert got["bumped"] == (False, 1, 0), got
    _rules_only(monkeypatch)
    verdict, run = judge_run(exe, inputs, candidates)
    rules = np.asarray(run.bounds[exe.options.device.name].bounds[0])
    assert np.median(rules / sampled) >= 4, np.median(rules / sampled)
    got = {c.name: (c.consistent, c.bound_violations, c.unbounded) for c in verdict.outputs[0].candidates}
    assert got["bumped"] == (True, 0, 0), got


@pytest.mark.parametrize("ctype", sorted(TYPES))
@pytest.mark.parametrize("seed", range(4))
def test_correct_complex_results_are_consistent_with_calibrated_bounds(seed, ctype):
    """No correct result is flagged where complex bounds are calibrated by their samples: over input seeds, the
    cancelling program's and the CG-shaped step's (dots, a conjugate, a divide by a dot, multiply, abs, exp, sqrt,
    a sum: its samples bilinear, linear and evaluated, or scaled in c128; 256 elements, so calibrated) XLA:CPU's
    and numpy's results in the program's type are consistent."""
    dtype, rtype = TYPES[ctype]
    rng = np.random.default_rng(100 + seed)
    a = (rng.standard_normal((256, 256)) + 1j * rng.standard_normal((256, 256))).astype(dtype)
    b = (rng.standard_normal(256) + 1j * rng.standard_normal(256)).astype(dtype)
    text = CG_STEP.format(c=ctype, r=rtype).replace("16", "256")  # (vectors of a calibration block)
    cancelling = [v.astype(dtype) for v in _cancelling_inputs(seed)]
    for program, inputs, emulate in (
        (CANCELS.replace("c64", ctype), cancelling, lambda x, c: [(np.exp(x) + c) - np.exp(x)]),
        (text, [a, b], _cg_step),
    ):
        xla = run_on_xla_cpu(program, inputs)
        emulated = [np.asarray(v, o.dtype) for v, o in zip(emulate(*inputs), xla)]
        verdict, _ = judge_run(hloexec.load(program), inputs, {"xla": xla, "numpy": emulated})
        for k, output in enumerate(verdict.outputs):
            got = {c.name: (c.consistent, c.bound_violations) for c in output.candidates}
            assert all(v == (True, 0) for v in got.values()), (k, got)


def test_a_c128_programs_smooth_ops_have_samples_that_see_errors_cancel(monkeypatch):
    """A c128 program's deviations (~2^-53 of a value) are below what its f64 shadow resolves as a kernel on
    perturbed operands less the value: exp's samples are a scaled difference (bound_complex.scaled_samples: the
    deviation scaled by a power of two, the move divided by it). (exp(x) + c) - exp(x) in c128: the bound calibrated
    by them is >= 4x below the rules' (exp's samples were unknown: NaN, not calibrated), XLA:CPU's and numpy's
    complex128 results are consistent, and one element changed by 3x its calibrated bound is caught (the rules'
    allow it)."""
    text = CANCELS.replace("c64", "c128")
    x, c = (v.astype(np.complex128) for v in _cancelling_inputs(5))
    exe = hloexec.load(text)
    [xla] = run_on_xla_cpu(text, [x, c])
    _, run = judge_run(exe, [x, c], {})
    sampled = np.asarray(run.bounds[exe.options.device.name].bounds[0])
    bumped = xla.copy()
    bumped[100] += 3 * sampled[100]
    candidates = {"xla": [xla], "numpy": [(np.exp(x) + c) - np.exp(x)], "bumped": [bumped]}
    verdict, _ = judge_run(exe, [x, c], candidates)
    got = {c.name: (c.consistent, c.bound_violations, c.unbounded) for c in verdict.outputs[0].candidates}
    assert got["xla"] == got["numpy"] == got["hloexec"] == (True, 0, 0), got
    assert got["bumped"] == (False, 1, 0), got
    _rules_only(monkeypatch)
    verdict, run = judge_run(exe, [x, c], candidates)
    rules = np.asarray(run.bounds[exe.options.device.name].bounds[0])
    assert np.median(rules / sampled) >= 4, np.median(rules / sampled)
    got = {c.name: (c.consistent, c.bound_violations, c.unbounded) for c in verdict.outputs[0].candidates}
    assert got["bumped"] == (True, 0, 0), got


SELECTS = """HloModule selects
ENTRY e { x = c128[1024] parameter(0)  c = c128[1024] parameter(1)  y = c128[1024] parameter(2)
  p = c128[1024] exponential(x)
  q = c128[1024] multiply(y, y)
  cmp = pred[1024] compare(p, q), direction=NE
  sel = c128[1024] select(cmp, p, q)
  s = c128[1024] add(sel, c)
  ROOT t = c128[1024] subtract(s, sel) }"""


def test_a_c128_select_carries_its_branchs_deviations(monkeypatch):
    """A select of c128 values after a c128 comparison: its samples are the chosen branch's deviations (exact; its
    perturbed value less the value lost them: NaN, and nothing after it calibrated), and the comparison's perturbed
    decisions its kernel's on the perturbed operands (they were all False). (sel + c) - sel is then calibrated >= 4x
    below the rules, and XLA:CPU's and numpy's complex128 results stay consistent."""
    rng = np.random.default_rng(1)
    x, c = (v.astype(np.complex128) for v in _cancelling_inputs(1))
    y = np.exp(1j * rng.uniform(-3, 3, 1024))
    exe = hloexec.load(SELECTS)
    [xla] = run_on_xla_cpu(SELECTS, [x, c, y])
    p, q = np.exp(x), y * y
    chosen = np.where(p != q, p, q)
    verdict, run = judge_run(exe, [x, c, y], {"xla": [xla], "numpy": [(chosen + c) - chosen]})
    sampled = np.asarray(run.bounds[exe.options.device.name].bounds[0])
    got = {c.name: (c.consistent, c.bound_violations, c.unbounded) for c in verdict.outputs[0].candidates}
    assert got["xla"] == got["numpy"] == got["hloexec"] == (True, 0, 0), got
    _rules_only(monkeypatch)
    _, run = judge_run(exe, [x, c, y], {})
    rules = np.asarray(run.bounds[exe.options.device.name].bounds[0])
    assert np.median(rules / sampled) >= 4, np.median(rules / sampled)
