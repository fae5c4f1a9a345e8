"""Elementwise ops against XLA:CPU, op x dtype, with special values.

Exactness: integer, pred, and every float op that IEEE rounds correctly (add ... divide, remainder,
sqrt, floor/ceil/round, max/min, compare, select, clamp, convert, bitcast-convert, reduce-precision) must
be bit-exact. Transcendental float ops (exp, log, sin, tanh, pow, atan2, erf, ...) may differ by at most
`ULP[op]` units in the last place of the result type (XLA:CPU uses its own polynomial approximations);
NaN must match NaN, and inf/zero must match exactly.

Denormals: XLA:CPU flushes f32/f64 denormal inputs and results to zero (FTZ/DAZ); hloexec does not (it
follows XLA's HloEvaluator). So float results are compared as flush(ours(flush(inputs))) == xla(inputs).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hloexec.ops.elementwise as ew
from hloexec.errors import UnsupportedError
from hloexec.ir.dtypes import ELEMENT_TYPES
from op_helpers import bits, flush_denormals, make_inst, run, run_xla
from xla_compare import as_if_xla_rounded_f64_to_f16_twice

pytestmark = pytest.mark.xla

BF16 = np.dtype(ml_dtypes.bfloat16)
SUB_BYTE_INT_TYPES = ["s2", "s4", "u2", "u4"]
INT_TYPES = ["s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64"] + SUB_BYTE_INT_TYPES
FLOAT_TYPES = ["f16", "bf16", "f32", "f64"]
SMALL_FLOAT_TYPES = ["f4e2m1fn", "f8e4m3fn", "f8e5m2"]       # computed in f32, rounded once
NP = {name: t.numpy for name, t in ELEMENT_TYPES.items() if t.numpy is not None}
N = 64

# max ULP difference allowed against XLA:CPU for approximated functions (measured; 0 = bit-exact)
# (f64 measured 0 ULP on these inputs; f32 erf/expm1/logistic/tanh 2 ULP; f16 expm1/logistic 1 ULP)
ULP = {"exponential": 1, "exponential-minus-one": 2, "log": 1, "log-plus-one": 1, "logistic": 2, "sine": 1,
       "cosine": 1, "tan": 1, "tanh": 2, "atan2": 1, "erf": 2, "power": 1, "cbrt": 1, "rsqrt": 1}


def values(t: str, n: int = N, seed: int = 0, positive: bool = False) -> np.ndarray:
    """n values of type t: the special values first, then random ones."""
    rng = np.random.default_rng(seed)
    dt = NP[t]
    if t == "pred":
        return rng.integers(0, 2, n).astype(bool)
    if ELEMENT_TYPES[t].is_integer:
        info = ml_dtypes.iinfo(dt)
        special = [0, 1, -1, 2, -2, 7, -7, info.min, info.max, info.min + 1, info.max - 1, 3, 8, 9, 63, 64]
        special = [s for s in special if info.min <= s <= info.max]
        rand = rng.integers(info.min, info.max, n, dtype=np.int64 if info.max < 2 ** 63 else dt, endpoint=True)
        small = rng.integers(max(info.min, -40), min(info.max, 40), n, endpoint=True)
        out = np.concatenate([np.array(special, np.int64 if info.max < 2 ** 63 else dt), small, rand])[:n].astype(dt)
        return np.abs(out).astype(dt) if positive and info.min < 0 else out
    if dt.kind == "c":
        re, im = values("f64", n, seed), values("f64", n, seed + 1)
        return (re + 1j * im).astype(dt)
    fin = ml_dtypes.finfo(dt)
    special = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.0,
               float(fin.max), -float(fin.max), float(fin.tiny), -float(fin.tiny), float(fin.smallest_subnormal),
               float(fin.eps), 1e-3, 100.0, -100.0, 0.49999997, 1 / 3, np.pi, -np.e, 40.0, -40.0, 88.0]
    rand = np.concatenate([rng.standard_normal(n) * 3, rng.standard_normal(n) * 1e3,
                           np.exp(rng.uniform(-20, 20, n)) * rng.choice([-1, 1], n)])
    rng.shuffle(rand)
    with np.errstate(over="ignore"):
        out = np.concatenate([np.array(special), rand])[:n].astype(dt)
    return np.abs(out) if positive else out


def ulp_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in representable values between same-typed floats a and b (0 where both NaN)."""
    sdt = np.dtype(f"i{a.dtype.itemsize}")
    ia, ib = a.view(sdt).astype(np.int64), b.view(sdt).astype(np.int64)
    mn = np.iinfo(sdt).min
    ka = np.where(ia < 0, mn - ia, ia)
    kb = np.where(ib < 0, mn - ib, ib)
    d = np.abs(ka.astype(np.float64) - kb.astype(np.float64))
    both_nan = np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))
    return np.where(both_nan, 0, d)


MAX_SEEN: dict = {}


def _denormal(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64, BF16):
        return np.zeros(x.shape, bool)
    f = x.astype(np.float64) if x.dtype == BF16 else x
    tiny = np.finfo(np.float32 if x.dtype == BF16 else x.dtype).tiny
    return (f != 0) & (np.abs(f) < tiny)


def check(inst, inputs, ulp: int = 0):
    ref = run_xla(inst, *inputs)
    dt = inst.shape.dtype
    if inst.opcode == "convert" and np.asarray(inputs[0]).dtype == np.float64 and dt == np.float16:
        ref = as_if_xla_rounded_f64_to_f16_twice(inputs[0], ref)
    ftz_types = (np.float32, np.float64, np.complex64, np.complex128, BF16)
    orig = inputs
    # XLA:CPU reads f32/f64 (and bf16, computed in f32) denormals as zero, except in bit-level ops and
    # in bf16 -> pred, which it decides on the bf16 bits (bf16 denormal -> true, f32 denormal -> false).
    daz = inst.opcode != "bitcast-convert" and not (inst.opcode == "convert" and inputs[0].dtype == BF16
                                                     and dt == np.bool_)
    if daz and any(np.asarray(x).dtype in ftz_types for x in inputs):
        inputs = [flush_denormals(x) for x in inputs]
    ours = run(inst, *inputs)
    if inst.opcode != "bitcast-convert" and dt in ftz_types:
        ours, ref = flush_denormals(ours), flush_denormals(ref)   # and flushes results (FTZ)
    assert isinstance(ours, np.ndarray) and ours.dtype == dt and ours.shape == inst.shape.dims
    assert ours.flags.c_contiguous
    if dt.kind == "c":
        # complex multiply: XLA:CPU contracts a*d + b*c into an FMA, numpy does not; they differ in
        # cancelling sums (seen: 5e-7 relative in c64), so complex results get a tolerance.
        rtol, atol = (2e-6, 1e-30) if dt == np.complex64 else (1e-14, 1e-300)
        for part in ("real", "imag"):
            o, r = getattr(ours, part).astype(np.float64), getattr(ref, part).astype(np.float64)
            scale = np.abs(r[np.isfinite(r)]).max(initial=0)
            np.testing.assert_allclose(o, r, rtol=rtol, atol=max(atol, scale * rtol), equal_nan=True)
        return
    if ulp == 0 or dt.kind not in "fV" and dt != BF16:
        bad = bits(ours) != bits(ref)
        if dt.kind == "f" or dt == BF16 or dt.type.__module__.startswith("ml_dtypes"):
            fo, fr = ours.astype(np.float64), ref.astype(np.float64)
            bad &= ~(np.isnan(fo) & np.isnan(fr))      # any NaN payload is fine
        assert not bad.any(), _report(inst, inputs, ours, ref, bad)
    else:
        fo, fr = ours.astype(np.float64), ref.astype(np.float64)
        special = ~np.isfinite(fr) | (fr == 0) | ~np.isfinite(fo) | (fo == 0)
        bad = special & (bits(ours) != bits(ref)) & ~(np.isnan(fo) & np.isnan(fr))
        d = np.where(special, 0, ulp_diff(ours, ref))
        # XLA:CPU's approximations misbehave on denormal inputs it reads as 0 (cbrt(1e-45) = -5.6e-16,
        # atan2(1e-45, 1e-45) = NaN); those positions are not compared for approximated functions.
        skip = np.zeros(ours.shape, bool)
        for x in orig:
            if np.shape(x) == ours.shape:
                skip |= _denormal(x)
        bad = (bad | (d > ulp)) & ~skip
        key = (inst.opcode, inst.shape.element_type.name)
        MAX_SEEN[key] = max(MAX_SEEN.get(key, 0), float(np.max(np.where(skip, 0, d), initial=0)))
        assert not bad.any(), _report(inst, inputs, ours, ref, bad)


def _report(inst, inputs, ours, ref, bad):
    i = np.flatnonzero(bad)[:8]
    ins = ", ".join(f"in{k}={np.asarray(x).ravel()[i]!r}" for k, x in enumerate(inputs) if np.ndim(x))
    return f"{inst.opcode} {inst.shape.to_text()}: {bad.sum()} mismatches at {i}: {ins}\n ours={ours.ravel()[i]!r}\n xla ={ref.ravel()[i]!r}"


def unary(opc, t, out=None, **attrs):
    return make_inst(opc, f"{out or t}[{N}]", [f"{t}[{N}]"], **attrs)


def binary(opc, t, out=None, **attrs):
    return make_inst(opc, f"{out or t}[{N}]", [f"{t}[{N}]", f"{t}[{N}]"], **attrs)


# -- unary -----------------------------------------------------------------------------------------------
FLOAT_UNARY = ["abs", "negate", "sign", "floor", "ceil", "round-nearest-afz", "round-nearest-even", "sqrt",
               "rsqrt", "cbrt", "exponential", "exponential-minus-one", "log", "log-plus-one", "logistic", "sine",
               "cosine", "tan", "tanh", "erf"]


@pytest.mark.parametrize("t", FLOAT_TYPES)
@pytest.mark.parametrize("opc", FLOAT_UNARY)
def test_float_unary(opc, t):
    x = values(t)
    if opc in ("sine", "cosine", "tan"):
        x = np.where(np.abs(x.astype(np.float64)) > 1e4, x.dtype.type(1.25), x).astype(x.dtype)
    check(unary(opc, t), [x], ULP.get(opc, 0))


@pytest.mark.parametrize("t", FLOAT_TYPES)
def test_is_finite(t):
    check(unary("is-finite", t, out="pred"), [values(t)])


@pytest.mark.parametrize("t", INT_TYPES)
@pytest.mark.parametrize("opc", ["abs", "negate", "sign", "not", "popcnt", "count-leading-zeros"])
def test_int_unary(opc, t):
    if t.startswith("u") and opc in ("abs", "sign"):
        # XLA:CPU's StableHLO route rejects abs/sign of unsigned types; HLO defines abs(x) = x, sign in {0, 1}
        x = values(t)
        expected = x if opc == "abs" else (x != 0).astype(x.dtype)
        np.testing.assert_array_equal(run(unary(opc, t), x), expected)
        return
    if opc == "popcnt" and t == "s4":
        # The spec counts the bits of the 4-bit value (s4 popcnt(-3) = 3); XLA:CPU counts those of the
        # sign-extended byte (7), i.e. 4 more for a negative value (wrapped to s4). hloexec keeps the spec's answer
        # (XLA:CPU gives it for s2).
        x = values(t)
        pattern = x.astype(np.int64) & 0xF
        ours = run(unary(opc, t), x)
        counts = np.array([bin(v).count("1") for v in pattern]).astype(x.dtype)
        np.testing.assert_array_equal(ours.view(np.uint8), counts.view(np.uint8))
        xla = run_xla(unary(opc, t), x)
        byte_count = (counts.astype(np.int64) + np.where(x.astype(np.int64) < 0, 4, 0)).astype(x.dtype)
        np.testing.assert_array_equal(xla.view(np.uint8), byte_count.view(np.uint8))
        return
    check(unary(opc, t), [values(t)])


def test_pred_not():
    check(unary("not", "pred"), [values("pred")])


@pytest.mark.parametrize("t,ct", [("f32", "c64"), ("f64", "c128")])
def test_complex_parts(t, ct):
    re, im = values(t, seed=1), values(t, seed=2)
    check(binary("complex", t, out=ct), [re, im])
    z = np.empty(re.shape, NP[ct])
    z.real, z.imag = re, im
    check(unary("real", ct, out=t), [z])
    check(unary("imag", ct, out=t), [z])
    check(unary("abs", ct, out=t), [z], ulp=1)
    for opc in ("add", "subtract", "multiply"):
        check(binary(opc, ct), [z, z[::-1].copy()])


# -- binary ----------------------------------------------------------------------------------------------
FLOAT_BINARY = ["add", "subtract", "multiply", "divide", "remainder", "power", "maximum", "minimum", "atan2"]
INT_BINARY = ["add", "subtract", "multiply", "divide", "remainder", "power", "maximum", "minimum", "and", "or",
              "xor", "shift-left", "shift-right-arithmetic", "shift-right-logical"]


@pytest.mark.parametrize("t", FLOAT_TYPES)
@pytest.mark.parametrize("opc", FLOAT_BINARY)
def test_float_binary(opc, t):
    a, b = values(t, seed=1), values(t, seed=2)
    b[:12] = a[:12]                 # equal pairs (0,0), (-0,-0), (inf,inf), (nan,nan)
    b[30:42] = values(t)[:12][::-1]  # crossed pairs (0,-0), (-0,0), (inf,-inf), (1,nan)...
    if opc == "power":              # interesting exponents: integers, halves, +-inf, nan
        b[42:56] = np.array([0, -0.0, 1, -1, 2, -2, 0.5, -0.5, 3, np.inf, -np.inf, np.nan, 10, -3]).astype(b.dtype)
    check(binary(opc, t), [a, b], ULP.get(opc, 0))


@pytest.mark.parametrize("t", INT_TYPES)
@pytest.mark.parametrize("opc", INT_BINARY)
def test_int_binary(opc, t):
    a, b = values(t, seed=0), values(t, seed=3)
    dt = NP[t]
    info = ml_dtypes.iinfo(dt)
    signed = info.min < 0
    # divisors 0 and -1 against INT_MIN and others; shifts by 0..2*bits and huge/negative amounts
    b[:16] = np.array([0, 0, 0, -1 if signed else 1, -1 if signed else 0, 0, 2, 3,
                       0, 1, 5, 0, 0, 1, 0, 0]).astype(dt)
    if opc.startswith("shift"):
        bw = ELEMENT_TYPES[t].bits
        b[16:48] = np.array([0, 1, bw - 1, bw, bw + 1, 2 * bw, info.max, info.min, 3, bw - 2, 5, 200 % (info.max + 1),
                             127 % (info.max + 1), 65 % (info.max + 1), 31, 33] * 2).astype(dt)
        if signed:
            b[48:52] = np.array([-1, -3, -bw, -(bw + 1)]).astype(dt)
    if opc == "power":
        b[16:48] = np.tile(np.arange(-4, 12), 2).astype(dt) if signed else np.tile(np.arange(16), 2).astype(dt)
        a[16:48] = np.repeat(np.array([-2, -1, 0, 1, 2, 3, 7, -7] if signed else [0, 1, 2, 3, 7, 9, 11, 255]),
                             4).astype(dt)
    check(binary(opc, t), [a, b])


@pytest.mark.parametrize("t", INT_TYPES)
def test_mulhi(t):
    """The high half of the double-width product, against jax.lax.mulhi on XLA:CPU (whose HLO -> StableHLO route,
    run_xla's, lacks the opcode). s4 / u4: the high 4 bits of the 8-bit product, as jax documents it; XLA:CPU
    computes the s8 op on the widened values (the high byte of the 16-bit product: 0 for every s4 pair)."""
    import jax
    a, b = values(t, seed=1), values(t, seed=2)
    b[:16] = a[:16]
    ours = run(binary("mulhi", t), a, b)
    bits, info = ELEMENT_TYPES[t].bits, ml_dtypes.iinfo(NP[t])
    exact = [(int(x) * int(y)) >> bits for x, y in zip(a, b)]
    np.testing.assert_array_equal([int(v) for v in ours], [v - (1 << bits) if v > info.max else v for v in exact])
    if bits >= 8:
        np.testing.assert_array_equal(ours, np.asarray(jax.jit(jax.lax.mulhi)(a, b)))


@pytest.mark.parametrize("opc", ["and", "or", "xor", "maximum", "minimum"])
def test_pred_binary(opc):
    check(binary(opc, "pred"), [values("pred", seed=1), values("pred", seed=2)])


# -- compare / select / clamp ----------------------------------------------------------------------------
DIRECTIONS = ["EQ", "NE", "LT", "LE", "GT", "GE"]


@pytest.mark.parametrize("t", ["pred"] + INT_TYPES + FLOAT_TYPES)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_compare(direction, t):
    a, b = values(t, seed=1), values(t, seed=2)
    b[:16] = a[:16]
    b[30:42] = values(t)[:12][::-1]
    types = [None]
    if t in FLOAT_TYPES:
        types = [None, "TOTALORDER"]
    elif t in INT_TYPES:
        types = [None, "SIGNED" if t.startswith("s") else "UNSIGNED"]
    for ctype in types:
        attrs = {"direction": direction} | ({"type": ctype} if ctype else {})
        check(binary("compare", t, out="pred", **attrs), [a, b])


def test_compare_totalorder_nan_sign():
    nan_neg = np.array([np.nan], np.float32)
    nan_neg = -nan_neg
    x = np.array([-np.inf, -0.0, 0.0, np.inf, np.nan, nan_neg[0], -1.0, 1.0], np.float32)
    a, b = np.repeat(x, 8), np.tile(x, 8)
    inst = make_inst("compare", "pred[64]", ["f32[64]", "f32[64]"], direction="LT", type="TOTALORDER")
    check(inst, [a, b])


@pytest.mark.parametrize("t", ["pred", "s8", "u32", "s64", "f16", "bf16", "f32", "f64"])
def test_select(t):
    p, a, b = values("pred", seed=5), values(t, seed=1), values(t, seed=2)
    check(make_inst("select", f"{t}[{N}]", [f"pred[{N}]", f"{t}[{N}]", f"{t}[{N}]"]), [p, a, b])
    for s in (True, False):
        ps = np.array(s)
        check(make_inst("select", f"{t}[{N}]", ["pred[]", f"{t}[{N}]", f"{t}[{N}]"]), [ps, a, b])


@pytest.mark.parametrize("t", ["s8", "u16", "s32", "u64", "f16", "bf16", "f32", "f64"])
def test_clamp(t):
    lo, x, hi = values(t, seed=1), values(t, seed=2), values(t, seed=3)
    check(make_inst("clamp", f"{t}[{N}]", [f"{t}[{N}]"] * 3), [lo, x, hi])
    lo_s, hi_s = np.array(values(t, seed=4)[9]), np.array(values(t, seed=4)[10])
    check(make_inst("clamp", f"{t}[{N}]", [f"{t}[]", f"{t}[{N}]", f"{t}[]"]), [lo_s, x, hi_s])
    check(make_inst("clamp", f"{t}[{N}]", [f"{t}[]", f"{t}[{N}]", f"{t}[]"]), [hi_s, x, lo_s])


# -- convert ---------------------------------------------------------------------------------------------
CONVERT_TYPES = ["pred"] + INT_TYPES + FLOAT_TYPES


@pytest.mark.parametrize("src", CONVERT_TYPES)
def test_convert(src):
    x = values(src, n=N)
    if src in FLOAT_TYPES:      # values around every integer type's bounds
        with np.errstate(over="ignore"):
            x[30:64] = np.array([127.5, 128, -128.5, -129, 255.5, 256, 32767.5, 32768, 65535.5, 65536, 2.0 ** 31,
                             -2.0 ** 31, 2.0 ** 31 - 128, 2.0 ** 32, 2.0 ** 63, -2.0 ** 63, 2.0 ** 64, 1e30, -1e30,
                             -0.9, 0.9, -1.5, 1e-30, 4294967040.0, 2.0 ** 62, 9.3e18, -9.3e18, 1.7e19, 6e4, 65504,
                                 65520, 3.39e38, 1 + 2.0 ** -8 + 2.0 ** -30, 1 + 2.0 ** -11 + 2.0 ** -40]
                                ).astype(x.dtype)
    if src in INT_TYPES:
        ints = [16777217, -16777217, 2 ** 31 - 1, 65519, 65520, 33554435, 2 ** 62 + 2 ** 40 + 1, 2 ** 53 + 1,
                257, 2049, 4097]
        dt = NP[src]
        info = ml_dtypes.iinfo(dt)
        x[30:30 + len(ints)] = np.array([v if info.min <= v <= info.max else v % (info.max + 1) for v in ints]
                                        ).astype(dt)
    for dst in CONVERT_TYPES:
        check(make_inst("convert", f"{dst}[{N}]", [f"{src}[{N}]"]), [x])


@pytest.mark.parametrize("src", ["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("dst", ["f8e4m3fn", "f8e5m2"])
def test_convert_fp8(src, dst):
    x = values(src)
    check(make_inst("convert", f"{dst}[{N}]", [f"{src}[{N}]"]), [x])
    with np.errstate(over="ignore"):
        y = x.astype(ml_dtypes.float8_e4m3fn if dst == "f8e4m3fn" else ml_dtypes.float8_e5m2)
    check(make_inst("convert", f"{src}[{N}]", [f"{dst}[{N}]"]), [y])


@pytest.mark.parametrize("dst", ["bf16", "f16", "f8e4m3fn", "f8e5m2"])
def test_convert_f64_double_rounding(dst):
    """XLA:CPU rounds f64 -> f16/bf16 through f32 (two roundings) but f64 -> fp8 once (f16: on hosts without
    AVX512-FP16, see as_if_xla_rounded_f64_to_f16_twice).

    1 + 2^-k + 2^-30 is above a halfway point in f64 but a tie once rounded to f32."""
    x = np.array([1 + 2.0 ** -k + s * 2.0 ** -30 for k in (3, 4, 8, 11) for s in (1, -1, 0)]
                 + [1e300, -1e300, 1e-300], np.float64)
    check(make_inst("convert", f"{dst}[{len(x)}]", [f"f64[{len(x)}]"]), [x])


@pytest.mark.parametrize("src,dst,inshape,outshape", [
    ("f32", "s32", "[64]", "[64]"), ("s32", "f32", "[64]", "[64]"), ("u16", "f16", "[64]", "[64]"),
    ("bf16", "s16", "[64]", "[64]"), ("f64", "u64", "[64]", "[64]"),
    ("f32", "u8", "[64]", "[64,4]"), ("f64", "s16", "[64]", "[64,4]"), ("s32", "bf16", "[64]", "[64,2]"),
    ("u8", "f32", "[16,4]", "[16]"), ("s16", "f64", "[16,4]", "[16]"), ("bf16", "u32", "[32,2]", "[32]"),
    # sub-byte types: a wider element holds the narrower ones lowest bits first
    ("s8", "s4", "[64]", "[64,2]"), ("s4", "s8", "[32,2]", "[32]"), ("s4", "u4", "[64]", "[64]"),
    ("u4", "s4", "[64]", "[64]"), ("f16", "s4", "[64]", "[64,4]"), ("s4", "f16", "[16,4]", "[16]"),
    ("s16", "u4", "[64]", "[64,4]"), ("u8", "u2", "[64]", "[64,4]"), ("u2", "s8", "[16,4]", "[16]"),
    ("u8", "f4e2m1fn", "[64]", "[64,2]"), ("f4e2m1fn", "u8", "[32,2]", "[32]"), ("s4", "f4e2m1fn", "[64]", "[64]"),
])
def test_bitcast_convert(src, dst, inshape, outshape):
    from op_helpers import shape
    x = values(src if src not in INT_TYPES else src, n=64)
    x = x.reshape(shape(f"{src}{inshape}").dims)
    check(make_inst("bitcast-convert", f"{dst}{outshape}", [f"{src}{inshape}"]), [x])


@pytest.mark.parametrize("t", FLOAT_TYPES)
@pytest.mark.parametrize("e,m", [(8, 7), (5, 10), (4, 3), (5, 2), (11, 52), (8, 23), (3, 0), (2, 1), (10, 20)])
def test_reduce_precision(t, e, m):
    x = values(t, seed=7)
    x[40:48] = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 65504, 65520, 6.1e-5, 6.0e-5, 3e38, 1e-39]).astype(x.dtype)
    check(unary("reduce-precision", t, exponent_bits=e, mantissa_bits=m), [x])


# -- f4 / fp8: computed in f32, rounded once ------------------------------------------------------------
@pytest.mark.parametrize("t", SMALL_FLOAT_TYPES)
def test_small_float_ops(t):
    x, y = values(t, seed=1), values(t, seed=2)
    for opc in ["abs", "negate", "sign", "floor", "ceil", "round-nearest-afz", "round-nearest-even", "sqrt"]:
        check(unary(opc, t), [x])
    for opc in ["add", "subtract", "multiply", "divide", "maximum", "minimum"]:
        check(binary(opc, t), [x, y])
    for direction in DIRECTIONS:
        check(binary("compare", t, out="pred", direction=direction), [x, y])
    for other in ["f32", "f16", "bf16", "s32", "s4", "u4", "u8"]:
        check(make_inst("convert", f"{other}[{N}]", [f"{t}[{N}]"]), [x])
        check(make_inst("convert", f"{t}[{N}]", [f"{other}[{N}]"]), [values(other, seed=3)])


@pytest.mark.parametrize("t", ["f6e2m3fn", "f6e3m2fn"])
def test_f6_ops_round_the_exact_result_once(t):
    """XLA:CPU does not take the 6-bit floats: their ops must round the exact result once (these values' sums,
    products and square roots are exact in f32), a NaN -- which they cannot hold -- to -0 as f4e2m1fn's does."""
    x, y = values(t, seed=1), values(t, seed=2)
    xf, yf = x.astype(np.float64), y.astype(np.float64)

    def rounded(v):
        v = np.asarray(v, np.float64)
        return np.where(np.isnan(v), -0.0, v).astype(np.float32).astype(NP[t])
    with np.errstate(all="ignore"):
        for opc, want in [("add", xf + yf), ("subtract", xf - yf), ("multiply", xf * yf),
                          ("maximum", np.maximum(xf, yf)), ("sqrt", np.sqrt(xf))]:
            inst = unary(opc, t) if opc == "sqrt" else binary(opc, t)
            got = run(inst, x) if opc == "sqrt" else run(inst, x, y)
            np.testing.assert_array_equal(got.view(np.uint8), rounded(want).view(np.uint8), err_msg=opc)
    np.testing.assert_array_equal(run(binary("compare", t, out="pred", direction="LT"), x, y), xf < yf)
    np.testing.assert_array_equal(run(make_inst("convert", f"f32[{N}]", [f"{t}[{N}]"]), x), xf.astype(np.float32))
    wide = values("f32", seed=3)
    np.testing.assert_array_equal(run(make_inst("convert", f"{t}[{N}]", [f"f32[{N}]"]), wide).view(np.uint8),
                                  rounded(wide).view(np.uint8))


# -- unsupported combinations say so -------------------------------------------------------------------
def test_unsupported_is_clear():
    with pytest.raises(UnsupportedError, match="atan2"):
        run(binary("atan2", "s32"), values("s32"), values("s32"))
    with pytest.raises(UnsupportedError, match="compare direction"):
        run(binary("compare", "s32", out="pred", direction="XX"), values("s32"), values("s32"))


def test_registered():
    from hloexec.ops.registry import OPS
    for opc in ew.OPCODES:
        assert opc in OPS


def teardown_module(module):
    import os
    if os.environ.get("HLOEXEC_SHOW_ULP"):
        for k, v in sorted(MAX_SEEN.items()):
            print("ULP", k, v)
