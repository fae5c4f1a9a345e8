"""hloexec.kernels.fusion: fused computations built as IR, checked against numpy evaluations that round
after every op (bit-exact for f16 / bf16 / ints and exact f32 ops; 1-2 ULP for f32 transcendentals)."""
import os
import re
import subprocess
import sys
import textwrap
import time

import ml_dtypes
import numpy as np
import pytest

from hloexec.errors import TierUnsupported
from hloexec.kernels import fusion
from hloexec.kernels.irbuild import Builder
from hloexec.options import Options

BF16 = ml_dtypes.bfloat16


def rng():
    return np.random.default_rng(0)


def bits_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    return np.array_equal(a.view(f"u{a.dtype.itemsize}") if a.dtype.kind in "fV" or a.dtype == BF16 else a,
                          b.view(f"u{b.dtype.itemsize}") if b.dtype.kind in "fV" or b.dtype == BF16 else b)


def ulp_close(got, want, ulps=2):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    gi = got.view(np.int32).astype(np.int64)
    wi = want.view(np.int32).astype(np.int64)
    gi = np.where(gi < 0, -(gi & 0x7FFFFFFF), gi)
    wi = np.where(wi < 0, -(wi & 0x7FFFFFFF), wi)
    return np.all((np.abs(gi - wi) <= ulps) | (np.isnan(got) & np.isnan(want)))


# -- fusions --------------------------------------------------------------------------------------------
def adam(n, name_suffix=""):
    b = Builder("fused_adam" + name_suffix)
    s = f"f32[{n}]"
    p, m, v, g = b.param(0, s), b.param(1, s), b.param(2, s), b.param(3, f"f16[{n}]")
    lr = b.param(4, "f32[]")

    def bc(x):
        return b.op("broadcast", s, x, dimensions="{}")

    def c(val):
        return bc(b.const("f32[]", val))
    gf = b.op("convert", s, g)
    m2 = b.op("add", s, b.op("multiply", s, m, c("0.9")), b.op("multiply", s, gf, c("0.1")))
    v2 = b.op("add", s, b.op("multiply", s, v, c("0.999")),
              b.op("multiply", s, b.op("multiply", s, gf, gf), c("0.001")))
    upd = b.op("divide", s, b.op("multiply", s, m2, bc(lr)), b.op("add", s, b.op("sqrt", s, v2), c("1e-08")))
    p2 = b.op("subtract", s, p, upd)
    return b.build(b.op("tuple", f"({s}, {s}, {s})", p2, m2, v2))


def adam_numpy(p, m, v, g, lr):
    f = np.float32
    g = g.astype(f)
    m2 = m * f(0.9) + g * f(0.1)
    v2 = v * f(0.999) + (g * g) * f(0.001)
    return p - (m2 * lr) / (np.sqrt(v2) + f(1e-8)), m2, v2


def adam_args(n):
    r = rng()
    return [r.standard_normal(n, dtype=np.float32), r.standard_normal(n, dtype=np.float32),
            r.random(n, dtype=np.float32), r.standard_normal(n, dtype=np.float32).astype(np.float16),
            np.float32(0.01)]


@pytest.mark.parametrize("n,parallel", [(1000, False), (1000, True), (200_003, None)])
def test_adam_bit_exact(n, parallel):
    k = fusion.compile_fusion(adam(n), parallel=parallel)
    assert k is not None and k.is_tuple
    args = adam_args(n)
    got = k(*args)
    for a, b in zip(got, adam_numpy(*args)):
        assert bits_equal(a, b)
    if parallel is None:
        assert k.parallel


def test_read_only_and_writable_operands_share_one_specialisation(monkeypatch):
    """Numba types a read-only array (a constant, a caller's read-only input) apart from a writable one: the
    kernel is compiled once for both, not a second time at the first read-only call (issue 17: seconds of
    the compiling run), and its outputs stay writable. (Through Numba: a direct kernel has one signature.)"""
    monkeypatch.setenv("HLOEXEC_DIRECT_KERNELS", "0")
    k = fusion.compile_fusion(adam(1000))
    args = adam_args(1000)
    frozen = [np.array(a) for a in args]
    for a in frozen:
        a.flags.writeable = False
    want = adam_numpy(*args)
    for operands in (args, frozen, args):
        got = k(*operands)
        assert all(bits_equal(g, w) and g.flags.writeable for g, w in zip(got, want))
    assert len(k.fn.overloads) == 1, k.fn.signatures


def test_structurally_equal_fusion_hits_in_process_cache():
    k1 = fusion.compile_fusion(adam(512, ".a"))
    t = time.perf_counter()
    k2 = fusion.compile_fusion(adam(512, ".b"))          # different names, same structure
    dt = time.perf_counter() - t
    assert k1.key == k2.key and k1.fn is k2.fn
    assert "adam" not in k1.source and "multiply" not in k1.source
    assert dt < 0.05, dt


def test_disk_cache_in_a_fresh_process(tmp_path):
    """Numba's disk cache (kernels/direct.py's object files: tests/test_kernels_direct.py)."""
    script = textwrap.dedent(f"""
        import sys, time, json
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        t0 = time.perf_counter()
        from hloexec.kernels import fusion
        from test_kernels_fusion import adam, adam_args
        t1 = time.perf_counter()
        k = fusion.compile_fusion(adam(777))
        t2 = time.perf_counter()
        out = k(*adam_args(777))
        print(json.dumps({{"key": k.key, "import": t1 - t0, "compile": t2 - t1, "hits": sum(k.fn.stats.cache_hits.values()),
                          "misses": sum(k.fn.stats.cache_misses.values())}}))
    """)
    env = dict(os.environ, HLOEXEC_CACHE_DIR=str(tmp_path), HLOEXEC_DIRECT_KERNELS="0")
    import json
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-P", "-c", script], env=env, capture_output=True, text=True, timeout=300,
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["key"] == second["key"] and (tmp_path / f"hx_{first['key']}.py").is_file()
    assert first["hits"] == 0 and second["hits"] >= 1 and second["misses"] == 0, runs
    assert second["compile"] < first["compile"], runs
    print(f"\ncompile {first['compile'] * 1e3:.0f} ms, load from disk cache {second['compile'] * 1e3:.0f} ms")


def layernorm_rows(rows, cols, et="f32"):
    """y = (x - mean(x, row)) * rsqrt(mean((x - mean)^2) + eps), with f32 accumulation for bf16 input."""
    b = Builder()
    x = b.param(0, f"{et}[{rows},{cols}]")
    s2, s1 = f"f32[{rows},{cols}]", f"f32[{rows}]"
    xf = b.op("convert", s2, x) if et != "f32" else x
    zero = b.const("f32[]", "0")
    inv = b.op("broadcast", s1, b.const("f32[]", repr(float(np.float32(1 / cols)))), dimensions="{}")
    mean = b.op("multiply", s1, b.reduce(s1, xf, zero, [1]), inv)
    d = b.op("subtract", s2, xf, b.op("broadcast", s2, mean, dimensions="{0}"))
    var = b.op("multiply", s1, b.reduce(s1, b.op("multiply", s2, d, d), zero, [1]), inv)
    eps = b.op("broadcast", s1, b.const("f32[]", "1e-05"), dimensions="{}")
    rs = b.op("rsqrt", s1, b.op("add", s1, var, eps))
    y = b.op("multiply", s2, d, b.op("broadcast", s2, rs, dimensions="{0}"))
    if et != "f32":
        y = b.op("convert", f"{et}[{rows},{cols}]", y)
    return b.build(y)


def test_layernorm_row_reduction():
    x = rng().standard_normal((64, 48), dtype=np.float32) * 3 + 1
    k = fusion.compile_fusion(layernorm_rows(64, 48))
    assert k is not None
    mean = x.astype(np.float64).mean(1, keepdims=True)
    d = x - mean
    want = d / np.sqrt((d * d).mean(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(k(x), want, rtol=2e-5, atol=2e-5)
    # each row's reductions are computed once per row, not once per element
    assert k.source.count("for ") == 4


def test_layernorm_bf16_rounds_at_the_end():
    xb = (rng().standard_normal((16, 48), dtype=np.float32) * 2).astype(BF16)
    k = fusion.compile_fusion(layernorm_rows(16, 48, "bf16"))
    got = k(xb)
    assert got.dtype == BF16
    x = xb.astype(np.float64)
    d = x - x.mean(1, keepdims=True)
    want = (d / np.sqrt((d * d).mean(1, keepdims=True) + 1e-5)).astype(np.float32).astype(BF16)
    assert np.max(np.abs(got.astype(np.float32) - want.astype(np.float32))) <= 2 ** -6


def test_softmax_exp_subtract_max():
    b = Builder()
    s2, s1 = "f32[32,100]", "f32[32]"
    x = b.param(0, s2)
    mx = b.reduce(s1, x, b.const("f32[]", "-inf"), [1], "maximum")
    e = b.op("exponential", s2, b.op("subtract", s2, x, b.op("broadcast", s2, mx, dimensions="{0}")))
    sm = b.reduce(s1, e, b.const("f32[]", "0"), [1], "add")
    y = b.op("divide", s2, e, b.op("broadcast", s2, sm, dimensions="{0}"))
    k = fusion.compile_fusion(b.build(y))
    xv = rng().standard_normal((32, 100), dtype=np.float32) * 4
    xv[3, 7] = np.nan
    got = k(xv)
    ex = np.exp(xv - np.max(xv, 1, keepdims=True))
    want = ex / ex.sum(1, keepdims=True)
    assert np.all(np.isnan(got[3]))          # max propagates NaN
    mask = np.ones(32, bool)
    mask[3] = False
    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-5, atol=1e-7)


def test_column_reduction_to_bf16():
    b = Builder()
    x = b.param(0, "bf16[16,48]")
    xf = b.op("convert", "f32[16,48]", x)
    r = b.reduce("f32[48]", xf, b.const("f32[]", "0"), [0])
    k = fusion.compile_fusion(b.build(b.op("convert", "bf16[48]", r)))
    xv = rng().standard_normal((16, 48), dtype=np.float32).astype(BF16)
    want = np.zeros(48, np.float32)
    for i in range(16):
        want = want + xv[i].astype(np.float32)
    assert bits_equal(k(xv), want.astype(BF16))


def test_transpose_add_and_bitcast_with_layout():
    b = Builder()
    a = b.param(0, "f32[8,16]")
    c = b.param(1, "f32[16,8]")
    t = b.op("transpose", "f32[16,8]", a, dimensions="{1,0}")
    s = b.op("add", "f32[16,8]", t, c)
    # a bitcast that is a physical no-op but a logical transpose: f32[8,16]{0,1} over f32[16,8]{1,0}
    bt = b.op("bitcast", "f32[8,16]{0,1}", s)
    r = b.op("reshape", "f32[2,4,16]", b.op("copy", "f32[8,16]", bt))
    k = fusion.compile_fusion(b.build(r))
    av = rng().standard_normal((8, 16), dtype=np.float32)
    cv = rng().standard_normal((16, 8), dtype=np.float32)
    assert bits_equal(k(av, cv), (av.T + cv).T.reshape(2, 4, 16))


def test_dynamic_slice_clamps_start_indices():
    b = Builder()
    x = b.param(0, "f32[10,6]")
    i, j = b.param(1, "s32[]"), b.param(2, "s32[]")
    ds = b.op("dynamic-slice", "f32[3,4]", x, i, j, dynamic_slice_sizes="{3,4}")
    k = fusion.compile_fusion(b.build(b.op("negate", "f32[3,4]", ds)))
    xv = np.arange(60, dtype=np.float32).reshape(10, 6)
    for si, sj in [(0, 0), (2, 1), (9, 5), (-3, 100), (7, 2)]:
        ci, cj = min(max(si, 0), 7), min(max(sj, 0), 2)
        assert bits_equal(k(xv, np.int32(si), np.int32(sj)), -xv[ci:ci + 3, cj:cj + 4])


def test_slice_reverse_pad_concatenate_iota():
    b = Builder()
    x = b.param(0, "f32[10]")
    y = b.param(1, "f32[4]")
    sl = b.op("slice", "f32[4]", x, slice="{[1:9:2]}")
    rv = b.op("reverse", "f32[4]", y, dimensions="{0}")
    cat = b.op("concatenate", "f32[8]", sl, rv, dimensions="{0}")
    pd = b.op("pad", "f32[13]", cat, b.const("f32[]", "-1"), padding="2_-1_1")
    io = b.op("convert", "f32[13]", b.op("iota", "s32[13]", iota_dimension="0"))
    k = fusion.compile_fusion(b.build(b.op("add", "f32[13]", pd, io)))
    assert k is not None
    xv = rng().standard_normal(10, dtype=np.float32)
    yv = rng().standard_normal(4, dtype=np.float32)
    cat_v = np.concatenate([xv[1:9:2], yv[::-1]])
    padded = np.full(2 + 8 + 7, -1, np.float32)
    padded[2::2] = cat_v
    padded = padded[:13]
    assert bits_equal(k(xv, yv), padded + np.arange(13, dtype=np.float32))


def test_multi_output_elementwise_and_different_dims():
    b = Builder()
    x = b.param(0, "f16[4,5]")
    y = b.param(1, "f16[4,5]")
    s = b.op("add", "f16[4,5]", x, y)
    p = b.op("multiply", "f16[4,5]", s, x)
    c = b.op("compare", "pred[4,5]", p, y, direction="GT")
    k = fusion.compile_fusion(b.build(b.op("tuple", "(f16[4,5], f16[4,5], pred[4,5])", s, p, c)))
    xv = (rng().standard_normal((4, 5)) * 100).astype(np.float16)
    yv = (rng().standard_normal((4, 5)) * 100).astype(np.float16)
    xv, yv = xv / 4, yv / 4       # keep products finite
    gs, gp, gc = k(xv, yv)
    ws = xv + yv                  # numpy f16 arithmetic rounds after every op
    wp = ws * xv
    assert bits_equal(gs, ws) and bits_equal(gp, wp) and np.array_equal(gc, wp > yv)

    b = Builder()
    x = b.param(0, "f32[4,5]")
    r = b.reduce("f32[4]", x, b.const("f32[]", "0"), [1])
    with pytest.raises(TierUnsupported, match="outputs of different dims"):
        fusion.compile_fusion(b.build(b.op("tuple", "(f32[4,5], f32[4])", x, r)))


def test_f16_per_op_rounding_vs_excess_precision():
    b = Builder()
    x = b.param(0, "f16[1000]")
    y = b.param(1, "f16[1000]")
    t = b.op("multiply", "f16[1000]", x, y)
    u = b.op("add", "f16[1000]", t, x)
    e = b.op("exponential", "f16[1000]", b.op("negate", "f16[1000]", b.op("abs", "f16[1000]", u)))
    comp = b.build(e)
    xv = rng().standard_normal(1000).astype(np.float16)
    yv = (rng().standard_normal(1000) * 3).astype(np.float16)
    got = fusion.compile_fusion(comp)(xv, yv)
    u16 = xv * yv + xv
    want = np.exp(-np.abs(u16).astype(np.float32)).astype(np.float16)
    assert bits_equal(got, want)
    ex = fusion.compile_fusion(comp, Options(excess_precision=True))(xv, yv)
    u32 = xv.astype(np.float32) * yv.astype(np.float32) + xv.astype(np.float32)
    assert bits_equal(ex, np.exp(-np.abs(u32)).astype(np.float16))


def test_bf16_per_op_rounding():
    b = Builder()
    x = b.param(0, "bf16[300]")
    y = b.param(1, "bf16[300]")
    d = b.op("divide", "bf16[300]", b.op("subtract", "bf16[300]", x, y), y)
    m = b.op("maximum", "bf16[300]", d, b.op("sqrt", "bf16[300]", b.op("abs", "bf16[300]", x)))
    k = fusion.compile_fusion(b.build(m))
    xv = (rng().standard_normal(300) * 10).astype(BF16)
    yv = (rng().standard_normal(300)).astype(BF16)
    xv[5] = np.nan
    r = lambda a: a.astype(np.float32).astype(BF16)  # noqa: E731
    f = lambda a: a.astype(np.float32)               # noqa: E731
    d = r(f(r(f(xv) - f(yv))) / f(yv))
    s = r(np.sqrt(np.abs(f(xv))))
    want = np.where(np.isnan(f(d)) | np.isnan(f(s)), np.float32(np.nan), np.maximum(f(d), f(s))).astype(BF16)
    assert bits_equal(k(xv, yv), want)


def test_f32_transcendentals_within_2_ulp():
    ops = ["exponential", "log", "tanh", "logistic", "sine", "cosine", "exponential-minus-one", "log-plus-one",
           "rsqrt", "cbrt", "erf"]
    b = Builder()
    x = b.param(0, "f32[2000]")
    outs = [b.op(o, "f32[2000]", x) for o in ops]
    k = fusion.compile_fusion(b.build(b.op("tuple", "(" + ", ".join(["f32[2000]"] * len(ops)) + ")", *outs)))
    xv = np.abs(rng().standard_normal(2000, dtype=np.float32)) * 3
    import math
    x64 = xv.astype(np.float64)
    want = {"exponential": np.exp(x64), "log": np.log(x64), "tanh": np.tanh(x64),
            "logistic": 1 / (1 + np.exp(-x64)), "sine": np.sin(x64), "cosine": np.cos(x64),
            "exponential-minus-one": np.expm1(x64), "log-plus-one": np.log1p(x64), "rsqrt": 1 / np.sqrt(x64),
            "cbrt": np.cbrt(x64), "erf": np.array([math.erf(v) for v in x64])}
    for op, got in zip(ops, k(xv)):
        assert ulp_close(got, want[op].astype(np.float32), 2), op


INT_MIN = np.iinfo(np.int32).min


def test_integer_semantics():
    b = Builder()
    a, c = b.param(0, "s32[8]"), b.param(1, "s32[8]")
    ops = ["divide", "remainder", "shift-left", "shift-right-arithmetic", "shift-right-logical", "add",
           "multiply", "power", "maximum"]
    outs = [b.op(o, "s32[8]", a, c) for o in ops] + [b.op("negate", "s32[8]", a), b.op("abs", "s32[8]", a)]
    k = fusion.compile_fusion(b.build(b.op("tuple", "(" + ", ".join(["s32[8]"] * len(outs)) + ")", *outs)))
    av = np.array([7, -7, 7, -7, INT_MIN, 5, -1, 2 ** 30], np.int32)
    cv = np.array([2, 2, 0, -2, -1, 33, 40, -3], np.int32)
    got = dict(zip(ops + ["negate", "abs"], k(av, cv)))
    assert list(got["divide"]) == [3, -3, -1, 3, INT_MIN, 0, 0, -357913941]
    assert list(got["remainder"]) == [1, -1, 7, -1, 0, 5, -1, 1]
    assert list(got["shift-left"]) == [28, -28, 7, 0, 0, 0, 0, 0]
    assert list(got["shift-right-arithmetic"]) == [1, -2, 7, -1, -1, 0, -1, 0]
    assert list(got["shift-right-logical"]) == [1, (2 ** 32 - 7) >> 2, 7, 0, 0, 0, 0, 0]
    assert list(got["add"]) == list((av.astype(np.int64) + cv).astype(np.int32))
    assert list(got["multiply"]) == list((av.astype(np.int64) * cv).astype(np.int32))
    assert list(got["power"]) == [49, 49, 1, 0, 0, 5 ** 33 % 2 ** 32 - 2 ** 32 if 5 ** 33 % 2 ** 32 >= 2 ** 31
                                  else 5 ** 33 % 2 ** 32, 1, 0]
    assert list(got["negate"]) == [-7, 7, -7, 7, INT_MIN, -5, 1, -(2 ** 30)]
    assert got["abs"][4] == INT_MIN


def test_unsigned_and_convert_semantics():
    b = Builder()
    f = b.param(0, "f32[8]")
    u = b.param(1, "u8[8]")
    outs = [b.op("convert", "s32[8]", f), b.op("convert", "u8[8]", f), b.op("convert", "s64[8]", f),
            b.op("divide", "u8[8]", u, b.op("convert", "u8[8]", f)),
            b.op("shift-right-logical", "u8[8]", u, u), b.op("convert", "f16[8]", u),
            b.op("convert", "pred[8]", f)]
    shape = "(s32[8], u8[8], s64[8], u8[8], u8[8], f16[8], pred[8])"
    k = fusion.compile_fusion(b.build(b.op("tuple", shape, *outs)))
    fv = np.array([np.nan, -np.inf, np.inf, 3e9, -3e9, 2.9, -2.9, 0], np.float32)
    uv = np.array([200, 7, 1, 255, 9, 3, 0, 128], np.uint8)
    s32, u8, s64, udiv, shr, f16, pred = k(fv, uv)
    assert list(s32) == [0, INT_MIN, 2 ** 31 - 1, 2 ** 31 - 1, INT_MIN, 2, -2, 0]
    assert list(u8) == [0, 0, 255, 255, 0, 2, 0, 0]
    assert list(s64) == [0, -2 ** 63, 2 ** 63 - 1, 3000000000, -3000000000, 2, -2, 0]
    assert list(udiv) == [255, 255, 0, 1, 255, 1, 255, 255]
    assert list(shr) == [0, 0, 0, 0, 0, 0, 0, 0]
    assert bits_equal(f16, uv.astype(np.float16))
    assert list(pred) == [True, True, True, True, True, True, True, False]


def test_select_clamp_minmax_nan():
    b = Builder()
    x, y = b.param(0, "f32[6]"), b.param(1, "f32[6]")
    lo, hi = b.const("f32[]", "-1"), b.const("f32[]", "1")
    cl = b.op("clamp", "f32[6]", lo, x, hi)
    mn = b.op("minimum", "f32[6]", x, y)
    sel = b.op("select", "f32[6]", b.op("compare", "pred[6]", x, y, direction="LT"), x, y)
    tot = b.op("compare", "pred[6]", x, y, direction="LT", type="TOTALORDER")
    k = fusion.compile_fusion(b.build(b.op("tuple", "(f32[6], f32[6], f32[6], pred[6])", cl, mn, sel, tot)))
    xv = np.array([np.nan, 0.5, 3, -3, -0.0, 2], np.float32)
    yv = np.array([1, np.nan, 2, -4, 0.0, 2], np.float32)
    cl, mn, sel, tot = k(xv, yv)
    assert bits_equal(cl, np.float32([np.nan, 0.5, 1, -1, -0.0, 1]))
    assert np.isnan(mn[0]) and np.isnan(mn[1]) and list(mn[2:4]) == [2, -4]
    assert bits_equal(sel, np.where(xv < yv, xv, yv))
    assert list(tot) == [False, True, False, False, True, False]


def _elementwise_case(op, et):
    """A fusion applying `op` to f"{et}[8]" operands (compare: each direction), or None where `op` is not
    defined on `et`'s class."""
    from hloexec.kernels import semantics
    from hloexec.kernels.elementwise import _CLASS
    cls = _CLASS[et]
    arity = {"select": 3, "clamp": 3, "compare": 2}.get(op, semantics.arity(op) if op in semantics.DEFINITIONS else 1)
    if op in semantics.DEFINITIONS and not semantics.defines(op, cls):
        return None
    b = Builder()
    xs = [b.param(i, f"{et}[8]") for i in range(arity)]
    if op == "select":
        xs[0] = b.param(0, "pred[8]")
    out = "pred" if op in ("compare", "is-finite") else et
    attrs = {"direction": "LT"} if op == "compare" else {}
    return b.build(b.op(op, f"{out}[8]", *xs, **attrs))


@pytest.mark.parametrize("et", ["f32", "f16", "bf16", "f64", "s32", "u8", "pred"])
def test_every_elementwise_op_the_generators_claim_generates(et):
    """`ELEMENTWISE_OPS` is what exec/fuse.py groups and what the generators say they emit: each must generate
    for every type class its definition covers, or fusions holding it silently run op by op (is-finite on
    f16 did, when the generator looked its definition up by the pred result type)."""
    from hloexec.kernels.elementwise import ELEMENTWISE_OPS
    declined = {}
    for op in sorted(ELEMENTWISE_OPS - {"convert", "bitcast-convert"}):
        comp = _elementwise_case(op, et)
        if comp is None:
            continue
        try:
            fusion.generate_source(comp)
        except TierUnsupported as e:
            declined[op] = str(e)
    assert not declined, declined


def test_unsupported_is_declined_with_a_reason():
    b = Builder()
    x = b.param(0, "f32[4,4]")
    d = b.op("dot", "f32[4,4]", x, x, lhs_contracting_dims="{1}", rhs_contracting_dims="{0}")
    with pytest.raises(TierUnsupported, match="opcode dot"):
        fusion.compile_fusion(b.build(d))
    b = Builder()
    x = b.param(0, "c64[4]")
    with pytest.raises(TierUnsupported, match="type c64"):
        fusion.compile_fusion(b.build(b.op("negate", "c64[4]", x)))


def test_scalar_output_full_reduction():
    b = Builder()
    x = b.param(0, "s32[3,5]")
    r = b.reduce("s32[]", x, b.const("s32[]", "0"), [0, 1])
    k = fusion.compile_fusion(b.build(b.op("multiply", "s32[]", r, r)))
    xv = np.arange(15, dtype=np.int32).reshape(3, 5)
    got = k(xv)
    assert got.shape == () and int(got) == 105 * 105


def test_broadcast_of_column_reduction_is_refused():
    # out[i, j] = x[i, j] - sum_i' x[i', j]: the reduce would be recomputed for every i -> interpreter
    b = Builder()
    x = b.param(0, "f32[64,64]")
    r = b.reduce("f32[64]", x, b.const("f32[]", "0"), [0])
    y = b.op("subtract", "f32[64,64]", x, b.op("broadcast", "f32[64,64]", r, dimensions="{1}"))
    with pytest.raises(TierUnsupported, match="recomputed per broadcast element"):
        fusion.compile_fusion(b.build(y))


def test_long_f16_sum_accumulates_in_f32_like_the_op_by_op_path(monkeypatch):
    """Rounding an f16 accumulator after every add stalls at 4096 for values in [1, 2): XLA:CPU and the
    op-by-op path give ~6140. The compiled reduce must agree with the op-by-op path bit for bit."""
    import hloexec
    import hloexec.exec.tiering as tiering
    monkeypatch.setattr(tiering, "MIN_COMPILED_BYTES", 0)
    text = """HloModule m
add { a = f16[] parameter(0)
 b = f16[] parameter(1)
 ROOT s = f16[] add(a, b) }
fused { p = f16[8,4096] parameter(0)
 z = f16[] constant(0)
 ROOT r = f16[8] reduce(p, z), dimensions={1}, to_apply=add }
ENTRY e { p = f16[8,4096] parameter(0)
 ROOT f = f16[8] fusion(p), kind=kInput, calls=fused }"""
    x = (np.random.default_rng(0).random((8, 4096)) + 1).astype(np.float16)
    compiled = hloexec.load(text, compile="eager").run(x)
    op_by_op = hloexec.load(text, use_numba=False).run(x)
    assert compiled.tobytes() == op_by_op.tobytes()
    np.testing.assert_allclose(compiled.astype(np.float64), x.astype(np.float64).sum(1), rtol=2e-3)


@pytest.mark.parametrize("dst", ["f16", "bf16"])
def test_f64_to_half_converts_round_twice_through_f32_like_the_op_by_op_path(dst, monkeypatch):
    """XLA:CPU converts f64 -> f16/bf16 through f32: 1 + 2^-11 + 2^-40 rounds to 1 + 2^-11 in f32, a tie
    that f16 rounds to even (1.0); one correct rounding would give 1 + 2^-10."""
    import hloexec
    import hloexec.exec.tiering as tiering
    monkeypatch.setattr(tiering, "MIN_COMPILED_BYTES", 0)
    text = f"""HloModule m
fused {{ p = f64[4] parameter(0)
 ROOT c = {dst}[4] convert(p) }}
ENTRY e {{ p = f64[4] parameter(0)
 ROOT f = {dst}[4] fusion(p), kind=kLoop, calls=fused }}"""
    x = np.array([1 + 2.0 ** -11 + 2.0 ** -40, 1 + 2.0 ** -8 + 2.0 ** -40, -3.0e38, np.nan])
    compiled = hloexec.load(text, compile="eager").run(x)
    op_by_op = hloexec.load(text, use_numba=False).run(x)
    assert compiled.tobytes() == op_by_op.tobytes()


def test_pad_of_outer_dims_keeps_the_guarded_load_inside_the_inner_loops(monkeypatch):
    """ResNet's input padding: only the outer dims are padded, the innermost one (channels) is not; the
    guarded load reads all of the index, so it must sit inside the channel loop (it was placed outside
    and read a value defined later)."""
    import hloexec
    import hloexec.exec.tiering as tiering
    monkeypatch.setattr(tiering, "MIN_COMPILED_BYTES", 0)
    text = """HloModule m
fused { p = f32[1,24,24,3] parameter(0)
 z = f32[] constant(0)
 ROOT pad = f32[1,30,30,3] pad(p, z), padding=0_0x3_3x3_3x0_0 }
ENTRY e { p = f32[1,24,24,3] parameter(0)
 ROOT f = f32[1,30,30,3] fusion(p), kind=kLoop, calls=fused }"""
    x = np.random.default_rng(0).standard_normal((1, 24, 24, 3)).astype(np.float32)
    compiled = hloexec.load(text, compile="eager").run(x)
    assert compiled.tobytes() == hloexec.load(text, use_numba=False).run(x).tobytes()


# -- reductions keeping the minor dims: loops interchanged ------------------------------------------------
_COLUMN_CASES = {
    # name: (fused computation body, parameter shapes, root shape); p0 is [4,64,1,256] unless said
    "f32_sum_of_product": ("""  qb = f32[4,64,1,256] broadcast(p1), dimensions={3}
  m = f32[4,64,1,256] multiply(p0, qb)
  z = f32[] constant(0)
  ROOT r = f32[1,256] reduce(m, z), dimensions={0,1}, to_apply=add_f32""", ["f32[4,64,1,256]", "f32[256]"],
                           "f32[1,256]"),
    "f16_sum": ("""  z = f16[] constant(0)
  ROOT r = f16[1,256] reduce(p0, z), dimensions={0,1}, to_apply=add_f16""", ["f16[4,64,1,256]"], "f16[1,256]"),
    "bf16_through_f32": ("""  c = f32[4,64,1,256] convert(p0)
  z = f32[] constant(0)
  r = f32[1,256] reduce(c, z), dimensions={0,1}, to_apply=add_f32
  k = f32[] constant(0.125)
  kb = f32[1,256] broadcast(k), dimensions={}
  s = f32[1,256] multiply(r, kb)
  ROOT o = bf16[1,256] convert(s)""", ["bf16[4,64,1,256]"], "bf16[1,256]"),
    "sum_and_max": ("""  z = f32[] constant(0)
  sq = f32[4,64,1,256] multiply(p0, p0)
  s = f32[1,256] reduce(p0, z), dimensions={0,1}, to_apply=add_f32
  ninf = f32[] constant(-inf)
  mx = f32[1,256] reduce(sq, ninf), dimensions={0,1}, to_apply=max_f32
  ROOT t = (f32[1,256], f32[1,256]) tuple(s, mx)""", ["f32[4,64,1,256]"], "(f32[1,256], f32[1,256])"),
    "s32_sum": ("""  z = s32[] constant(7)
  ROOT r = s32[1,256] reduce(p0, z), dimensions={0,1}, to_apply=add_s32""", ["s32[4,64,1,256]"], "s32[1,256]"),
    "pred_any": ("""  zero = f32[] constant(1.5)
  zb = f32[4,64,1,256] broadcast(zero), dimensions={}
  gt = pred[4,64,1,256] compare(p0, zb), direction=GT
  f = pred[] constant(false)
  ROOT r = pred[1,256] reduce(gt, f), dimensions={0,1}, to_apply=or_pred""", ["f32[4,64,1,256]"], "pred[1,256]"),
}
_REDUCERS = "\n".join(f"""{name}_{t} {{ a = {t}[] parameter(0)
  b = {t}[] parameter(1)
  ROOT c = {t}[] {op}(a, b) }}""" for name, op, t in [("add", "add", "f32"), ("add", "add", "f16"),
                                                     ("add", "add", "s32"), ("max", "maximum", "f32"),
                                                     ("or", "or", "pred")])


@pytest.mark.parametrize("case", sorted(_COLUMN_CASES))
def test_reduction_keeping_minor_dims_interchanges_loops_with_the_same_bits(case):
    """A bias-gradient reduce ([rows, n] -> [n]) loops over rows outermost and accumulates a row of n, so
    its inner loop reads contiguous memory; each element still sums in row order: the bits of the op-by-op
    path (which XLA:CPU's are checked against elsewhere)."""
    import hloexec
    body, params, root = _COLUMN_CASES[case]
    params_text = "\n".join(f"  p{k} = {s} parameter({k})" for k, s in enumerate(params))
    args = ", ".join(f"a{k}" for k in range(len(params)))
    text = (f"HloModule column\n{_REDUCERS}\nfused {{\n{params_text}\n{body} }}\n"
            f"ENTRY e {{\n" + "\n".join(f"  a{k} = {s} parameter({k})" for k, s in enumerate(params))
            + f"\n  ROOT f = {root} fusion({args}), kind=kInput, calls=fused }}\n")
    compiled = hloexec.load(text, compile="eager")
    (group,) = [c for c in compiled.module.computations if c.name == "fused"]
    source, _ = fusion.generate_source(group)
    assert re.search(r"for j0 in range\(4\):\n +for j1 in range\(64\):\n +for i0 in range\(", source)  # rows outer
    inputs = compiled.random_inputs(3)
    got = compiled.run(*inputs)
    want = hloexec.load(text, use_numba=False).run(*inputs)
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        assert bits_equal(g, w)


def test_column_reduction_splits_into_wide_blocks():
    """The threads of a column reduction each take a block of columns over every row: a narrow block reads a
    few bytes of each row's cache lines (LayerNorm backward's gamma gradient, [16384,4096] -> [4096]: 2048
    blocks of 2 columns took 2.1 s, 2 of 2048 columns 49 ms)."""
    b = Builder("column_blocks")
    x = b.param(0, "f32[16384,4096]")
    comp = b.build(b.reduce("f32[4096]", x, b.const("f32[]", "0"), [0]))
    source, gen = fusion.generate_source(comp)
    assert "acc" in source and gen.blocks
    assert len(gen.blocks) >= 2 and min(r.stop - r.start for r in gen.blocks) >= fusion.COLUMN_BLOCK


@pytest.mark.parametrize("parallel", [False, True])
def test_transposing_fusion_loops_over_tiles(parallel):
    """A fusion whose output rows read down its operand's columns (transpose, then a copy and a bitcast to
    a row-major 2-D shape, as XLA:CPU emits them) loops over TILE x TILE tiles; edges not a multiple of the
    tile, and thread blocks that cut a tile, still cover every element once."""
    import hloexec
    text = """HloModule t
fc { p = f32[4,100,70] parameter(0)
  t = f32[70,4,100]{0,2,1} transpose(p), dimensions={2,0,1}
  c = f32[70,4,100]{2,1,0} copy(t)
  ROOT b = f32[70,400]{1,0} bitcast(c) }
ENTRY e { p = f32[4,100,70] parameter(0)
  ROOT f = f32[70,400] fusion(p), kind=kLoop, calls=fc }"""
    (comp,) = [c for c in hloexec.parse(text)[0].computations if c.name == "fc"]
    kernel = fusion.compile_fusion(comp, parallel=parallel)
    assert f"in range(0, 400, {fusion.TILE}):" in kernel.source
    assert not parallel or any(lo % fusion.TILE for lo, _ in kernel.blocks)     # a block starts mid-tile
    x = rng().standard_normal((4, 100, 70), dtype=np.float32)
    assert bits_equal(kernel(x), x.transpose(2, 0, 1).reshape(70, 400))



def _loop_order(source: str) -> list[str]:
    return re.findall(r"for (i\d+) in range\(t", source)


@pytest.mark.parametrize("parallel", [False, True])
def test_transposing_fusion_of_transposed_operands_runs_down_columns_in_tiles(parallel):
    """A fusion reading several operands transposed (and a per-column statistic) writes its output transposed:
    in a tile the inner loop then runs down the output's columns, so the operands' loads are contiguous and the
    statistic's load leaves the inner loop (LayerNorm backward's dx summed over layers in XLA's optimized GPT
    step: 2x faster). A plain transpose keeps the inner loop along the output's rows. The same bits either way."""
    import hloexec
    text = """HloModule t
fc { a = f32[70,45] parameter(0)
  b = f32[70,45] parameter(1)
  s = f32[70] parameter(2)
  ab = f32[70,45] add(a, b)
  bs = f32[70,45] broadcast(s), dimensions={0}
  m = f32[70,45] multiply(ab, bs)
  ROOT t = f32[45,70] transpose(m), dimensions={1,0} }
plain { a = f32[70,45] parameter(0)
  ROOT t = f32[45,70] transpose(a), dimensions={1,0} }
ENTRY e { a = f32[70,45] parameter(0)
  b = f32[70,45] parameter(1)
  s = f32[70] parameter(2)
  f = f32[45,70] fusion(a, b, s), kind=kLoop, calls=fc
  g = f32[45,70] fusion(a), kind=kLoop, calls=plain
  ROOT r = (f32[45,70], f32[45,70]) tuple(f, g) }"""
    comps = {c.name: c for c in hloexec.parse(text)[0].computations}
    kernel, plain = (fusion.compile_fusion(comps[n], parallel=parallel) for n in ("fc", "plain"))
    assert _loop_order(kernel.source) == ["i1", "i0"]  # i0 (down the output's columns) innermost
    assert _loop_order(plain.source) == ["i0", "i1"]
    x, y = rng().standard_normal((2, 70, 45), dtype=np.float32)
    s = rng().standard_normal(70, dtype=np.float32)
    assert bits_equal(kernel(x, y, s), ((x + y) * s[:, None]).T)
    assert bits_equal(plain(x), x.T)


@pytest.mark.parametrize("parallel", [False, True])
def test_a_transposed_operand_is_staged_a_tile_row_at_a_time(parallel):
    """An update reading two operands along its rows and a third transposed (Adam's moment of a gradient that
    comes transposed) keeps its inner loop along the rows; the transposed operand's strided loads go into a
    TILE-element stack buffer filled before the inner loop, which then reads contiguous memory only (LLVM
    vectorizes it). The same bits as numpy; edges not a multiple of the tile covered."""
    import hloexec
    text = """HloModule t
fc { m = f32[45,70] parameter(0)
  g = f32[70,45] parameter(1)
  gt = f32[45,70] transpose(g), dimensions={1,0}
  k = f32[] constant(0.9)
  kb = f32[45,70] broadcast(k), dimensions={}
  mk = f32[45,70] multiply(m, kb)
  ROOT r = f32[45,70] add(mk, gt) }
ENTRY e { m = f32[45,70] parameter(0)
  g = f32[70,45] parameter(1)
  ROOT f = f32[45,70] fusion(m, g), kind=kLoop, calls=fc }"""
    (comp,) = [c for c in hloexec.parse(text)[0].computations if c.name == "fc"]
    kernel = fusion.compile_fusion(comp, parallel=parallel)
    assert _loop_order(kernel.source) == ["i0", "i1", "i1"]  # the fill loop, then the inner loop
    assert f"stack_array({fusion.TILE}, np.float32)" in kernel.source
    m = rng().standard_normal((45, 70), dtype=np.float32)
    g = rng().standard_normal((70, 45), dtype=np.float32)
    assert bits_equal(kernel(m, g), m * np.float32(0.9) + g.T)

def test_thread_block_kernels_load_and_store_contiguously(tmp_path, monkeypatch):
    """A kernel split into thread blocks loops from an unknown `lo`; with signed indices Numba's negative-index
    wraparound made LLVM vectorize every load as a gather and every store as a scatter (Adam 100 M: 226 ->
    116 ms once fixed). Compiled fresh here through Numba, so the machine code can be read (the direct
    compiler's: tests/test_kernels_direct.py)."""
    monkeypatch.setenv("HLOEXEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HLOEXEC_DIRECT_KERNELS", "0")
    b = Builder()
    x, y = b.param(0, "f32[100000]"), b.param(1, "f32[100000]")
    scale = np.float32(1 + rng().random())
    k = b.op("broadcast", "f32[100000]", b.const("f32[]", repr(float(scale))), dimensions="{}")
    kernel = fusion.compile_fusion(b.build(b.op("add", "f32[100000]", b.op("multiply", "f32[100000]", x, k), y)),
                                   parallel=True)
    assert "lo, hi" in kernel.source
    (sig,) = kernel.fn.signatures
    asm = kernel.fn.overloads[sig].library.get_asm_str()
    assert "mulss" in asm or "mulps" in asm                 # the loop is there
    assert "gather" not in asm and "scatter" not in asm
    xv, yv = rng().standard_normal(100000, dtype=np.float32), rng().random(100000, dtype=np.float32)
    assert bits_equal(kernel(xv, yv), xv * scale + yv)


def _row_sum_of_squares(rows: int, n: int, et: str = "f16"):
    b = Builder()
    x = b.param(0, f"{et}[{rows},{n}]")
    c = b.op("convert", f"f32[{rows},{n}]", x) if et != "f32" else x
    sq = b.op("multiply", f"f32[{rows},{n}]", c, c)
    return b.build(b.reduce(f"f32[{rows}]", sq, b.const("f32[]", "0"), [1]))


def _lane_order_sum(v: np.ndarray) -> np.ndarray:
    """Row sums of f32 `v` in row_sum_in_lanes' order: element j added to lane j % LANES in f32, row order,
    the lanes then added pairwise (0-7 then 8-15, recursively), then added to the init value 0."""
    rows, n = v.shape
    lanes = np.zeros((rows, fusion.LANES), np.float32)
    for j in range(0, n, fusion.LANES):
        lanes += v[:, j:j + fusion.LANES]

    def pairwise(lo, hi):
        return lanes[:, lo] if hi - lo == 1 else pairwise(lo, (lo + hi) // 2) + pairwise((lo + hi) // 2, hi)
    return np.float32(0) + pairwise(0, fusion.LANES)


@pytest.mark.parametrize("et", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("n", [5 * fusion.LANES, 40 * fusion.LANES, fusion.CHUNK * 3 + fusion.LANES * 2])
def test_row_sums_accumulate_in_lanes(et, n):
    """A float sum along a row's contiguous dim keeps LANES partial sums (independent adds, a vector add
    instead of a chain of dependent adds: 8x faster on LayerNorm-sized rows), added pairwise at the end. The
    order is fixed by the shape: threads and runs give the same bits, whatever the chunks the row is computed
    in (n: chunks of 16, 128, 32 elements)."""
    rows = 64
    dt = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}[et]
    x = rng().standard_normal((rows, n)).astype(dt)
    serial = fusion.compile_fusion(_row_sum_of_squares(rows, n, et), parallel=False)
    split = fusion.compile_fusion(_row_sum_of_squares(rows, n, et), parallel=True)
    assert "add_lanes(" in serial.source and split.blocks
    got = serial(x)
    assert bits_equal(got, split(x))
    x32 = x.astype(np.float32)
    assert bits_equal(got, _lane_order_sum(x32 * x32))
    uneven = fusion.compile_fusion(_row_sum_of_squares(rows, n + 1, et), parallel=False)
    assert "add_lanes(" not in uneven.source                # a row not a multiple of LANES: one accumulator


def test_f16_loads_convert_by_vector_instruction_only_in_vectorized_loops():
    """f16 loads in a row sum's chunk loop and in an elementwise loop along rows use the fpext form
    (f16_to_f32_simd: vcvtph2ps, 2x faster f16 row sums); a reduce computed in order (the max of a softmax's
    row, hoisted out of the sum's loop) keeps f16_to_f32, whose integer form does not make each element wait
    for the previous one in a scalar loop. Same bits either way (test_half_casts)."""
    rows, n = 8, 64
    b = Builder()
    x = b.param(0, f"f16[{rows},{n}]")
    wide = b.op("convert", f"f32[{rows},{n}]", x)
    top = b.reduce(f"f32[{rows}]", wide, b.const("f32[]", "-inf"), [1], reducer="maximum")
    shifted = b.op("subtract", f"f32[{rows},{n}]", wide, b.op("broadcast", f"f32[{rows},{n}]", top, dimensions="{0}"))
    total = b.reduce(f"f32[{rows}]", b.op("exponential", f"f32[{rows},{n}]", shifted), b.const("f32[]", "0"), [1])
    kernel = fusion.compile_fusion(b.build(total), parallel=False)
    chunk_loop = kernel.source[kernel.source.index("for jc"):]
    assert "f16_to_f32_simd(p0" in chunk_loop
    max_loop = kernel.source[:kernel.source.index("for jc")]
    assert "f16_to_f32(p0" in max_loop and "f16_to_f32_simd(" not in max_loop.split("def kernel")[1]
    data = rng().standard_normal((rows, n)).astype(np.float16)
    d32 = data.astype(np.float32)
    np.testing.assert_allclose(kernel(data), np.exp(d32 - d32.max(1, keepdims=True)).sum(1), rtol=1e-5)

    elementwise = Builder()
    y = elementwise.param(0, f"f16[{rows},{n}]")
    doubled = elementwise.op("add", f"f16[{rows},{n}]", y, y)
    assert "f16_to_f32_simd(p0" in fusion.compile_fusion(elementwise.build(doubled), parallel=False).source


# reductions of every type compile: (type, reducer op, the inputs' distribution)
_TYPED_REDUCERS = [("pred", "and"), ("pred", "or"), ("s32", "add"), ("s32", "maximum"), ("u8", "add"),
                   ("u8", "minimum"), ("s32", "xor"), ("f32", "add"), ("f32", "maximum")]
# name: (operand dims, result dims, the reduce's dimensions= or the reduce-window's window=)
_REDUCTION_FORMS = {
    "reduce_rows_and_columns": ([24, 40, 8], [40], "dimensions={0,2}"),
    "window_blocks": ([64, 96], [2, 3], "window={size=32x32 stride=32x32}"),      # the all-finite check
    "window_padded_dilated": ([9, 14], [5, 8], "window={size=3x4 stride=2x3 pad=1_1x2_0 lhs_dilate=1x2 "
                                               "rhs_dilate=1x2}"),
    "window_size_one": ([6, 10], [8, 10], "window={size=1x1 pad=1_1x0_0}"),        # a pad as a reduce-window
}


def _typed_values(rng, et, kind, dims):
    if et == "pred":       # values deciding an and (an or) of a window: none in the first half of the columns
        rare = rng.random(dims) < 0.2
        rare[:, :dims[1] // 2] = False
        return ~rare if kind == "and" else rare
    if et == "f32":
        x = rng.standard_normal(dims).astype(np.float32)
        x.reshape(-1)[:3] = [np.inf, -0.0, np.nan]
        return x
    info = np.iinfo(np.dtype(ew_storage(et)))
    return rng.integers(info.min, info.max, dims, endpoint=True).astype(ew_storage(et))   # sums wrap around


def ew_storage(et):
    from hloexec.kernels.elementwise import STORAGE
    return STORAGE[et]


@pytest.mark.parametrize("et,kind", _TYPED_REDUCERS, ids=[f"{t}-{k}" for t, k in _TYPED_REDUCERS])
@pytest.mark.parametrize("form", sorted(_REDUCTION_FORMS))
def test_reductions_of_every_type_compile_with_the_op_by_op_bits(et, kind, form, monkeypatch):
    """Reduces and reduce-windows over pred, integers and floats compile into the fused loop nest (windows
    with padding, strides and dilations: holes skipped) and give the op-by-op tier's bits (f32 sums folded in
    order under reductions="per-step"; the other reducers are exact in any order)."""
    import hloexec
    from hloexec.exec import tiering
    monkeypatch.setattr(tiering, "MIN_COMPILED_BYTES", 0)
    src, out, attr = _REDUCTION_FORMS[form]
    opcode = "reduce" if attr.startswith("dimensions") else "reduce-window"
    init = {"and": "true", "or": "false", "maximum": "-inf" if et == "f32" else "-7", "minimum": "200",
            "add": "3", "xor": "5"}[kind]
    s, o = f"{et}[{','.join(map(str, src))}]", f"{et}[{','.join(map(str, out))}]"
    text = (f"HloModule typed\nred {{ a = {et}[] parameter(0)\n b = {et}[] parameter(1)\n"
            f" ROOT c = {et}[] {kind}(a, b) }}\n"
            f"fused {{ p0 = {s} parameter(0)\n z = {et}[] constant({init})\n"
            f" ROOT r = {o} {opcode}(p0, z), {attr}, to_apply=red }}\n"
            f"ENTRY e {{ a = {s} parameter(0)\n ROOT f = {o} fusion(a), kind=kLoop, calls=fused }}\n")
    compiled = hloexec.load(text, compile="eager", reductions="per-step")
    assert compiled.plan.steps[0].kernel.compiled is not None, "the fusion did not compile"
    x = _typed_values(rng(), et, kind, src)
    want = hloexec.load(text, use_numba=False, reductions="per-step").run(x)
    got = compiled.run(x)
    assert bits_equal(got, want)
    if et == "pred":
        assert want.any() and not want.all()        # the inputs exercise both outcomes


@pytest.mark.parametrize("et,kind", _TYPED_REDUCERS, ids=[f"{t}-{k}" for t, k in _TYPED_REDUCERS])
@pytest.mark.parametrize("form", sorted(f for f in _REDUCTION_FORMS if f.startswith("window")))
def test_reduce_windows_of_unfused_modules_compile_with_the_op_by_op_bits(et, kind, form, monkeypatch):
    """In a pre-optimization module (no fusions) the fusion pass (exec/fuse.py) groups a reduce-window, with
    its elementwise producer where the windows do not overlap (else the producer would be recomputed per
    window): the group compiles and gives the op-by-op tier's bits."""
    import hloexec
    from hloexec.exec import tiering
    monkeypatch.setattr(tiering, "MIN_COMPILED_BYTES", 0)
    src, out, attr = _REDUCTION_FORMS[form]
    init = {"and": "true", "or": "false", "maximum": "-inf" if et == "f32" else "-7", "minimum": "200",
            "add": "3", "xor": "5"}[kind]
    s, o = f"{et}[{','.join(map(str, src))}]", f"{et}[{','.join(map(str, out))}]"
    producer = "not" if et == "pred" else "negate"
    text = (f"HloModule typed\nred {{ a = {et}[] parameter(0)\n b = {et}[] parameter(1)\n"
            f" ROOT c = {et}[] {kind}(a, b) }}\n"
            f"ENTRY e {{ a = {s} parameter(0)\n n = {s} {producer}(a)\n z = {et}[] constant({init})\n"
            f" ROOT r = {o} reduce-window(n, z), {attr}, to_apply=red }}\n")
    compiled = hloexec.load(text, compile="eager", reductions="per-step")
    (group,) = compiled.plan.fused_groups
    assert group.kernel.compiled is not None, "the group did not compile"
    overlapping = form == "window_padded_dilated"
    assert [m.name for m in group.members] == (["r"] if overlapping else ["n", "r"])
    x = _typed_values(rng(), et, kind, src)
    x = ~x if et == "pred" else x           # the producer's `not` restores the values made for the reducer
    want = hloexec.load(text, use_numba=False, reductions="per-step").run(x)
    got = compiled.run(x)
    if et == "f32":     # negate(NaN): numpy flips its sign, the kernel's need not (XLA leaves a NaN's sign open)
        nan = np.isnan(want)
        assert np.array_equal(nan, np.isnan(got)) and nan.any()
        got, want = np.where(nan, 0, got), np.where(nan, 0, want)
    assert bits_equal(got, want)
    if et == "pred":
        assert want.any() and not want.all()        # the inputs exercise both outcomes


def test_all_finite_reduce_window_compiles_at_its_size():
    """The mixed-precision Adam step's all-finite check (XLA:CPU's optimized module: a kLoop fusion of one
    reduce-window over pred[4096,1024], window 32x32, to pred[128,32]) compiles: it reads 4 MB, although
    its output is 4 KB. Op by op (numpy over a strided window view) it ran at ~0.5 GB/s."""
    import hloexec
    text = ("HloModule all_finite\nand_pred { a = pred[] parameter(0)\n b = pred[] parameter(1)\n"
            " ROOT c = pred[] and(a, b) }\n"
            "fused { p0 = pred[4096,1024] parameter(0)\n t = pred[] constant(true)\n"
            " ROOT r = pred[128,32] reduce-window(p0, t), window={size=32x32 stride=32x32}, to_apply=and_pred }\n"
            "ENTRY e { a = pred[4096,1024] parameter(0)\n"
            " ROOT f = pred[128,32] fusion(a), kind=kLoop, calls=fused }\n")
    x = np.ones((4096, 1024), bool)
    x[1000, 77] = x[4095, 1023] = False
    compiled = hloexec.load(text, compile="eager", compile_after=1)
    first, second = compiled.run(x), compiled.run(x)         # op by op, then compiled
    assert compiled.plan.steps[0].kernel.compiled is not None
    want = np.ones((128, 32), bool)
    want[1000 // 32, 77 // 32] = want[127, 31] = False
    assert np.array_equal(first, want) and np.array_equal(second, want)
