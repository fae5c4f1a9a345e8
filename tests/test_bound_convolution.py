"""A convolution's error bound (hloexec/tools/bound_convolution.py): one that is a dot (a TPU program's matmul,
dim_labels=bf_oi->bf) is bounded and sampled as that dot -- the same bounds bit for bit as the dot written as one,
and never below the error of a numpy emulation of the program's bf16 arithmetic --; the others keep the
convolution's own rule."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hloexec
from hloexec.ops.registry import lookup
from hloexec.options import device_profile
from hloexec.tools.bound_convolution import as_dot
from hloexec.tools.numerics import shadow_run
from hloexec.tools.verdict import RULE

M, K, N = 96, 384, 80
PROGRAM = """HloModule m
ENTRY e {{
  x = f32[{M},{K}] parameter(0)
  y = f32[{N},{K}] parameter(1)
  a = bf16[{M},{K}] convert(x)
  b = bf16[{N},{K}] convert(y)
  ROOT r = bf16[{M},{N}] {op}
}}
"""
DOT = "dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={1}"
CONVOLUTION = "convolution(a, b), dim_labels=bf_oi->bf"


def _inputs():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((M, K)).astype(np.float32)
    x[0, :] = 0.0  # (a row of zeros: exact terms)
    x[1, :5] = np.float32(1e-40)  # (subnormal terms)
    return [x, rng.uniform(-1, 2, (N, K)).astype(np.float32)]


def _bounds(op: str) -> tuple:
    exe = hloexec.load(PROGRAM.format(M=M, K=K, N=N, op=op))
    run = shadow_run(exe, _inputs(), devices=[device_profile("reference")])
    return run, run.bounds["reference"].bounds[0]


def _within(error, bound):
    """Every error within the verdict's allowance (RULE's bound_factor x its bound: a bound is SIGMAS sigmas, not
    a maximum), nearly all within the bound."""
    assert np.all(error <= RULE.bound_factor * bound)
    assert np.mean(error <= bound) > 0.999


def test_a_dot_shaped_convolution_has_the_dots_bounds_bit_for_bit():
    _, dot = _bounds(DOT)
    _, convolution = _bounds(CONVOLUTION)
    np.testing.assert_array_equal(convolution, dot)
    assert np.all(np.isfinite(dot)) and np.all(dot[1:] > 0)


def test_a_dot_shaped_convolutions_bound_holds_the_error_of_its_bf16_arithmetic():
    """The program's arithmetic emulated in numpy (operands rounded to bf16, products summed in f32, the result
    rounded to bf16) against the exact dot: the errors within their bounds (`_within`), the bounds not far above
    them."""
    x, y = _inputs()
    a, b = (v.astype(ml_dtypes.bfloat16).astype(np.float32) for v in (x, y))
    program = (a @ b.T).astype(ml_dtypes.bfloat16).astype(np.float64)
    exact = x.astype(np.float64) @ y.astype(np.float64).T
    run, bound = _bounds(CONVOLUTION)
    np.testing.assert_array_equal(run.shadow[0], exact)
    error = np.abs(program - exact)
    _within(error, bound)
    assert np.sqrt(np.mean(bound**2)) < 16 * np.sqrt(np.mean(error**2))


def test_a_convolution_with_a_window_keeps_its_own_rule_and_its_bound_holds():
    text = """HloModule m
ENTRY e {
  x = f32[4,8,64] parameter(0)
  w = f32[6,8,3] parameter(1)
  a = bf16[4,8,64] convert(x)
  b = bf16[6,8,3] convert(w)
  ROOT r = bf16[4,6,62] convolution(a, b), window={size=3}, dim_labels=bf0_oi0->bf0
}
"""
    exe = hloexec.load(text)
    [conv] = [i for i in exe.module.entry.instructions if i.opcode == "convolution"]
    assert as_dot(conv) is None and conv.attr("window") is not None
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((4, 8, 64)).astype(np.float32), rng.standard_normal((6, 8, 3)).astype(np.float32)]
    run = shadow_run(exe, inputs, devices=[device_profile("reference")])
    bound = run.bounds["reference"].bounds[0]
    _within(np.abs(np.asarray(run.outputs[0], np.float64) - run.shadow[0]), bound)


@pytest.mark.parametrize(
    "labels, lhs, rhs, out, groups, is_dot",
    [
        ("bf_oi->bf", (5, 7), (3, 7), (5, 3), "", True),
        ("fb_io->bf", (7, 5), (7, 3), (5, 3), ", operand_precision={highest,highest}", True),
        ("bf_oi->fb", (5, 7), (3, 7), (3, 5), "", False),  # (the output transposed: not a dot's order)
        ("bf_oi->bf", (5, 14), (6, 7), (5, 6), ", feature_group_count=2", False),
    ],
)
def test_as_dot_is_the_convolutions_dot_or_none(labels, lhs, rhs, out, groups, is_dot):
    shape = lambda s: ",".join(map(str, s))  # noqa: E731
    exe = hloexec.load(
        f"""HloModule m
ENTRY e {{
  a = f64[{shape(lhs)}] parameter(0)
  b = f64[{shape(rhs)}] parameter(1)
  ROOT r = f64[{shape(out)}] convolution(a, b), dim_labels={labels}{groups}
}}
"""
    )
    conv = exe.module.entry.root
    dot = as_dot(conv)
    assert (dot is not None) == is_dot
    assert dot is None or dot.attr("operand_precision") == conv.attr("operand_precision")
    if dot is not None:
        rng = np.random.default_rng(1)
        a, b = rng.standard_normal(lhs), rng.standard_normal(rhs)
        np.testing.assert_allclose(lookup(dot).prepare(dot, exe.context)(a, b), exe.run(a, b), rtol=1e-12)
