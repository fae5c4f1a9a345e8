"""The unary elementwise ops' error bounds in one compiled pass (tools/bound_generic.py, kernels/bound_generic.py)
against ErrorBounds' separate rules (`_elementwise`, `_evaluated`, `_moved_by`, `_round`, `_sample`), on data
with infinities, NaN, zeros, subnormals and negative values (sqrt and log of negatives, log of 0): every value's
bound the same bits, its rounding-decided marks the same, its samples the same values (the same noise windows),
in one span and split over the cores in chunks."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hloexec
from hloexec.kernels import bound_generic, bound_rules
from hloexec.options.devices import device_profile
from hloexec.tools import bounds as bounds_module
from hloexec.tools.bound_samples import CALIBRATION_BLOCK

UNARY = ["sqrt", "rsqrt", "exponential", "exponential-minus-one", "log", "log-plus-one", "logistic", "tanh",
         "sine", "cosine", "cbrt", "erf", "floor", "ceil", "sign", "round-nearest-even", "round-nearest-afz"]


def _program(dtype: str, n: int) -> str:
    """Every unary op on a product (a value with a bound and samples), sqrt, floor and log also on a parameter
    (exact: no bound, no samples), and sqrt of a product's square (a chain of evaluated ops)."""
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


def _records(text, inputs, compiled: bool, monkeypatch, fused: str = "unary_elementwise") -> tuple:
    """Every instruction's (bound, marks, samples) as ErrorBounds keeps them, observing the shadow's run, with the
    compiled pass `fused` (a function of tools/bounds.py's) or (`compiled` False) the separate rules; and the
    instructions the compiled pass took."""
    from hloexec.exec.shadow import shadow_module
    from hloexec.tools.bounds import ErrorBounds
    from hloexec.tools.numerics import Runner, executable_like

    with monkeypatch.context() as patch:
        done = []  # the instructions the compiled pass took
        compiled_pass = getattr(bounds_module, fused)
        patch.setattr(bounds_module, fused,
                      lambda b, *rest: compiled and compiled_pass(b, *rest) and not done.append(rest))
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
    return records, done


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
@pytest.mark.parametrize("split", [False, True])
def test_the_unary_pass_is_the_separate_rules(dtype, split, monkeypatch):
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
    want, _ = _records(text, inputs, False, monkeypatch)
    got, done = _records(text, inputs, True, monkeypatch)
    assert len(done) == len(UNARY) + 5
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
    want, _ = _records(text, inputs, False, monkeypatch, "fused_select")
    got, done = _records(text, inputs, True, monkeypatch, "fused_select")
    assert len(done) == 5
    assert _same_records(want, got) > n
    assert want["s", 0][1] is not None and want["s", 0][1].any()  # (rounding-decided elements compared)
