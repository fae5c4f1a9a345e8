"""Tests of the XLA:CPU reference harness (hloexec.tools.xla_cpu) itself."""
from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

from pathlib import Path

from hloexec.tools import xla_cpu as X

_AVX512 = os.path.exists("/proc/cpuinfo") and "avx512f" in open("/proc/cpuinfo").read()  # (the examples' machine)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

pytestmark = pytest.mark.xla

ADD = """HloModule add
ENTRY main {
  a = f32[2,3] parameter(0)
  b = f32[2,3] parameter(1)
  ROOT s = f32[2,3] add(a, b)
}
"""

TUPLE = """HloModule tup
ENTRY main {
  a = f32[4] parameter(0)
  b = s32[] parameter(1)
  c = pred[4] compare(a, a), direction=EQ
  m = f32[4] multiply(a, a)
  inner = (pred[4], s32[]) tuple(c, b)
  ROOT t = (f32[4], (pred[4], s32[])) tuple(m, inner)
}
"""

BF16 = """HloModule bf
ENTRY main {
  a = bf16[5] parameter(0)
  b = bf16[5] parameter(1)
  ROOT r = bf16[5] add(a, b)
}
"""


def test_available():
    assert X.xla_cpu_available()


def test_without_jax_the_reference_says_how_to_install_it(monkeypatch, capsys):
    """An install without the jax extra: `--against xla` says what to install (exit 2), not the child's traceback."""
    import importlib.util
    from hloexec.tools.cli import main
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jax" else find_spec(name, *a))
    with pytest.raises(X.XlaCpuError, match=r"pip install 'hloexec\[jax\]'"):
        X.run_on_xla_cpu_isolated(BF16, [np.zeros(5, ml_dtypes.bfloat16)] * 2)
    mlp = Path(__file__).resolve().parent.parent / "examples" / "mlp.opt.hlo"
    assert main(["compare", str(mlp), "--seed", "0", "--against", "xla"]) == 2
    assert "hloexec[jax]" in capsys.readouterr().err


def test_add_runs():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 0.5, np.float32)
    (out,) = X.run_on_xla_cpu(ADD, [a, b])
    assert out.dtype == np.float32 and out.shape == (2, 3)
    np.testing.assert_array_equal(out, a + b)


def test_add_timed():
    a = np.ones((2, 3), np.float32)
    outs, t = X.run_on_xla_cpu_timed(ADD, [a, a], warm_runs=2)
    np.testing.assert_array_equal(outs[0], 2 * a)
    for k in ("parse_s", "compile_s", "first_run_s", "warm_run_s"):
        assert t[k] >= 0


def test_tuple_output_flattened():
    a = np.array([1, -2, np.nan, 4], np.float32)
    outs = X.run_on_xla_cpu(TUPLE, [a, np.int32(7)])
    assert len(outs) == 3
    np.testing.assert_array_equal(outs[0], a * a)
    assert outs[1].dtype == np.bool_
    np.testing.assert_array_equal(outs[1], [True, True, False, True])
    assert outs[2].shape == () and outs[2] == 7


def test_bf16_round_trip_isolated():
    a = np.array([1.5, -2, 3.25, 1e30, 0.1], ml_dtypes.bfloat16)
    b = np.array([0.5, 2, -1, 1e30, 0.2], ml_dtypes.bfloat16)
    (o1,) = X.run_on_xla_cpu(BF16, [a, b])
    (o2,) = X.run_on_xla_cpu_isolated(BF16, [a, b])
    want = (a.astype(np.float32) + b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    for o in (o1, o2):
        assert o.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(o.view(np.uint16), want.view(np.uint16))


def test_isolated_tuple_and_scalar():
    a = np.array([1, 2, 3, 4], np.float32)
    outs = X.run_on_xla_cpu_isolated(TUPLE, [a, np.int32(-3)])
    assert [o.shape for o in outs] == [(4,), (4,), ()]
    assert outs[2] == -3


def test_isolated_invalid_text_raises_xla_message():
    with pytest.raises(X.XlaCpuError) as ei:
        X.run_on_xla_cpu_isolated("HloModule broken\nENTRY main { a = f32[4] parameter(0)\n ROOT b = }", [])
    assert ei.value.stage == "parse"
    assert "Syntax error" in str(ei.value) or "error" in str(ei.value).lower()


def test_isolated_shape_error_reports_compile_stage():
    bad = "HloModule x\nENTRY m { a = f32[4] parameter(0)\n ROOT b = f32[3] add(a, a) }"
    with pytest.raises(X.XlaCpuError) as ei:
        X.run_on_xla_cpu_isolated(bad, [np.zeros(4, np.float32)])
    assert ei.value.stage in ("convert", "compile")
    assert "shape" in str(ei.value)


def test_input_mismatch():
    with pytest.raises(X.XlaCpuError, match="input 1"):
        X.run_on_xla_cpu(ADD, [np.ones((2, 3), np.float32), np.ones((2, 3), np.float64)])
    with pytest.raises(X.XlaCpuError, match="parameters"):
        X.run_on_xla_cpu(ADD, [np.ones((2, 3), np.float32)])


def test_f64_not_downcast():
    t = ADD.replace("f32", "f64")
    a = np.array([[1e300, 1 + 2**-40, 0], [1, 2, 3]])
    (o,) = X.run_on_xla_cpu(t, [a, a])
    assert o.dtype == np.float64
    np.testing.assert_array_equal(o, a + a)


def test_parse_with_xla():
    info = X.parse_with_xla(TUPLE)
    assert info["entry"] == "main"
    assert info["computations"] == {"main": 6}
    assert info["total_instructions"] == 6
    assert info["parameter_shapes"] == ["f32[4]", "s32[]"]
    assert info["result_shape"] == "(f32[4], (pred[4], s32[]))"
    shapes = X.xla_instruction_shapes(TUPLE)
    assert shapes["c"] == "pred[4]" and shapes["inner"] == "(pred[4], s32[])"


def test_npz_helpers_keep_ml_dtypes(tmp_path):
    arrs = {
        "arg0": np.array([1.5, 2], ml_dtypes.bfloat16),
        "arg1": np.array([0.5], ml_dtypes.float8_e4m3fn),
        "arg2": np.float32(3),
        "arg3": np.array([True, False]),
    }
    p = tmp_path / "x.npz"
    X.save_arrays(str(p), arrs)
    back = X.load_arrays(str(p))
    assert list(back) == list(arrs)
    for k, a in arrs.items():
        a = np.asarray(a)
        assert back[k].dtype == a.dtype and back[k].shape == a.shape
        np.testing.assert_array_equal(back[k], a)


@pytest.mark.parametrize("name", ["mlp", "adam", "layernorm_bwd_bf16", "sort_topk", "gather_scatter"])
def test_examples_pre_match_expected(name):
    """pre.hlo re-run through the harness reproduces the committed expected.npz."""
    text = (EXAMPLES / f"{name}.pre.hlo").read_text()
    ins = list(X.load_arrays(str(EXAMPLES / f"{name}.inputs.npz")).values())
    exp = list(X.load_arrays(str(EXAMPLES / f"{name}.expected.npz")).values())
    outs = X.run_on_xla_cpu(text, ins)
    assert len(outs) == len(exp)
    for o, e in zip(outs, exp):
        assert o.dtype == e.dtype and o.shape == e.shape
        if _AVX512 or o.dtype.kind not in "fV":
            np.testing.assert_array_equal(o, e)
        else:  # (made on AVX-512: XLA:CPU's f32 sums run in other lanes, so another order, on AVX2 machines)
            wide, want = o.astype(np.float64), e.astype(np.float64)
            np.testing.assert_allclose(wide, want, rtol=1e-5, atol=1e-6 * np.abs(want).max(initial=1.0))
