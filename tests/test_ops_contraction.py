"""dot / convolution / fft against XLA:CPU through jax.lax."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import hloexec.ops.contraction as C
from hloexec.ir.attributes import ConvDims, WindowDim
from op_helpers import make_inst, run, shape_text

pytestmark = pytest.mark.xla
BF = ml_dtypes.bfloat16
jax.config.update("jax_enable_x64", True)


def rand(rs, dt, shape):
    dt = np.dtype(dt)
    if dt.kind in "iu":
        return rs.randint(0 if dt.kind == "u" else -20, 20, size=shape).astype(dt)
    return rs.randn(*shape).astype(dt)


def close(got, want, dt, k):
    want = np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    if np.dtype(dt).kind in "iu":
        np.testing.assert_array_equal(got, want)
        return
    eps = float(ml_dtypes.finfo(dt).eps)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), atol=2 * k * eps * 4, rtol=4 * eps)


DOT_CASES = [  # lhs shape, rhs shape, (lb, rb, lc, rc)
    ((3, 4), (4, 5), ((), (), (1,), (0,))),
    ((4, 3), (5, 4), ((), (), (0,), (1,))),
    ((2, 3, 4), (2, 4, 5), ((0,), (0,), (2,), (1,))),
    ((3, 2, 4, 6), (6, 2, 7), ((1,), (1,), (3,), (0,))),
    ((5,), (5,), ((), (), (0,), (0,))),
    ((2, 3), (4,), ((), (), (), ())),
    ((2, 3, 4, 5), (3, 5, 4, 2), ((1, 0), (0, 3), (2, 3), (2, 1))),
]


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16, BF, np.int32, np.uint8, np.int8],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", range(len(DOT_CASES)))
def test_dot_general(dt, case):
    ls, rs_, (lb, rb, lc, rc) = DOT_CASES[case]
    rs = np.random.RandomState(case)
    a, b = rand(rs, dt, ls), rand(rs, dt, rs_)
    want = np.asarray(jax.lax.dot_general(a, b, ((lc, rc), (lb, rb))))
    inst = make_inst("dot", shape_text(want.dtype, want.shape), [shape_text(dt, ls), shape_text(dt, rs_)],
                     lhs_batch_dims=lb, rhs_batch_dims=rb, lhs_contracting_dims=lc, rhs_contracting_dims=rc)
    got = run(inst, a, b)
    close(got, want, dt, int(np.prod([ls[d] for d in lc])) if lc else 1)


def test_dot_preferred_type_and_overflow():
    rs = np.random.RandomState(0)
    a, b = rs.randint(-128, 128, (6, 40)).astype(np.int8), rs.randint(-128, 128, (40, 3)).astype(np.int8)
    want = np.asarray(jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=np.int32))
    inst = make_inst("dot", "s32[6,3]", ["s8[6,40]", "s8[40,3]"], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    np.testing.assert_array_equal(run(inst, a, b), want)
    a16, b16 = rs.randn(8, 64).astype(BF), rs.randn(64, 4).astype(BF)
    want = np.asarray(jax.lax.dot_general(a16, b16, (((1,), (0,)), ((), ())), preferred_element_type=np.float32))
    inst = make_inst("dot", "f32[8,4]", ["bf16[8,64]", "bf16[64,4]"], lhs_contracting_dims=(1,),
                     rhs_contracting_dims=(0,))
    np.testing.assert_allclose(run(inst, a16, b16), want, rtol=1e-5, atol=1e-4)
    x = np.full((2, 300), 100, np.int32)   # 300*100*100 wraps in s16
    inst = make_inst("dot", "s16[2,2]", ["s16[2,300]", "s16[2,300]"], lhs_contracting_dims=(1,),
                     rhs_contracting_dims=(1,))
    got = run(inst, x.astype(np.int16), x.astype(np.int16))
    np.testing.assert_array_equal(got, np.asarray(jax.lax.dot_general(x.astype(np.int16), x.astype(np.int16),
                                                                      (((1,), (1,)), ((), ())))))


def _conv(lhs, rhs, dn, strides, pads, lhs_dil, rhs_dil, fgc=1, bgc=1, dt=np.float32):
    rs = np.random.RandomState(7)
    spec = jax.lax.conv_dimension_numbers(lhs, rhs, dn)
    a, b = rand(rs, dt, lhs), rand(rs, dt, rhs)
    want = np.asarray(jax.lax.conv_general_dilated(a, b, strides, pads, lhs_dil, rhs_dil, spec,
                                                   feature_group_count=fgc, batch_group_count=bgc))
    ls, ks, os_ = spec
    cd = ConvDims(ls[0], ls[1], tuple(ls[2:]), ks[1], ks[0], tuple(ks[2:]), os_[0], os_[1], tuple(os_[2:]))
    win = tuple(WindowDim(rhs[ks[2 + i]], strides[i], pads[i][0], pads[i][1], lhs_dil[i], rhs_dil[i])
                for i in range(len(strides)))
    inst = make_inst("convolution", shape_text(want.dtype, want.shape), [shape_text(dt, lhs), shape_text(dt, rhs)],
                     dim_labels=cd, window=win, feature_group_count=fgc, batch_group_count=bgc)
    got = run(inst, a, b)
    k = int(np.prod(rhs)) // max(rhs[ks[0]], 1)
    close(got, want, dt, k)


CONV_CASES = [
    ((2, 3, 9, 8), (4, 3, 3, 3), ("NCHW", "OIHW", "NCHW"), (1, 1), ((0, 0), (0, 0)), (1, 1), (1, 1), 1, 1),
    ((2, 9, 8, 3), (3, 3, 3, 4), ("NHWC", "HWIO", "NHWC"), (2, 1), ((1, 1), (2, 0)), (1, 1), (1, 2), 1, 1),
    ((1, 7, 7, 4), (3, 3, 2, 6), ("NHWC", "HWIO", "NHWC"), (1, 2), ((1, 2), (0, 1)), (2, 1), (1, 1), 2, 1),
    ((2, 6, 6, 4), (3, 3, 1, 4), ("NHWC", "HWIO", "NHWC"), (1, 1), ((1, 1), (1, 1)), (1, 1), (1, 1), 4, 1),
    ((4, 5, 5, 3), (3, 3, 3, 6), ("NHWC", "HWIO", "NHWC"), (1, 1), ((0, 0), (0, 0)), (1, 1), (1, 1), 1, 2),
    ((2, 3, 10), (5, 3, 4), ("NCH", "OIH", "NCH"), (3,), ((-1, 2),), (1,), (2,), 1, 1),
    ((2, 4, 4, 4, 2), (2, 2, 2, 2, 3), ("NDHWC", "DHWIO", "NDHWC"), (1, 1, 2), ((0, 1), (1, 0), (0, 0)),
     (1, 2, 1), (1, 1, 1), 1, 1),
    ((3, 2), (2, 4), ("NC", "IO", "NC"), (), (), (), (), 1, 1),
]


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
@pytest.mark.parametrize("dt", [np.float32, BF, np.int32], ids=lambda d: np.dtype(d).name)
def test_convolution(case, dt):
    lhs, rhs, dn, st, pads, ld, rd, fgc, bgc = CONV_CASES[case]
    _conv(lhs, rhs, dn, st, pads, ld, rd, fgc, bgc, dt)


def test_fft():
    rs = np.random.RandomState(0)
    x = (rs.randn(3, 8) + 1j * rs.randn(3, 8)).astype(np.complex64)
    for kind, arg, length in (("FFT", x, (8,)), ("IFFT", x, (8,)), ("RFFT", x.real.copy(), (8,)),
                              ("IRFFT", x[:, :5].copy(), (8,))):
        want = np.asarray(jax.lax.fft(arg, kind, length))
        inst = make_inst("fft", shape_text(want.dtype, want.shape), [shape_text(arg.dtype, arg.shape)], fft_type=kind,
                         fft_length=length)
        got = run(inst, arg)
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m,k,n", [(1, 1152, 9000), (9000, 64, 3)])
def test_big_low_precision_operand_is_converted_in_slices(m, k, n, monkeypatch):
    """A vocabulary projection: x[1, 1152] . W[1152, 262144] in bf16. Converting W to f32 whole made a 1.2 GB
    copy per call (gemma3's LM head: 2.7 s of its 4.7 s run); slices of its free dim keep the temporary at
    CONVERT_CHUNK elements. Scaled down here; the result is the f32 product of the exact operands."""
    import tracemalloc
    monkeypatch.setattr(C, "CONVERT_CHUNK", 1 << 14)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    tracemalloc.start()
    try:
        got = C.dot_general(a, b, (), (), (1,), (0,), np.dtype(np.float32))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    big = max(a.size, b.size)
    assert peak < 4 * big / 2 + 4 * m * n           # well under an f32 copy of the big operand, plus the result
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# -- ragged-dot and scaled-dot: jax lowers them to these opcodes for TPU/GPU; its CPU lowering (a masked dot_general,
# the xla.scaled_dot composite's decomposition) run by XLA:CPU is the reference ------------------------------------
RAGGED_CASES = [  # lhs, rhs, (lhs contracting, rhs contracting, lhs batch, rhs batch), lhs ragged, rhs group, sizes
    ((10, 4), (3, 4, 5), ((1,), (1,), (), ()), 0, (0,), [3, 5, 1]),                      # rows past the groups: 0
    ((2, 10, 4), (3, 2, 4, 5), ((2,), (2,), (0,), (1,)), 1, (0,), [[3, 5, 1], [0, 4, 6]]),  # sizes per batch index
    ((2, 10, 4), (2, 4, 3, 5), ((2,), (1,), (0,), (0,)), 1, (2,), [4, 4, 2]),            # broadcast sizes, inner group
    ((6, 10), (10, 5), ((1,), (0,), (), ()), 1, (), [3, 5, 1]),                           # ragged contracting dim
    ((2, 6, 10), (2, 10, 5), ((2,), (1,), (0,), (0,)), 2, (), [[3, 5, 1], [2, 2, 2]]),
    ((3, 6, 4), (3, 4, 5), ((2,), (1,), (0,), (0,)), 0, (), [1, 1]),                       # ragged batch dim
]


def _module(result, operands, opcode, attrs) -> str:
    params = "".join(f"  p{i} = {shape_text(x.dtype, x.shape)} parameter({i})\n" for i, x in enumerate(operands))
    return (f"HloModule m\nENTRY e {{\n{params}  ROOT r = {result} {opcode}("
            f"{', '.join(f'p{i}' for i in range(len(operands)))}), {attrs}\n}}\n")


def _dims(**numbers) -> str:
    return ", ".join(f"{k}={{{','.join(map(str, v))}}}" for k, v in numbers.items() if v)


@pytest.mark.parametrize("dt", [np.float32, BF], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", range(len(RAGGED_CASES)))
def test_ragged_dot_matches_jax(case, dt):
    import hloexec
    lhs_shape, rhs_shape, (lc, rc, lb, rb), ragged, group, sizes = RAGGED_CASES[case]
    numbers = jax.lax.RaggedDotDimensionNumbers(((lc, rc), (lb, rb)), [ragged], list(group))
    rs = np.random.RandomState(case)
    lhs, rhs, group_sizes = rand(rs, dt, lhs_shape), rand(rs, dt, rhs_shape), np.array(sizes, np.int32)
    want = np.asarray(jax.jit(lambda a, b, g: jax.lax.ragged_dot_general(a, b, g, numbers))(lhs, rhs, group_sizes))
    text = _module(shape_text(want.dtype, want.shape), (lhs, rhs, group_sizes), "ragged-dot",
                   _dims(lhs_batch_dims=lb, rhs_batch_dims=rb, lhs_contracting_dims=lc, rhs_contracting_dims=rc,
                         lhs_ragged_dims=(ragged,), rhs_group_dims=group))
    close(hloexec.load(text).run(lhs, rhs, group_sizes), want, dt, lhs_shape[lc[0]])


def _scaled_dot_decomposed(operands, t: str, dot_t: str) -> str:
    """XLA's ScaledDotRewriter output for [b,m,k] x [b,k,n] with [b,m,k/s] and [b,k/s,n] scales: operand and
    scale converted to type `t`, the scale broadcast over its blocks, one multiply; the dot in `dot_t`; f32 out."""
    def typed(dims):
        return f"{t}[{','.join(map(str, dims))}]"
    lines = [f"  p{i} = {shape_text(x.dtype, x.shape)} parameter({i})" for i, x in enumerate(operands)]
    for side, x, s, k_axis in (("l", operands[0], operands[2], 2), ("r", operands[1], operands[3], 1)):
        wide = s.shape[:k_axis + 1] + (x.shape[k_axis] // s.shape[k_axis],) + s.shape[k_axis + 1:]
        p, q = (0, 2) if side == "l" else (1, 3)
        lines += [f"  {side}x = {typed(x.shape)} convert(p{p})", f"  {side}s = {typed(s.shape)} convert(p{q})",
                  f"  {side}b = {typed(wide)} broadcast({side}s), dimensions={{{','.join(str(d + (d > k_axis)) for d in range(3))}}}",
                  f"  {side}r = {typed(x.shape)} reshape({side}b)", f"  {side}m = {typed(x.shape)} multiply({side}x, {side}r)"]
    lines += [f"  d = {dot_t}[2,4,3] dot(lm, rm), lhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, "
              "rhs_batch_dims={0}, rhs_contracting_dims={1}", "  ROOT o = f32[2,4,3] convert(d)"]
    return "HloModule m\nENTRY e {\n" + "\n".join(lines) + "\n}\n"


# (operand type, scale type, the type they meet in, the dot's type): XLA's GetTargetType, read off by hand
@pytest.mark.parametrize("operand, scale, t, dot_t", [
    (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu, "bf16", "f32"),     # both < 16 bits: bf16
    (ml_dtypes.float8_e5m2, np.float32, "f32", "f32"),                      # else the wider one
    (BF, BF, "bf16", "f32")], ids=["mxfp8", "f8-f32-scale", "bf16"])
def test_scaled_dot_matches_xla_decomposition(operand, scale, t, dot_t):
    """scaled-dot means what XLA's ScaledDotRewriter turns it into (which for f32 scales is not jax's composite
    decomposition: that one always multiplies in bf16); its output, as plain HLO, runs on XLA:CPU."""
    import hloexec
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    rs = np.random.RandomState(0)
    operands = (rs.randn(2, 4, 64).astype(operand), rs.randn(2, 64, 3).astype(operand),
                (2.0 ** rs.randint(-3, 4, (2, 4, 2))).astype(scale), rs.rand(2, 2, 3).astype(scale))
    got = hloexec.load(_module("f32[2,4,3]", operands, "scaled-dot", _dims(
        lhs_batch_dims=(0,), lhs_contracting_dims=(2,), rhs_batch_dims=(0,), rhs_contracting_dims=(1,)))).run(*operands)
    close(got, run_on_xla_cpu(_scaled_dot_decomposed(operands, t, dot_t), list(operands))[0], np.float32, 64)
