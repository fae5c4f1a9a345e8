"""Movement ops against XLA:CPU (bit-exact), shapes drawn by hypothesis; bitcast/tuple/constant by hand
(XLA's HLO -> StableHLO route drops layouts, so layout-dependent bitcasts are checked against numpy)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import hloexec.ops.movement as mv
from hloexec.errors import UnsupportedError
from hloexec.ir.attributes import PadDim, SliceDim
from op_helpers import bits, make_inst, run, run_xla

pytestmark = pytest.mark.xla
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
TYPES = {"pred": np.bool_, "s8": np.int8, "u16": np.uint16, "s32": np.int32, "u64": np.uint64,
         "bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32, "f64": np.float64}

dims_st = st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple)
nonempty_dims = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)
type_st = st.sampled_from(sorted(TYPES))


def arr(t, dims, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(-100, 100, dims).astype(TYPES[t]) if t != "pred" else rng.integers(0, 2, dims).astype(bool)


def sh(t, dims):
    return f"{t}[{','.join(map(str, dims))}]"


def same(inst, *inputs):
    ours = run(inst, *inputs)
    ref = run_xla(inst, *inputs)
    assert ours.dtype == inst.shape.dtype and ours.shape == inst.shape.dims and ours.flags.c_contiguous
    np.testing.assert_array_equal(bits(ours), bits(ref))
    return ours


def not_aliasing(out, *inputs):
    for x in inputs:
        assert not np.shares_memory(out, x)


@SETTINGS
@given(t=type_st, dims=dims_st, data=st.data())
def test_broadcast(t, dims, data):
    out_rank = len(dims) + data.draw(st.integers(0, 2))
    out_dims_pos = sorted(data.draw(st.permutations(range(out_rank)))[:len(dims)])
    out = [data.draw(st.integers(1, 3)) for _ in range(out_rank)]
    for i, d in enumerate(out_dims_pos):
        out[d] = dims[i]
    x = arr(t, dims)
    r = same(make_inst("broadcast", sh(t, out), [sh(t, dims)], dimensions=tuple(out_dims_pos)), x)
    not_aliasing(r, x)


@SETTINGS
@given(t=type_st, dims=nonempty_dims, data=st.data())
def test_reshape_transpose_reverse(t, dims, data):
    x = arr(t, dims)
    flat = int(np.prod(dims))
    same(make_inst("reshape", sh(t, (flat,)), [sh(t, dims)]), x)
    perm = tuple(data.draw(st.permutations(range(len(dims)))))
    r = same(make_inst("transpose", sh(t, [dims[p] for p in perm]), [sh(t, dims)], dimensions=perm), x)
    not_aliasing(r, x)
    rev = tuple(sorted(data.draw(st.sets(st.integers(0, len(dims) - 1)))))
    r = same(make_inst("reverse", sh(t, dims), [sh(t, dims)], dimensions=rev), x)
    not_aliasing(r, x)


@SETTINGS
@given(t=type_st, dims=nonempty_dims, data=st.data())
def test_slice(t, dims, data):
    spec = []
    for d in dims:
        a = data.draw(st.integers(0, d))
        b = data.draw(st.integers(a, d))
        spec.append(SliceDim(a, b, data.draw(st.integers(1, 3))))
    out = [len(range(s.start, s.limit, s.stride)) for s in spec]
    x = arr(t, dims)
    r = same(make_inst("slice", sh(t, out), [sh(t, dims)], slice=tuple(spec)), x)
    not_aliasing(r, x)


@SETTINGS
@given(t=type_st, dims=nonempty_dims, data=st.data(), itype=st.sampled_from(["s32", "s64", "u32", "s8", "u8"]))
def test_dynamic_slice_and_update(t, dims, data, itype):
    sizes = tuple(data.draw(st.integers(0, d)) for d in dims)
    lo = -5 if itype.startswith("s") else 0
    starts = [np.array(data.draw(st.integers(lo, 7)), TYPES.get(itype) or np.dtype(itype.replace("s", "int")
                                                                                       .replace("u", "uint")))
              for _ in dims]
    starts = [np.array(s, {"s32": np.int32, "s64": np.int64, "u32": np.uint32, "s8": np.int8, "u8": np.uint8}[itype])
              for s in starts]
    x = arr(t, dims)
    idx = [f"{itype}[]"] * len(dims)
    same(make_inst("dynamic-slice", sh(t, sizes), [sh(t, dims), *idx], dynamic_slice_sizes=sizes), x, *starts)
    u = arr(t, sizes, seed=1)
    r = same(make_inst("dynamic-update-slice", sh(t, dims), [sh(t, dims), sh(t, sizes), *idx]), x, u, *starts)
    not_aliasing(r, x)


def test_dynamic_slice_huge_unsigned_start():
    x = np.arange(10, dtype=np.float32)
    s = np.array(np.iinfo(np.uint32).max, np.uint32)
    same(make_inst("dynamic-slice", "f32[3]", ["f32[10]", "u32[]"], dynamic_slice_sizes=(3,)), x, s)


@SETTINGS
@given(t=type_st, dims=nonempty_dims, data=st.data())
def test_pad(t, dims, data):
    pads = []
    for d in dims:
        interior = data.draw(st.integers(0, 2))
        full = d + max(d - 1, 0) * interior
        low = data.draw(st.integers(-full, 3))
        high = data.draw(st.integers(-(full + low) if full + low > 0 else 0, 3))
        if full + low + high < 0:
            high = -(full + low)
        pads.append(PadDim(low, high, interior))
    out = [p.low + p.high + d + max(d - 1, 0) * p.interior for d, p in zip(dims, pads)]
    x, pv = arr(t, dims), arr(t, (), seed=3)
    same(make_inst("pad", sh(t, out), [sh(t, dims), sh(t, ())], padding=tuple(pads)), x, pv)


@SETTINGS
@given(t=type_st, dims=nonempty_dims, data=st.data())
def test_concatenate(t, dims, data):
    axis = data.draw(st.integers(0, len(dims) - 1))
    n = data.draw(st.integers(1, 3))
    parts = []
    for k in range(n):
        d = list(dims)
        d[axis] = data.draw(st.integers(0, 3))
        parts.append(arr(t, tuple(d), seed=k))
    out = list(dims)
    out[axis] = sum(p.shape[axis] for p in parts)
    r = same(make_inst("concatenate", sh(t, out), [sh(t, p.shape) for p in parts], dimensions=(axis,)), *parts)
    not_aliasing(r, *parts)


@pytest.mark.parametrize("t", ["s8", "u32", "s64", "bf16", "f16", "f32", "f64"])
def test_iota(t):
    for dims, axis in [((5,), 0), ((3, 4), 1), ((2, 3, 4), 0), ((300,), 0)]:
        if t == "s8" and dims == (300,):
            continue
        same(make_inst("iota", sh(t, dims), [], iota_dimension=axis))


def test_iota_large_bf16():
    # index -> bf16 rounds (257 -> 256)
    same(make_inst("iota", "bf16[1000]", [], iota_dimension=0))


# -- layout-dependent and tuple ops (numpy references) -----------------------------------------------------
def test_bitcast_default_layout_is_reshape():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(run(make_inst("bitcast", "f32[6,4]", ["f32[2,3,4]"]), x), x.reshape(6, 4))


def test_bitcast_physical_order():
    # f32[2,3]{0,1} holds x column-major: bitcast to f32[3,2]{1,0} is the transpose
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run(make_inst("bitcast", "f32[3,2]{1,0}", ["f32[2,3]{0,1}"]), x), x.T)
    # and a row-major source read back column-major
    np.testing.assert_array_equal(run(make_inst("bitcast", "f32[3,2]{0,1}", ["f32[2,3]{1,0}"]), x),
                                  x.reshape(-1).reshape(2, 3).T)
    # rank change with non-default layouts: physical order of src [d1,d0,d2]... -> dst
    y = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    phys = y.transpose(1, 0, 2).reshape(-1)                         # {2,0,1}: major-to-minor 1,0,2
    want = phys.reshape(4, 6).T                                       # dst f32[6,4]{0,1}: major 1 then 0
    np.testing.assert_array_equal(run(make_inst("bitcast", "s32[6,4]{0,1}", ["s32[2,3,4]{2,0,1}"]), y), want)


def test_bitcast_element_type_change():
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(run(make_inst("bitcast", "u32[2]", ["f32[2]"]), x), x.view(np.uint32))
    np.testing.assert_array_equal(run(make_inst("bitcast", "u16[4]", ["f32[2]"]), x), x.view(np.uint16))


def test_bitcast_of_a_tuple_is_the_tuple():
    """XLA's older dumps bitcast tuples to the same tuple shape (the GPT seed's loop state): not malformed."""
    import hloexec
    exe = hloexec.load("""HloModule m
ENTRY e { p = (f16[2], s32[]) parameter(0)
  ROOT b = (f16[2], s32[]) bitcast(p) }""")
    x, n = np.array([1, 2], np.float16), np.int32(3)
    got = exe.run((x, n))
    np.testing.assert_array_equal(got[0], x)
    assert got[1] == n


def test_bitcast_tiled():
    """Tiled layouts: the result reads the buffer in its own tiled order; reading tile padding is refused."""
    x = np.arange(8 * 256, dtype=np.float32).reshape(8, 256)
    # T(8,128) stores the two 8x128 column blocks one after the other
    untile = make_inst("bitcast", "f32[2048]{0}", ["f32[8,256]{1,0:T(8,128)}"])
    np.testing.assert_array_equal(run(untile, x), x.reshape(8, 2, 128).transpose(1, 0, 2).reshape(-1))
    one_tile = make_inst("bitcast", "f32[8,128]{1,0:T(8,128)}", ["f32[1024]{0:T(1024)}"])
    np.testing.assert_array_equal(run(one_tile, np.arange(1024, dtype=np.float32)),
                                  np.arange(1024, dtype=np.float32).reshape(8, 128))
    scalar = make_inst("bitcast", "s32[]{:T(256)}", ["s32[1]{0:T(256)}"])
    assert run(scalar, np.array([7], np.int32)) == 7
    padded = make_inst("bitcast", "f32[512]{0}", ["f32[2,256]{1,0:T(8,128)}"])
    with pytest.raises(UnsupportedError, match="padding"):
        run(padded, np.zeros((2, 256), np.float32))
    same_tiled = make_inst("bitcast", "f32[8,128]{1,0:T(8,128)}", ["f32[8,128]{1,0:T(8,128)}"])
    x = np.ones((8, 128), np.float32)
    assert run(same_tiled, x) is x


def test_copy_and_tuple_ops():
    x, y = np.arange(3.0), np.arange(4, dtype=np.int32)
    assert run(make_inst("copy", "f64[3]{0}", ["f64[3]"]), x) is x
    tup = make_inst("tuple", "(f64[3], s32[4])", ["f64[3]", "s32[4]"])
    t = run(tup, x, y)
    assert isinstance(t, tuple) and t[0] is x and t[1] is y
    assert _inferred(tup).to_text() == "(f64[3], s32[4])"
    gte = make_inst("get-tuple-element", "s32[4]", [tup], index=1)
    assert run(gte, t) is y
    assert _inferred(gte).to_text() == "s32[4]"


def test_constant_read_only():
    lit = np.arange(6, dtype=np.float32).reshape(2, 3)
    inst = make_inst("constant", "f32[2,3]", [], literal=lit)
    k = __import__("op_helpers", fromlist=["prepare"]).prepare(inst)
    a, b = k(), k()
    assert a is b and not a.flags.writeable
    np.testing.assert_array_equal(a, lit)


def _inferred(inst):
    """The shape ir/shape_inference.py gives `inst` from its operands and attributes."""
    from hloexec.ir.shape_inference import infer_shape
    return infer_shape(inst.opcode, [o.shape for o in inst.operands], inst.attr)


def test_shape_rules():
    inst = make_inst("transpose", "f32[4,2]", ["f32[2,4]"], dimensions=(1, 0))
    assert _inferred(inst).to_text() == "f32[4,2]"
    inst = make_inst("slice", "f32[2]", ["f32[9]"], slice=(SliceDim(1, 5, 2),))
    assert _inferred(inst).to_text() == "f32[2]"
    inst = make_inst("pad", "f32[8]", ["f32[3]", "f32[]"], padding=(PadDim(1, 2, 1),))
    assert _inferred(inst).to_text() == "f32[8]"
    inst = make_inst("concatenate", "f32[5,2]", ["f32[2,2]", "f32[3,2]"], dimensions=(0,))
    assert _inferred(inst).to_text() == "f32[5,2]"


def test_registered():
    from hloexec.ops.registry import OPS
    for opc in mv.OPCODES:
        assert opc in OPS


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8_e4m3fn", "bool", "complex64", "int8"])
@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 0, 1), (1, 2, 0)])
def test_transposes_swapping_two_dim_groups_copy_in_panels(dtype, perm, monkeypatch):
    """[A..., B...] -> [B..., A...] is a 2-D transpose, copied PANEL_ROWS source rows at a time (small here,
    so the last panel is partial); other permutations go through numpy."""
    import hloexec
    monkeypatch.setattr(mv, "PANEL_ROWS", 7)
    dt = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    x = (np.random.default_rng(0).standard_normal((3, 10, 6)) * 4).astype(dt)
    et = {"float32": "f32", "bfloat16": "bf16", "float8_e4m3fn": "f8e4m3fn", "bool": "pred",
          "complex64": "c64", "int8": "s8"}[dtype]
    out_dims = ",".join(str(x.shape[p]) for p in perm)
    text = (f"HloModule t\nENTRY e {{ p = {et}[3,10,6] parameter(0)\n"
            f"  ROOT t = {et}[{out_dims}] transpose(p), dimensions={{{','.join(map(str, perm))}}} }}")
    got = hloexec.load(text, use_numba=False).run(x)
    assert got.dtype == dt and got.flags.c_contiguous
    assert got.tobytes() == np.ascontiguousarray(np.transpose(x, perm)).tobytes()


_TRANSPOSE_INTO_DOT = """HloModule m
ENTRY main {
  w = bf16[64,48] parameter(0)
  x = bf16[2,48] parameter(1)
  t = bf16[48,64] transpose(w), dimensions={1,0}
  d = bf16[2,64] dot(x, t), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT r = %ROOT%
}
"""


def test_a_transpose_read_only_by_dots_is_a_view_of_its_operand():
    import hloexec
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 48)).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((2, 48)).astype(ml_dtypes.bfloat16)
    viewed = hloexec.load(_TRANSPOSE_INTO_DOT.replace("%ROOT%", "bf16[2,64] copy(d)"))
    seen = {}
    got = viewed.run(w, x, observe=lambda inst, value: seen.setdefault(inst.name, value))
    assert np.shares_memory(seen["t"], w)
    want = (x.astype(np.float32) @ w.astype(np.float32).T).astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)
    # read by something else too (here the result): a copy, and the plan counts its buffer
    copied = hloexec.load(_TRANSPOSE_INTO_DOT.replace("%ROOT%", "(bf16[2,64], bf16[48,64]) tuple(d, t)"))
    got2, t = copied.run(w, x)
    assert not np.shares_memory(t, w) and t.flags.c_contiguous
    np.testing.assert_allclose(got2.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)
    assert copied.plan.memory.peak_bytes() - viewed.plan.memory.peak_bytes() >= 48 * 64 * 2
