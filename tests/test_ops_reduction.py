"""reduce / reduce-window / select-and-scatter against XLA:CPU (jax.lax and HLO text via jaxlib)."""
import jax
import ml_dtypes
import numpy as np
import pytest

import hloexec.ops.reduction as RED
from hloexec.ir.attributes import WindowDim
from op_helpers import make_inst, run, python_computation, scalar_computation, shape_text, type_name

pytestmark = pytest.mark.xla
BF = ml_dtypes.bfloat16
jax.config.update("jax_enable_x64", True)


def rand(rs, dt, shape):
    dt = np.dtype(dt)
    if dt == np.bool_:
        return rs.rand(*shape) > 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rs.randint(max(info.min, -100), min(info.max, 100) + 1, size=shape).astype(dt)
    return (rs.randn(*shape) * 2 + 0.5).astype(dt)


def check(got, want, dt, n, x=None):
    want = np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    dt = np.dtype(dt)
    if dt.kind in "iub":
        np.testing.assert_array_equal(got, want)
        return
    eps = float(ml_dtypes.finfo(dt).eps)
    scale = 1.0 if x is None else float(np.abs(x.astype(np.float64)).sum() / max(got.size, 1)) + 1
    tol = 4 * max(n, 1) * eps * scale
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), atol=tol, rtol=4 * eps)


KINDS = {"add": lambda a, b: a + b, "maximum": jax.lax.max, "minimum": jax.lax.min, "multiply": lambda a, b: a * b}
IDENT = {"add": 0, "maximum": -np.inf, "minimum": np.inf, "multiply": 1}
DTYPES = [np.float32, np.float64, np.float16, BF, np.int32, np.uint8, np.bool_]


def init_for(kind, dt):
    dt = np.dtype(dt)
    if dt == np.bool_:
        return np.bool_({"add": False, "maximum": False, "minimum": True, "multiply": True}[kind])
    if dt.kind in "iu" and kind in ("maximum", "minimum"):
        info = np.iinfo(dt)
        return dt.type(info.min if kind == "maximum" else info.max)
    return np.array(IDENT[kind]).astype(dt)[()]


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", ["add", "maximum", "minimum", "multiply"])
def test_reduce_vectorized(dt, kind):
    if kind == "multiply" and np.dtype(dt).kind == "f":
        shapes = [((3, 4), (1,)), ((2, 3, 5), (0, 2))]
    else:
        shapes = [((7,), (0,)), ((3, 50), (1,)), ((4, 5, 6), (0, 2)), ((2, 3), ()), ((5, 0), (1,)), ((300,), (0,))]
    rs = np.random.RandomState(0)
    for shape, dims in shapes:
        x = rand(rs, dt, shape)
        if kind == "multiply" and np.dtype(dt).kind == "f":
            x = (1 + 0.1 * rs.rand(*shape)).astype(dt)
        init = init_for(kind, dt)
        out_shape = tuple(s for i, s in enumerate(shape) if i not in dims)
        inst = make_inst("reduce", shape_text(dt, out_shape), [shape_text(dt, shape), shape_text(dt, ())],
                         dimensions=dims, called={"to_apply": scalar_computation(kind, type_name(dt))})
        got = run(inst, x, np.asarray(init))
        want = np.asarray(jax.lax.reduce(x, init, KINDS[kind], dims))
        n = int(np.prod([shape[d] for d in dims])) if dims else 1
        check(got, want, dt, n, x)


@pytest.mark.parametrize("dt,name", [(BF, "bf16"), (np.float16, "f16")])
def test_low_precision_sum_bound_against_xla(dt, name):
    """XLA:CPU rounds per step in its own order; we accumulate in f32: within 4*n*eps*mean|x|*n."""
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    rs = np.random.RandomState(1)
    for n in (3, 100, 2000):
        x = (rs.rand(n) + 0.5).astype(dt)
        text = f"""HloModule m
add {{ a = {name}[] parameter(0) b = {name}[] parameter(1) ROOT c = {name}[] add(a,b) }}
ENTRY e {{ p = {name}[{n}] parameter(0) z = {name}[] constant(0) ROOT r = {name}[] reduce(p, z), dimensions={{0}}, to_apply=add }}"""
        want = float(run_on_xla_cpu(text, [x])[0])
        inst = make_inst("reduce", f"{name}[]", [f"{name}[{n}]", f"{name}[]"], dimensions=(0,),
                         called={"to_apply": scalar_computation("add", name)})
        got = run(inst, x, np.zeros((), dt))
        assert got.shape == () and got.dtype == np.dtype(dt)
        eps = float(ml_dtypes.finfo(dt).eps)
        assert abs(float(got) - want) <= 4 * n * eps * float(np.abs(x.astype(np.float64)).sum()) / 8 + 1e-6


def test_reduce_variadic_argmax_generic():
    rs = np.random.RandomState(2)
    x = rs.randn(4, 9).astype(np.float32)
    idx = np.broadcast_to(np.arange(9, dtype=np.int32), (4, 9)).copy()

    def argmax(a, ai, b, bi):
        pick_a = (a > b) | ((a == b) & (ai < bi))
        return np.where(pick_a, a, b), np.where(pick_a, ai, bi)

    def jargmax(xs, ys):
        a, ai = xs
        b, bi = ys
        pick_a = (a > b) | ((a == b) & (ai < bi))
        return jax.lax.select(pick_a, a, b), jax.lax.select(pick_a, ai, bi)
    comp = python_computation(["f32", "s32", "f32", "s32"], argmax)
    inst = make_inst("reduce", "(f32[4], s32[4])", ["f32[4,9]", "s32[4,9]", "f32[]", "s32[]"], dimensions=(1,),
                     called={"to_apply": comp})
    got = run(inst, x, idx, np.float32(-np.inf), np.int32(0))
    want = jax.lax.reduce((x, idx), (np.float32(-np.inf), np.int32(0)), jargmax, (1,))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def _win(sizes, strides, pads, bd, wd):
    return tuple(WindowDim(s, st, p[0], p[1], b, w) for s, st, p, b, w in zip(sizes, strides, pads, bd, wd))


RW_CASES = [
    ((10,), (3,), (1,), ((0, 0),), (1,), (1,)),
    ((8, 9), (2, 3), (2, 1), ((1, 0), (0, 2)), (1, 1), (1, 1)),
    ((6, 7), (3, 2), (1, 2), ((1, 1), (2, 0)), (2, 1), (1, 2)),
    ((2, 5, 5, 3), (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)), (1, 1, 1, 1), (1, 1, 1, 1)),
    ((9,), (2,), (2,), ((-1, 2),), (1,), (2,)),
]


@pytest.mark.parametrize("dt", [np.float32, BF, np.int32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", ["add", "maximum"])
@pytest.mark.parametrize("case", range(len(RW_CASES)))
def test_reduce_window_vectorized(dt, kind, case):
    shape, sizes, strides, pads, bd, wd = RW_CASES[case]
    rs = np.random.RandomState(case)
    x = rand(rs, dt, shape)
    init = init_for(kind, dt)
    want = np.asarray(jax.lax.reduce_window(x, init, KINDS[kind], sizes, strides, pads, bd, wd))
    inst = make_inst("reduce-window", shape_text(dt, want.shape), [shape_text(dt, shape), shape_text(dt, ())],
                     window=_win(sizes, strides, pads, bd, wd),
                     called={"to_apply": scalar_computation(kind, type_name(dt))})
    got = run(inst, x, np.asarray(init))
    check(got, want, dt, int(np.prod(sizes)), x)


@pytest.mark.parametrize("case", [1, 2, 4])
def test_reduce_window_generic_matches_vectorized(case):
    shape, sizes, strides, pads, bd, wd = RW_CASES[case]
    x = rand(np.random.RandomState(5), np.int32, shape)
    want = np.asarray(jax.lax.reduce_window(x, np.int32(0), KINDS["add"], sizes, strides, pads, bd, wd))
    inst = make_inst("reduce-window", shape_text(np.int32, want.shape), [shape_text(np.int32, shape), "s32[]"],
                     window=_win(sizes, strides, pads, bd, wd),
                     called={"to_apply": python_computation(["s32", "s32"], lambda a, b: np.int32(a + b), "s32")})
    got = run(inst, x, np.int32(0))
    np.testing.assert_array_equal(got, want)


SAS_CASES = [((6, 6), (2, 2), (2, 2), ((0, 0), (0, 0))), ((7, 5), (3, 3), (2, 1), ((1, 1), (1, 1))),
             ((1, 8, 8, 2), (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (0, 1), (0, 1), (0, 0)))]


@pytest.mark.parametrize("direction", ["GE", "GT"])
@pytest.mark.parametrize("dt,name", [(np.float32, "f32"), (BF, "bf16"), (np.int32, "s32")])
@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("case", range(len(SAS_CASES)))
def test_select_and_scatter(direction, dt, name, generic, case):
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    shape, sizes, strides, pads = SAS_CASES[case]
    rs = np.random.RandomState(case)
    x = rand(rs, dt, shape)
    if np.dtype(dt).kind == "i" and len(shape) == 2:
        x = (x % 4).astype(dt)   # ties, to check which of equal maxima is selected
    elif np.dtype(dt).kind == "i":
        # XLA:CPU scans rank-4 windows in an order of its own (measured: not row-major), so ties
        # are implementation-defined there; hloexec follows the HloEvaluator (row-major).
        x = rs.permutation(x.size).reshape(shape).astype(dt)
    win = _win(sizes, strides, pads, [1] * len(shape), [1] * len(shape))
    oshape = RED.window_out_shape([s + p[0] + p[1] for s, p in zip(shape, pads)], sizes, strides, [1] * len(shape))
    src = rand(rs, dt, oshape)
    wtxt = "x".join(map(str, sizes))
    stxt = "x".join(map(str, strides))
    ptxt = "x".join(f"{a}_{b}" for a, b in pads)
    text = f"""HloModule m
ge {{ a = {name}[] parameter(0) b = {name}[] parameter(1) ROOT c = pred[] compare(a, b), direction={direction} }}
add {{ a = {name}[] parameter(0) b = {name}[] parameter(1) ROOT c = {name}[] add(a, b) }}
ENTRY e {{
  o = {shape_text(dt, shape)} parameter(0)
  s = {shape_text(dt, oshape)} parameter(1)
  z = {name}[] constant(0)
  ROOT r = {shape_text(dt, shape)} select-and-scatter(o, s, z), window={{size={wtxt} stride={stxt} pad={ptxt}}}, select=ge, scatter=add
}}"""
    want = run_on_xla_cpu(text, [x, src])[0]
    cmp = {"GE": np.greater_equal, "GT": np.greater}[direction]
    if generic:
        sel = python_computation([name, name], lambda a, b: cmp(a, b), "pred")
        sc = python_computation([name, name], lambda a, b: (a.astype(np.float64) + b).astype(dt), name)
    else:
        sel = scalar_computation("compare", name, direction=direction)
        sc = scalar_computation("add", name)
    inst = make_inst("select-and-scatter", shape_text(dt, shape),
                     [shape_text(dt, shape), shape_text(dt, oshape), f"{name}[]"], window=win, called={"select": sel, "scatter": sc})
    got = run(inst, x, src, np.zeros((), dt))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dt", [ml_dtypes.float8_e4m3fn, ml_dtypes.float4_e2m1fn, ml_dtypes.float8_e5m2])
@pytest.mark.parametrize("kind", ["maximum", "minimum"])
def test_max_min_reduce_of_a_type_without_infinities(dt, kind):
    """jax reduces f8e4m3fn / f4e2m1fn with the type's largest value as init; the vectorized path's own identity
    was +-inf cast to the type: NaN in f8e4m3fn (no infinities), so every result came out NaN."""
    x = np.array([[1, 2], [2, 1], [-3, 0.5], [4, 4], [0.5, -1]], dt)
    init = np.array(ml_dtypes.finfo(dt).max if kind == "minimum" else -ml_dtypes.finfo(dt).max).astype(dt)
    name = np.dtype(dt).name.replace("float8_", "f8").replace("float4_", "f4")
    inst = make_inst("reduce", f"{name}[5]", [f"{name}[5,2]", f"{name}[]"], dimensions=(1,),
                     called={"to_apply": scalar_computation(kind, name)})
    want = (np.min if kind == "minimum" else np.max)(x.astype(np.float32), axis=1).astype(dt)
    np.testing.assert_array_equal(run(inst, x, init).view(np.uint8), want.view(np.uint8))
