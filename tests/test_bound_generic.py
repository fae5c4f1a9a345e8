"""The generic path's compiled passes (tools/bound_generic.py, kernels/bound_generic.py) against ErrorBounds'
separate rules: elementwise ops of one operand with errors (`_elementwise`, `_evaluated`, `_moved_by`, `_round`,
`_sample`) and selects (`_select`), on data with infinities, NaN, zeros, subnormals and negative values (sqrt and
log of negatives, log of 0): every value's bound the same bits, its rounding-decided marks the same, its samples
the same values (the same noise windows), in one span and split over the cores in chunks; an add reduce's term
sums against numpy's sums and the rule in numpy (a float64 rounding apart); a scatter-add's linear samples.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hloexec
from hloexec.kernels import bound_generic, bound_rules
from hloexec.options.devices import device_profile
from hloexec.tools import bounds as bounds_module
from hloexec.tools.bound_samples import CALIBRATION_BLOCK

# binary ops with one operand with errors (in one place or both) or none: the same pass; w5 has two (not taken)
BINARY = [("power", "m", "a"), ("power", "a", "m"), ("power", "a", "b"), ("power", "m", "m"), ("atan2", "b", "m"),
          ("power", "m", "c"), ("remainder", "a", "m")]
UNARY = ["sqrt", "rsqrt", "exponential", "exponential-minus-one", "log", "log-plus-one", "logistic", "tanh",
         "sine", "cosine", "cbrt", "erf", "floor", "ceil", "sign", "round-nearest-even", "round-nearest-afz"]


def _program(dtype: str, n: int) -> str:
    """Every unary op on a product (a value with a bound and samples), sqrt, floor and log also on a parameter
    (exact: no bound, no samples), sqrt of a product's square (a chain of evaluated ops), and BINARY's."""
    lines = [f"  a = {dtype}[{n}] parameter(0)", f"  b = {dtype}[{n}] parameter(1)",
             f"  m = {dtype}[{n}] multiply(a, b)"]
    names = []
    for k, op in enumerate(UNARY):
        lines.append(f"  u{k} = {dtype}[{n}] {op}(m)")
        names.append(f"u{k}")
    for k, op in enumerate(["sqrt", "floor", "log"]):
        lines.append(f"  p{k} = {dtype}[{n}] {op}(a)")
        names.append(f"p{k}")
    lines += [f"  s = {dtype}[{n}] multiply(u0, m)", f"  c = {dtype}[{n}] sqrt(s)",
              f"  r = {dtype}[{n}] reduce-precision(m), exponent_bits=5, mantissa_bits=4"]
    names += ["c", "r"]
    for k, (op, x, y) in enumerate(BINARY):
        lines.append(f"  w{k} = {dtype}[{n}] {op}({x}, {y})")
        names.append(f"w{k}")
    shapes = ", ".join(f"{dtype}[{n}]" for _ in names)
    lines.append(f"  ROOT t = ({shapes}) tuple({', '.join(names)})")
    return "HloModule unary\nENTRY e {\n" + "\n".join(lines) + "\n}\n"


def _awkward(rng, n, dtype) -> np.ndarray:
    """Half ordinary values (enough to calibrate), the rest of every kind: tiny, subnormal, zeros (both signs),
    infinities, NaN, huge, negative."""
    info = ml_dtypes.finfo(dtype)
    kinds = [rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n), rng.uniform(-1, 1, n) * float(info.tiny),
             np.zeros(n), -np.zeros(n), np.full(n, np.inf) * rng.choice([-1, 1], n), np.full(n, np.nan),
             rng.standard_normal(n) * float(info.max) / 4, -np.abs(rng.standard_normal(n))]
    values = np.stack(kinds)[rng.integers(0, len(kinds), n), np.arange(n)]
    values[: n // 2] = rng.standard_normal(n // 2) * 2
    return values.astype(dtype)


def _records(text, inputs, monkeypatch, replace=()) -> dict:
    """Every instruction's (bound, marks, samples) as ErrorBounds keeps them, observing the shadow's run, with
    `replace`'s (module, name, function) patched in."""
    from hloexec.exec.shadow import shadow_module
    from hloexec.tools.bounds import ErrorBounds
    from hloexec.tools.numerics import Runner, executable_like

    with monkeypatch.context() as patch:
        for module, name, function in replace:
            patch.setattr(module, name, function)
        exe = hloexec.load(text)
        shadow = shadow_module(exe.module)
        shadow_exe = executable_like(exe, shadow.module, use_numba=False)
        bounds = ErrorBounds(shadow, shadow_exe.context, device_profile("reference"), seed=3)
        records = {}

        def observe(_device, inst, value, operands):
            bounds(inst, value, operands)
            for k, leaf in enumerate(bounds_module._leaves(value)):
                entry = bounds._entry(leaf)
                if entry is not None:
                    samples = bounds._samples_or_none(leaf)
                    records[inst.name, k] = tuple(None if v is None else np.array(v) for v in
                                                  (entry[1], bounds._decided_or_none(leaf), samples))

        with np.errstate(all="ignore"):
            Runner().run(shadow_exe, shadow.inputs(inputs), observe, observe_operands=True)
    return records


def _counted(module, name: str, calls: list) -> tuple:
    """(module, name, `module.name` appending to `calls` each time it does something (returns other than False /
    None))."""
    function = getattr(module, name)

    def counting(*args):
        result = function(*args)
        if result is not False and result is not None:
            calls.append(args)
        return result
    return module, name, counting


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
@pytest.mark.parametrize("split", [False, True])
def test_the_evaluated_pass_is_the_separate_rules(dtype, split, monkeypatch):
    n = 12 * CALIBRATION_BLOCK + 17  # (a shorter last block)
    if split:  # spans of 3 blocks on two threads, chunks of 2 blocks
        monkeypatch.setattr(bound_rules, "SPLIT_FROM", 0)
        monkeypatch.setattr(bound_rules, "SPAN", 3 * CALIBRATION_BLOCK)
        monkeypatch.setattr(bound_generic, "CHUNK_BLOCKS", 2)
        monkeypatch.setenv("HLOEXEC_NUM_THREADS", "2")
    numpy_type = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f64": np.float64}[dtype]
    rng = np.random.default_rng(11)
    inputs = [_awkward(rng, n, numpy_type) for _ in range(2)]
    text = _program(dtype, n)
    done: list = []
    want = _records(text, inputs, monkeypatch, [(bounds_module, "evaluated_elementwise", lambda *_: False)])
    got = _records(text, inputs, monkeypatch, [_counted(bounds_module, "evaluated_elementwise", done)])
    assert len(done) == len(UNARY) + 5 + len(BINARY) - 1
    assert _same_records(want, got) > n * len(UNARY) // 4  # (the data made finite positive bounds to compare)


def _same_records(want, got) -> int:
    """Asserts two runs' records are the same: bounds bit for bit, marks, samples as values (-0 == +0, NaN where
    NaN). Returns how many finite positive bounds they compared."""
    assert want.keys() == got.keys()
    judged = 0
    for key, (bound, decided, samples) in want.items():
        g_bound, g_decided, g_samples = got[key]
        assert (bound is None) == (g_bound is None), key
        if bound is not None:
            assert bound.dtype == g_bound.dtype and bound.tobytes() == g_bound.tobytes(), key
            judged += int(np.count_nonzero(np.isfinite(bound) & (bound > 0)))
        assert (decided is None) == (g_decided is None), key
        if decided is not None:
            np.testing.assert_array_equal(decided, g_decided, err_msg=str(key))
        assert (samples is None) == (g_samples is None), key
        if samples is not None:
            np.testing.assert_array_equal(samples, g_samples, err_msg=str(key))
    return judged


SELECTS = """HloModule selects
ENTRY e {
  a = f32[N] parameter(0)
  b = f32[N] parameter(1)
  m = f32[N] multiply(a, b)
  q = f32[N] multiply(b, b)
  c = pred[N] compare(m, q), direction=LT
  s = f32[N] select(c, m, q)
  r = f32[N] select(c, a, m)
  k = pred[N] compare(a, b), direction=GT
  x = f32[N] select(k, a, b)
  y = f32[N] select(k, s, r)
  h = f16[N] convert(s)
  j = f16[N] convert(r)
  z = f16[N] select(c, h, j)
  ROOT t = (f32[N], f32[N], f32[N], f32[N], f16[N]) tuple(s, r, x, y, z)
}
"""


@pytest.mark.parametrize("split", [False, True])
def test_the_select_pass_is_the_separate_rules(split, monkeypatch):
    """A select on a rounding-decided predicate (its samples' decisions), on exact branches and predicate (no
    samples), on one exact branch, on a mark-carrying branch, in f32 and f16: the same as `_select` and
    `_sample`."""
    n = 12 * CALIBRATION_BLOCK + 17
    if split:
        monkeypatch.setattr(bound_rules, "SPLIT_FROM", 0)
        monkeypatch.setattr(bound_rules, "SPAN", 3 * CALIBRATION_BLOCK)
        monkeypatch.setenv("HLOEXEC_NUM_THREADS", "2")
    rng = np.random.default_rng(5)
    inputs = [_awkward(rng, n, np.float32) for _ in range(2)]
    inputs[1][:n // 4] = inputs[0][:n // 4] * (1 + 1e-7 * rng.standard_normal(n // 4))  # (m and q near: decided)
    text = SELECTS.replace("[N]", f"[{n}]")
    done: list = []
    want = _records(text, inputs, monkeypatch, [(bounds_module, "fused_select", lambda *_: False)])
    got = _records(text, inputs, monkeypatch, [_counted(bounds_module, "fused_select", done)])
    assert len(done) == 5
    assert _same_records(want, got) > n
    assert want["s", 0][1] is not None and want["s", 0][1].any()  # (rounding-decided elements compared)


@pytest.mark.parametrize("shape, dims", [((6, 37, 300), (2,)), ((300, 5, 7), (0,)), ((40, 50, 30), (0, 1)),
                                         ((9, 300, 11), (1,)), ((20, 30, 40), (0, 2)), ((3000,), (0,))])
@pytest.mark.parametrize("bounded, sampled", [(True, True), (True, False), (False, False)])
def test_term_sums_are_the_numpy_sums(shape, dims, bounded, sampled):
    """kernels/bound_generic.term_sums (one pass over each sum's terms, float64 in term order) against numpy's sums
    of the rule's quantities (tools/bounds.py `_reduce`: bounds squared, least bound (NaN if one is), (bound -
    least)^2, bounds, values squared; samples' deviations, read from their bfloat16 bits) on data with infinities,
    NaN, zeros and subnormals,
    the reduced dims trailing, leading or between (laid out as tools/bound_generic.summed_terms lays them)."""
    from hloexec.kernels.bound_generic import term_sums

    rng = np.random.default_rng(len(shape) * 7 + sum(dims))
    a = _awkward(rng, int(np.prod(shape)), np.float64).reshape(shape)
    e = np.abs(_awkward(rng, a.size, np.float32)).reshape(shape) * np.float32(1e-3) if bounded else None
    d = (rng.standard_normal((4, *shape)) * 1e-3).astype(ml_dtypes.bfloat16) if sampled else None  # (read as bits)
    kept = [k for k in range(len(shape)) if k not in dims]
    count, outputs = int(np.prod([shape[k] for k in dims])), int(np.prod([shape[k] for k in kept]))
    columns = list(dims) == list(range(len(dims))) and len(kept) > 0
    lay = lambda v, lead=(): np.ascontiguousarray(np.transpose(v, (*range(len(lead)), *(len(lead) + k for k in (  # noqa
        dims + tuple(kept) if columns else tuple(kept) + dims)))).reshape(*lead, *((count, outputs) if columns else (outputs, count))))
    sums, deviations = np.empty((5, outputs)), np.empty((4, outputs if sampled else 0), np.float32)
    with np.errstate(all="ignore"):
        term_sums(lay(a), np.empty((0, 0)) if e is None else lay(e), np.empty((4, 0, 0), np.uint16) if d is None
                  else lay(d.view(np.uint16), (4,)), columns, sums, deviations)
        e64 = np.zeros(shape) if e is None else e.astype(np.float64)
        least = np.min(e64, axis=dims, keepdims=True)
        want = [np.sum(e64**2, axis=dims), np.sum((e64 - least) ** 2, axis=dims), least.reshape(-1),
                np.sum(e64, axis=dims), np.sum(a**2, axis=dims)]
    for k, w in enumerate(want):
        np.testing.assert_allclose(sums[k], np.reshape(w, -1), rtol=1e-12, atol=0, err_msg=str(k))
    assert np.isnan(sums[0]).any() == (bounded and np.isnan(e).any())  # (NaN where a term's bound is)
    if sampled:
        np.testing.assert_allclose(deviations, np.sum(d.astype(np.float64), axis=tuple(k + 1 for k in dims))
                                   .reshape(4, -1).astype(np.float32), rtol=0, atol=0)


SUMS = """HloModule sums
add { x = f32[] parameter(0)  y = f32[] parameter(1)  ROOT s = f32[] add(x, y) }
add16 { x = bf16[] parameter(0)  y = bf16[] parameter(1)  ROOT s = bf16[] add(x, y) }
ENTRY e {
  a = f32[12,20,300] parameter(0)
  b = f32[12,20,300] parameter(1)
  m = f32[12,20,300] multiply(a, b)
  zero = f32[] constant(0)
  r0 = f32[12,20] reduce(m, zero), dimensions={2}, to_apply=add
  r1 = f32[20,300] reduce(m, zero), dimensions={0}, to_apply=add
  r2 = f32[300] reduce(m, zero), dimensions={0,1}, to_apply=add
  r3 = f32[12,300] reduce(m, zero), dimensions={1}, to_apply=add
  r4 = f32[20] reduce(m, zero), dimensions={2,0}, to_apply=add
  r5 = f32[] reduce(m, zero), dimensions={0,1,2}, to_apply=add
  r6 = f32[12,20] reduce(a, zero), dimensions={2}, to_apply=add
  h = bf16[12,20,300] convert(m)
  z16 = bf16[] constant(0)
  r7 = bf16[12,300] reduce(h, z16), dimensions={1}, to_apply=add16
  q = f32[12,20] multiply(r0, r0)
  ROOT t = (f32[12,20], f32[20,300], f32[300], f32[12,300], f32[20], f32[], f32[12,20], bf16[12,300], f32[12,20])
    tuple(r0, r1, r2, r3, r4, r5, r6, r7, q)
}
"""


@pytest.mark.parametrize("split", [False, True])
def test_sums_by_the_compiled_pass_are_the_numpy_rules(split, monkeypatch):
    """Add reduces over trailing, leading, middle, mixed and all dims, of a bounded sampled value, of an exact one
    (no bound, no samples), in f32 and bf16, one after another: the compiled term sums (tools/bound_generic.py
    `summed_terms`) against the rule by the reduce kernel in numpy (the same rule, a float64 rounding apart in
    the bounds, the samples' sums in float64 rounded once against float32 sums: within 2^-20 of their scale)."""
    from hloexec.tools import bound_generic

    if split:
        monkeypatch.setattr(bound_rules, "SPLIT_FROM", 0)
        monkeypatch.setattr(bound_rules, "SPAN", 1000)
        monkeypatch.setenv("HLOEXEC_NUM_THREADS", "2")
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal((12, 20, 300)).astype(np.float32) for _ in range(2)]
    odd = rng.random(inputs[0].shape) < 0.003  # (a few zeros, subnormals, infinities, NaN: rows of them)
    inputs[0][odd] = rng.choice(np.array([0.0, 1e-40, -1e-42, np.inf, -np.inf, np.nan], np.float32), odd.sum())
    done: list = []
    want = _records(SUMS, inputs, monkeypatch, [(bound_generic, "summed_terms", lambda *_: None)])
    got = _records(SUMS, inputs, monkeypatch, [_counted(bound_generic, "summed_terms", done)])
    assert len(done) == 8
    assert want.keys() == got.keys()
    compared = 0
    for key, (bound, decided, samples) in want.items():
        g_bound, g_decided, g_samples = got[key]
        assert (bound is None) == (g_bound is None) and (samples is None) == (g_samples is None), key
        assert (decided is None) == (g_decided is None), key
        if bound is not None:
            np.testing.assert_allclose(g_bound, bound, rtol=2.0**-20, atol=0, err_msg=str(key))
            compared += int(np.count_nonzero(np.isfinite(bound) & (bound > 0)))
        if samples is not None:
            scale = np.nanmax(np.abs(np.where(np.isfinite(samples), samples, 0)), initial=0.0)
            np.testing.assert_allclose(g_samples, samples, rtol=2.0**-20, atol=scale * 2.0**-20, err_msg=str(key))
    assert compared > 3000


SCATTER = """HloModule scatter
add { x = f32[] parameter(0)  y = f32[] parameter(1)  ROOT s = f32[] add(x, y) }
ENTRY e {
  a = f32[64,32] parameter(0)
  b = f32[64,32] parameter(1)
  u = f32[300,32] parameter(2)
  v = f32[300,32] parameter(3)
  i = s32[300,1] parameter(4)
  t = f32[64,32] multiply(a, b)
  w = f32[300,32] multiply(u, v)
  s = f32[64,32] scatter(t, i, w), update_window_dims={1}, inserted_window_dims={0},
    scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
  ROOT r = f32[64,32] multiply(s, s)
}
"""


def test_a_scatter_adds_samples_are_its_kernel_on_the_deviations(monkeypatch):
    """A scatter whose combiner adds is linear in its target and updates: its samples are its kernel on their
    deviations alone (as an add reduce's), not the perturbed float64 scatters less the value: the same within a
    few float32 roundings of the deviations (the same draws), and so are the bounds calibrated by them."""
    def old_sums(inst):  # (the predicate before: reduces only)
        reducer = inst.called.get("to_apply")
        return inst.opcode in ("reduce", "reduce-window") and reducer is not None and reducer.root.opcode == "add"

    rng = np.random.default_rng(4)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in ((64, 32), (64, 32), (300, 32), (300, 32))]
    inputs.append(rng.integers(0, 64, (300, 1)).astype(np.int32))  # (rows hit several times, some never)
    want = _records(SCATTER, inputs, monkeypatch, [(bounds_module, "_sums", old_sums)])
    linear: list = []
    got = _records(SCATTER, inputs, monkeypatch, [_counted(bounds_module, "_sums", linear)])
    for key in (("s", 0), ("r", 0)):
        (bound, _, samples), (g_bound, _, g_samples) = want[key], got[key]
        scale = float(np.max(np.abs(samples)))
        assert scale > 0 and np.all(np.isfinite(bound)) and np.any(bound > 0)
        np.testing.assert_allclose(g_samples, samples, rtol=2.0**-16, atol=scale * 2.0**-16)
        np.testing.assert_allclose(g_bound, bound, rtol=2.0**-12)
    assert [args[0].opcode for args in linear] == ["scatter"]  # (its samples by the linear path)


MOVES = """HloModule moves
ENTRY e {
  a = f32[N] parameter(0)
  b = f32[N] parameter(1)
  i = s32[] parameter(2)
  m = f32[N] multiply(a, b)
  q = f32[N] multiply(b, b)
  c = f32[M] concatenate(m, a, q), dimensions={0}
  d = f32[K] dynamic-slice(c, i), dynamic_slice_sizes={K}
  u = f32[M] dynamic-update-slice(c, a, i)
  v = f32[M] dynamic-update-slice(c, q, i)
  r = f32[N] reverse(m), dimensions={0}
  h = f16[N] convert(q)
  w = f16[N] reverse(h), dimensions={0}
  ROOT t = (f32[M], f32[K], f32[M], f32[M], f32[N], f16[N]) tuple(c, d, u, v, r, w)
}
"""


def test_moves_carry_the_samples_bits(monkeypatch):
    """A concatenate, dynamic-slice, dynamic-update-slice and reverse of sampled and exact values (data with
    infinities, NaN, zeros and subnormals), whose samples tools/bound_generic.moved_samples moves as their
    bfloat16 bits: every bound, mark and sample as `_sample`'s decode, float32 move and encode make them."""
    n = 4 * CALIBRATION_BLOCK + 9
    rng = np.random.default_rng(8)
    inputs = [_awkward(rng, n, np.float32) for _ in range(2)] + [np.int32(n // 3)]
    text = MOVES.replace("[N]", f"[{n}]").replace("[M]", f"[{3 * n}]").replace("{K}", f"{{{n + 5}}}")
    text = text.replace("[K]", f"[{n + 5}]")
    moved: list = []
    want = _records(text, inputs, monkeypatch, [(bounds_module, "moved_samples", lambda *_: False)])
    got = _records(text, inputs, monkeypatch, [_counted(bounds_module, "moved_samples", moved)])
    assert sorted(args[1].name for args in moved) == ["c", "d", "r", "u", "v", "w"]
    assert _same_records(want, got) > n
    for key, (_, _, samples) in want.items():  # (the bits too: NaN's and zeros' signs)
        if samples is not None:
            assert samples.tobytes() == got[key][2].tobytes(), key
    assert np.isinf(want["c", 0][2]).any() and np.count_nonzero(np.isfinite(want["c", 0][2]) & (want["c", 0][2] != 0)) > n


def test_a_single_roundings_samples_are_uniform_within_half_an_ulp_fused_or_not(monkeypatch):
    """A product of exact f32 operands is rounded once: its samples are its own-error draws alone, uniform
    (kernels/normal_draws.fill_rounding_draws) of sigma ulp / sqrt(12), so never beyond half an ulp (the rounding's
    own range; normal draws pass it in 8% of samples), with that sigma; the separate rules (`_sample`'s add_noise)
    draw the same as the fused pass, bit for bit."""
    n = 8 * CALIBRATION_BLOCK
    text = f"""HloModule product
ENTRY e {{
  a = f32[{n}] parameter(0)
  b = f32[{n}] parameter(1)
  ROOT r = f32[{n}] multiply(a, b)
}}
"""
    rng = np.random.default_rng(12)
    inputs = [rng.uniform(1, 2, n).astype(np.float32), rng.uniform(-4, 4, n).astype(np.float32)]
    fused = _records(text, inputs, monkeypatch)
    separate = _records(text, inputs, monkeypatch, [(bounds_module, "fused_elementwise", lambda *_: False)])
    [key] = [k for k in fused if k[0] == "r"]
    samples = fused[key][2].astype(np.float64)
    np.testing.assert_array_equal(samples, separate[key][2].astype(np.float64))
    product = inputs[0].astype(np.float64) * inputs[1].astype(np.float64)
    _, exponent = np.frexp(np.abs(product))
    ulp = np.ldexp(1.0, exponent - 24)  # (float32's ulp at |product|: 24 significant bits)
    assert np.all(np.abs(samples) <= 0.5 * ulp * (1 + 2.0**-8))  # (stored in bfloat16: rounded to 8 bits)
    ratio = samples / (ulp / np.sqrt(12))
    assert abs(np.mean(ratio**2) - 1) < 5 * np.sqrt(0.8 / ratio.size) + 0.01
