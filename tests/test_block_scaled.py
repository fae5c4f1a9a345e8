"""XLA-GPU's block-scaling custom-calls __op$quantize and __op$dequantize against a numpy emulation written from
XLA's block_scaling_rewriter (its header's description and its tests' expanded HLO), not from hloexec's code:

quantize x -> (values, scales): x reshaped into blocks of the last dim; amax = reduce max |x| per block (init 0);
scale = convert(amax / EMAX) to the scales' type, EMAX = 2^(overflow exponent - 1) of the values' type (256 for
f8e4m3fn, the rewriter test's constant; 4 for f4e2m1fn, whose largest value is 6 = 1.5 * 2^2); values =
convert(x / broadcast(convert(scale) to x's type)) to the values' type; every step rounded to x's type.
dequantize (values, scales) -> convert(values) * broadcast(convert(scales)), both in the result type.
Conversions through ml_dtypes (round to nearest even, NaN where the type has no infinity), and a NaN converted
to a type without NaN (f4e2m1fn) is -0 as XLA:CPU converts it (jax, either sign of NaN).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hloexec
from hloexec.errors import UnsupportedError
from hloexec.exec.inputs import random_inputs

F32 = np.float32
E4M3, E5M2, E8M0, E2M1 = (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e8m0fnu,
                          ml_dtypes.float4_e2m1fn)
BF16 = ml_dtypes.bfloat16
HLO_NAMES = {F32: "f32", BF16: "bf16", E4M3: "f8e4m3fn", E5M2: "f8e5m2", E8M0: "f8e8m0fnu", E2M1: "f4e2m1fn"}
# (values type, scales type, block, EMAX): MXFP8 and NVFP4 as the rewriter's block size constants name them,
# and the rewriter test's own f8e5m2 scales
FORMATS = {"mxfp8": (E4M3, E8M0, 32, 256.0), "nvfp4": (E2M1, E4M3, 16, 4.0), "e5m2-scales": (E4M3, E5M2, 32, 256.0)}


def shape_text(dtype, dims) -> str:
    return f"{HLO_NAMES[dtype]}[{','.join(map(str, dims))}]"


def quantize_text(x_dtype, dims, values, scales, block) -> str:
    sdims = (*dims[:-1], dims[-1] // block)
    return (f"HloModule q\nENTRY e {{\n  x = {shape_text(x_dtype, dims)} parameter(0)\n"
            f"  ROOT q = ({shape_text(values, dims)}, {shape_text(scales, sdims)}) custom-call(x), "
            'custom_call_target="__op$quantize"\n}\n')


def dequantize_text(values, scales, out, dims, block) -> str:
    sdims = (*dims[:-1], dims[-1] // block)
    return (f"HloModule d\nENTRY e {{\n  v = {shape_text(values, dims)} parameter(0)\n"
            f"  s = {shape_text(scales, sdims)} parameter(1)\n  ROOT d = {shape_text(out, dims)} "
            'custom-call(v, s), custom_call_target="__op$dequantize"\n}\n')


def emulate_quantize(x, values, scales, block, emax):
    t = x.dtype
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // block, block).astype(np.float64)
    amax = np.abs(blocks).max(axis=-1, initial=0).astype(t)
    scale = (amax.astype(np.float64) / emax).astype(t).astype(scales)
    divisor = np.repeat(scale.astype(t), block, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        quotient = (x.astype(np.float64) / divisor.astype(np.float64)).astype(t)
    if not np.isnan(np.array(np.nan).astype(values).astype(F32)):
        quotient[np.isnan(quotient)] = -0.0      # XLA's convert to a type without NaN (measured on XLA:CPU)
    return quotient.astype(values), scale


def emulate_dequantize(v, s, out, block):
    return (v.astype(out).astype(np.float64) * np.repeat(s.astype(out), block, axis=-1)).astype(out)


def bits(a):
    return a.view(np.uint8)


def sample(rng, dims, dtype=F32):
    """Normal values, each row of blocks scaled by its own power of two (scale exponents across the range), one
    block of zeros (its scale has no exact form) and one tiny block (subnormal values)."""
    x = rng.standard_normal(dims) * np.exp2(rng.integers(-20, 20, (*dims[:-1], 1)))
    x[0, :8] = 0.0
    x[-1, -8:] *= 2.0 ** -12
    return x.astype(dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("x_dtype", [F32, BF16])
def test_quantize_is_the_rewriters_expansion(fmt, x_dtype):
    values, scales, block, emax = FORMATS[fmt]
    dims = (6, 4 * block)
    x = sample(np.random.default_rng(1), dims, x_dtype)
    x[0, block:2 * block] = 0.0                                  # a whole block of zeros
    got_v, got_s = hloexec.load(quantize_text(x_dtype, dims, values, scales, block)).run(x)
    want_v, want_s = emulate_quantize(x, values, scales, block, emax)
    assert got_v.dtype == values and got_s.dtype == scales and got_s.shape == (6, 4)
    np.testing.assert_array_equal(bits(got_s), bits(want_s))
    np.testing.assert_array_equal(bits(got_v), bits(want_v))
    zeros = want_v[0, block:2 * block].astype(F32)              # 0 / its scale (e8m0: NaN, e4m3: 0): NaN, or -0
    assert np.isnan(zeros).all() or (np.signbit(zeros).all() and (zeros == 0).all())
    finite = np.isfinite(want_v.astype(F32))
    assert np.abs(want_v.astype(F32)[finite]).max() > emax       # the values use the type's top binade


@pytest.mark.parametrize("fmt, rel, sub", [("mxfp8", 2.0 ** -4, 2.0 ** -10), ("nvfp4", 2.0 ** -2, 0.25)])
def test_quantize_then_dequantize_round_trips_within_the_format(fmt, rel, sub):
    """Each value within half an ulp of its format (`rel` of |x| for normals, `sub` scales below them)."""
    values, scales, block, _ = FORMATS[fmt]
    dims = (8, 4 * block)
    x = (np.random.default_rng(2).standard_normal(dims) * np.exp2(np.arange(-8, 8, 2))[:, None]).astype(F32)
    sdims = (8, 4)
    text = (f"HloModule r\nENTRY e {{\n  x = f32[8,{dims[1]}] parameter(0)\n"
            f"  q = ({shape_text(values, dims)}, {shape_text(scales, sdims)}) custom-call(x), "
            'custom_call_target="__op$quantize"\n'
            f"  v = {shape_text(values, dims)} get-tuple-element(q), index=0\n"
            f"  s = {shape_text(scales, sdims)} get-tuple-element(q), index=1\n"
            f'  ROOT d = f32[8,{dims[1]}] custom-call(v, s), custom_call_target="__op$dequantize"\n}}\n')
    y = hloexec.load(text).run(x)
    _, s = emulate_quantize(x, values, scales, block, FORMATS[fmt][3])
    s = np.repeat(s.astype(np.float64), block, axis=-1)
    err = np.abs(y.astype(np.float64) - x)
    assert np.all(err <= rel * np.abs(x) + sub * s)
    assert err.max() > 0                                         # it did round


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("out", [F32, BF16])
def test_dequantize_is_values_times_their_block_scale(fmt, out):
    values, scales, block, _ = FORMATS[fmt]
    rng = np.random.default_rng(3)
    dims = (2, 3, 2 * block)
    v = rng.standard_normal(dims).astype(values)
    s = np.exp2(rng.integers(-6, 6, (2, 3, 2))).astype(scales)
    got = hloexec.load(dequantize_text(values, scales, out, dims, block)).run(v, s)
    assert got.dtype == out
    np.testing.assert_array_equal(got.astype(F32), emulate_dequantize(v, s, out, block).astype(F32))


QUANTIZE = 'custom_call_target="__op$quantize"'
DEQUANTIZE = 'custom_call_target="__op$dequantize"'
MALFORMED = {
    "quantize two operands": ("f32[4,64] x, f32[4,64] y", "(f8e4m3fn[4,64], f8e8m0fnu[4,2]) custom-call(x, y)",
                              QUANTIZE),
    "quantize an array": ("f32[4,64] x", "f8e4m3fn[4,64] custom-call(x)", QUANTIZE),
    "quantize three results": ("f32[4,64] x", "(f8e4m3fn[4,64], f8e8m0fnu[4,2], f32[]) custom-call(x)", QUANTIZE),
    "quantize nested result": ("f32[4,64] x", "((f8e4m3fn[4,64]), f8e8m0fnu[4,2]) custom-call(x)", QUANTIZE),
    "quantize values of other dims": ("f32[4,64] x", "(f8e4m3fn[4,32], f8e8m0fnu[4,1]) custom-call(x)", QUANTIZE),
    "quantize block not dividing": ("f32[4,64] x", "(f8e4m3fn[4,64], f8e8m0fnu[4,3]) custom-call(x)", QUANTIZE),
    "quantize no scales": ("f32[4,64] x", "(f8e4m3fn[4,64], f8e8m0fnu[4,0]) custom-call(x)", QUANTIZE),
    "quantize scales of other rows": ("f32[4,64] x", "(f8e4m3fn[4,64], f8e8m0fnu[2,2]) custom-call(x)", QUANTIZE),
    "quantize scalar": ("f32[] x", "(f8e4m3fn[], f8e8m0fnu[]) custom-call(x)", QUANTIZE),
    "quantize integer scales": ("f32[4,64] x", "(f8e4m3fn[4,64], s8[4,2]) custom-call(x)", QUANTIZE),
    "quantize integer input": ("s32[4,64] x", "(f8e4m3fn[4,64], f8e8m0fnu[4,2]) custom-call(x)", QUANTIZE),
    "dequantize one operand": ("f8e4m3fn[4,64] v", "f32[4,64] custom-call(v)", DEQUANTIZE),
    "dequantize three operands": ("f8e4m3fn[4,64] v, f8e8m0fnu[4,2] s, f32[] g", "f32[4,64] custom-call(v, s, g)",
                                  DEQUANTIZE),
    "dequantize a tuple": ("f8e4m3fn[4,64] v, f8e8m0fnu[4,2] s", "(f32[4,64]) custom-call(v, s)", DEQUANTIZE),
    "dequantize other dims": ("f8e4m3fn[4,64] v, f8e8m0fnu[4,2] s", "f32[4,32] custom-call(v, s)", DEQUANTIZE),
    "dequantize block not dividing": ("f8e4m3fn[4,64] v, f8e8m0fnu[4,5] s", "f32[4,64] custom-call(v, s)",
                                      DEQUANTIZE),
    "dequantize scalar scale": ("f8e4m3fn[4,64] v, f8e8m0fnu[] s", "f32[4,64] custom-call(v, s)", DEQUANTIZE),
    "dequantize integer result": ("f8e4m3fn[4,64] v, f8e8m0fnu[4,2] s", "s32[4,64] custom-call(v, s)",
                                  DEQUANTIZE),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_calls_say_which_instruction(case):
    operands, call, target = MALFORMED[case]
    params = "".join(f"  {o.split()[1]} = {o.split()[0]} parameter({i})\n"
                     for i, o in enumerate(operands.split(", ")))
    text = f"HloModule m\nENTRY e {{\n{params}  ROOT bad_call = {call}, {target}\n}}\n"
    with pytest.raises(UnsupportedError, match="bad_call"):
        executable = hloexec.load(text)
        executable.run(*random_inputs(executable.module))


# The rewriter's expansion of __op$quantize as its test writes it (reshape, amax reduce, divide by EMAX, convert,
# broadcast back, divide, convert), run on XLA:CPU.
EXPANDED_QUANTIZE = """HloModule x
amax {{ a = {x}[] parameter(0)  b = {x}[] parameter(1)  ROOT m = {x}[] maximum(abs(a), abs(b)) }}
ENTRY e {{
  input = {x}[{rows},{n}] parameter(0)
  blocks = {x}[{rows},{nb},{block}] reshape(input)
  zero = {x}[] constant(0)
  amax = {x}[{rows},{nb}] reduce(blocks, zero), dimensions={{2}}, to_apply=amax
  emax = {x}[] constant({emax})
  emax_bc = {x}[{rows},{nb}] broadcast(emax), dimensions={{}}
  amax_norm = {x}[{rows},{nb}] divide(amax, emax_bc)
  scale = {s}[{rows},{nb}] convert(amax_norm)
  scale_cvt = {x}[{rows},{nb}] convert(scale)
  scale_bc = {x}[{rows},{nb},{block}] broadcast(scale_cvt), dimensions={{0,1}}
  scale_rs = {x}[{rows},{n}] reshape(scale_bc)
  result = {x}[{rows},{n}] divide(input, scale_rs)
  quantized = {v}[{rows},{n}] convert(result)
  ROOT t = ({v}[{rows},{n}], {s}[{rows},{nb}]) tuple(quantized, scale)
}}
"""


@pytest.mark.xla
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("x_dtype", [F32, BF16])
def test_quantize_matches_the_expansion_on_xla_cpu(fmt, x_dtype):
    """NaN and infinity in a block too: the amax (a NaN-propagating maximum) carries them into the scale."""
    pytest.importorskip("jax")
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    values, scales, block, emax = FORMATS[fmt]
    dims = (6, 4 * block)
    x = sample(np.random.default_rng(4), dims, x_dtype)
    x[1, 3], x[2, -1], x[3, block] = np.nan, np.inf, -np.inf
    names = {n: HLO_NAMES[t] for n, t in (("x", x_dtype), ("v", values), ("s", scales))}
    want = run_on_xla_cpu(EXPANDED_QUANTIZE.format(rows=6, n=dims[1], nb=4, block=block, emax=emax, **names), [x])
    got = hloexec.load(quantize_text(x_dtype, dims, values, scales, block)).run(x)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(bits(g), bits(np.asarray(w)))


# -- __op$block_scaled_dot's 3- and 5-operand forms and explicit block size (block_scaling_rewriter.cc) ----------
def _exact_mxfp8(rng, rows, k):
    """f8e4m3fn integers in [-4, 4] and power-of-two f8e8m0fnu scales per 32: every dot of them is exact in f32."""
    values = rng.integers(-4, 5, (rows, k)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    scales = np.exp2(rng.integers(-3, 4, (rows, -(-k // 32)))).astype(ml_dtypes.float8_e8m0fnu)
    return values, scales


def _scaled(values, scales, block=32):
    k = values.shape[-1]
    return values.astype(np.float64) * np.repeat(scales.astype(np.float64), block, axis=-1)[..., :k]


def _block_dot_text(operands: list[tuple[str, str]], out: str, config: str = "") -> str:
    params = "\n".join(f"  p{i} = {t} parameter({i})" for i, (t, _) in enumerate(operands))
    names = ", ".join(f"p{i}" for i in range(len(operands)))
    return (f"HloModule b\nENTRY e {{\n{params}\n  ROOT d = {out} custom-call({names}), "
            f"custom_call_target=\"__op$block_scaled_dot\"{config}\n}}\n")


def test_block_scaled_dot_without_rhs_scale_and_with_a_global_scale():
    rng = np.random.default_rng(21)
    (a, sa), (b, sb) = _exact_mxfp8(rng, 4, 64), _exact_mxfp8(rng, 3, 64)
    g = np.float32(0.3)
    exact = _scaled(a, sa) @ _scaled(b, sb).T
    five = _block_dot_text([("f8e4m3fn[4,64]", ""), ("f8e4m3fn[3,64]", ""), ("f8e8m0fnu[4,2]", ""),
                            ("f8e8m0fnu[3,2]", ""), ("f32[]", "")], "f32[4,3]")
    got = hloexec.load(five).run(a, b, sa, sb, g)
    np.testing.assert_array_equal(got, (exact * np.float64(g)).astype(F32))      # the exact dot, times g once
    three = _block_dot_text([("f8e4m3fn[4,64]", ""), ("f8e4m3fn[3,64]", ""), ("f8e8m0fnu[4,2]", "")], "f32[4,3]")
    got = hloexec.load(three).run(a, b, sa)
    np.testing.assert_array_equal(got, (_scaled(a, sa) @ b.astype(np.float64).T).astype(F32))


def test_block_scaled_dot_explicit_block_size_slices_padded_scales():
    rng = np.random.default_rng(22)
    (a, sa), (b, sb) = _exact_mxfp8(rng, 4, 80), _exact_mxfp8(rng, 3, 80)      # 80 = 2 blocks of 32 and 16
    pad = lambda s: np.pad(s.astype(np.float32), ((0, 4), (0, 1)), constant_values=8).astype(s.dtype)  # noqa: E731
    config = ', backend_config={"block_scaled_dot_backend_config":{"block_size":"32"}}'
    text = _block_dot_text([("f8e4m3fn[4,80]", ""), ("f8e4m3fn[3,80]", ""), ("f8e8m0fnu[8,4]", ""),
                            ("f8e8m0fnu[7,4]", "")], "f32[4,3]", config)
    got = hloexec.load(text).run(a, b, pad(sa), pad(sb))
    np.testing.assert_array_equal(got, (_scaled(a, sa) @ _scaled(b, sb).T).astype(F32))


@pytest.mark.parametrize("operands, what", [
    ([("f8e4m3fn[4,64]", ""), ("f8e4m3fn[3,64]", "")], "takes (lhs, rhs, lhs_scale"),
    ([("f8e4m3fn[4,64]", ""), ("f8e4m3fn[3,64]", ""), ("f8e8m0fnu[4,2]", ""), ("f8e8m0fnu[3,2]", ""),
      ("f32[2]", "")], "global_scale: a scalar"),
])
def test_block_scaled_dot_malformed_forms_say_so(operands, what):
    with pytest.raises(UnsupportedError, match="d.*" + what.replace("(", r"\(").replace("[", r"\[")):
        hloexec.load(_block_dot_text(operands, "f32[4,3]")).run(*_zeros_for(operands))


def _zeros_for(operands):
    return [np.zeros(tuple(int(d) for d in t.split("[")[1].rstrip("]").split(",") if d), np.float32).astype(
        {"f8e4m3fn": ml_dtypes.float8_e4m3fn, "f8e8m0fnu": ml_dtypes.float8_e8m0fnu, "f32": np.float32}[t.split("[")[0]])
        for t, _ in operands]
