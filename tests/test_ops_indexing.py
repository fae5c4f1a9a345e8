"""gather / scatter / sort against XLA:CPU through jax.lax."""
import jax
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import hloexec
import hloexec.ops.indexing as IX
from hloexec.errors import HloParseError
from hloexec.ir.attributes import GatherDims, ScatterDims
from hloexec.ir.module import Computation
from hloexec.tools.xla_cpu import XlaCpuError, parse_with_xla
from op_helpers import FakeContext, make_inst, python_computation, scalar_computation, shape_text, type_name

pytestmark = pytest.mark.xla
BF = ml_dtypes.bfloat16
jax.config.update("jax_enable_x64", True)

GATHER_CASES = [  # operand shape, indices, GatherDimensionNumbers kwargs, slice_sizes
    ((5, 6), np.array([[0], [2], [4], [9], [-3]]), dict(offset_dims=(1,), collapsed_slice_dims=(0,),
                                                           start_index_map=(0,)), (1, 6)),
    ((5, 6, 7), np.array([[1, 2], [3, 5], [4, 0]]), dict(offset_dims=(1, 2, 3), collapsed_slice_dims=(),
                                                           start_index_map=(0, 2)), (2, 3, 4)),
    ((4, 5), np.array([[[0, 1], [2, 3]], [[3, 4], [1, 1]]]), dict(offset_dims=(), collapsed_slice_dims=(0, 1),
                                                                   start_index_map=(0, 1)), (1, 1)),
    ((3, 5, 4), np.array([[1], [3], [0]]), dict(offset_dims=(1,), collapsed_slice_dims=(1,),
                                                 start_index_map=(1,), operand_batching_dims=(0,),
                                                 start_indices_batching_dims=(0,)), (1, 1, 4)),
]


@pytest.mark.parametrize("dt", [np.float32, BF, np.int32, np.uint8, np.bool_], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", range(len(GATHER_CASES)))
def test_gather(dt, case):
    oshape, idx, kw, ss = GATHER_CASES[case]
    x = (np.arange(np.prod(oshape)).reshape(oshape) % 7).astype(dt)
    idx = idx.astype(np.int32)
    dn = lax.GatherDimensionNumbers(**kw)
    want = np.asarray(lax.gather(x, idx, dn, ss, mode=lax.GatherScatterMode.CLIP))
    gd = GatherDims(index_vector_dim=idx.ndim - 1, slice_sizes=ss, **kw)
    inst = make_inst("gather", shape_text(dt, want.shape), [shape_text(dt, oshape), shape_text(np.int32, idx.shape)],
                     offset_dims=gd.offset_dims, collapsed_slice_dims=gd.collapsed_slice_dims,
                     start_index_map=gd.start_index_map, index_vector_dim=gd.index_vector_dim, slice_sizes=ss,
                     operand_batching_dims=gd.operand_batching_dims,
                     start_indices_batching_dims=gd.start_indices_batching_dims)
    got = IX.prepare_gather(inst, FakeContext())(x, idx)
    np.testing.assert_array_equal(got, want)


def test_gather_implicit_index_vector_dim():
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    idx = np.array([3, 0, 7], np.int64)  # 7 clamps to 4
    inst = make_inst("gather", "f32[3,4]", ["f32[5,4]", "s64[3]"], offset_dims=(1,), collapsed_slice_dims=(0,),
                     start_index_map=(0,), index_vector_dim=1, slice_sizes=(1, 4))
    np.testing.assert_array_equal(IX.prepare_gather(inst, FakeContext())(x, idx), x[[3, 0, 4]])


WITHOUT_INDEX_VECTOR_DIM = {  # index_vector_dim left out: XLA's parser marks it required=true
    "gather": """HloModule m
ENTRY e {
  x = f32[5,4] parameter(0)
  i = s32[3] parameter(1)
  ROOT g = f32[3,4] gather(x, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, slice_sizes={1,4}
}
""",
    "scatter": """HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  x = f32[5,4] parameter(0)
  i = s32[3] parameter(1)
  u = f32[3,4] parameter(2)
  ROOT r = f32[5,4] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, to_apply=add
}
"""}


@pytest.mark.parametrize("opcode", sorted(WITHOUT_INDEX_VECTOR_DIM))
def test_missing_index_vector_dim_is_a_parse_error_as_in_xla(opcode):
    text = WITHOUT_INDEX_VECTOR_DIM[opcode]
    message = "attribute index_vector_dim is expected but not seen"
    with pytest.raises(XlaCpuError, match=message):
        parse_with_xla(text)
    with pytest.raises(HloParseError, match=message) as info:
        hloexec.load(text)
    assert info.value.line == text[:text.index(f" {opcode}(")].count("\n") + 1


SCATTER_CASES = [  # operand shape, indices, updates shape, ScatterDimensionNumbers kwargs
    ((6,), np.array([[0], [2], [2], [5], [7], [-1]]), (6,), dict(update_window_dims=(), inserted_window_dims=(0,),
                                                                  scatter_dims_to_operand_dims=(0,))),
    ((5, 4), np.array([[1], [3], [1], [4]]), (4, 4), dict(update_window_dims=(1,), inserted_window_dims=(0,),
                                                           scatter_dims_to_operand_dims=(0,))),
    ((5, 6), np.array([[0, 1], [3, 4], [4, 0]]), (3, 2, 3), dict(update_window_dims=(1, 2), inserted_window_dims=(),
                                                                  scatter_dims_to_operand_dims=(0, 1))),
    ((3, 5), np.array([[1], [4], [1]]), (3,), dict(update_window_dims=(), inserted_window_dims=(1,),
                                                   scatter_dims_to_operand_dims=(1,), operand_batching_dims=(0,),
                                                   scatter_indices_batching_dims=(0,))),
]
SC_FN = {"add": lax.scatter_add, "maximum": lax.scatter_max, "minimum": lax.scatter_min,
         "multiply": lax.scatter_mul, "replace": lax.scatter}


@pytest.mark.parametrize("kind", ["add", "maximum", "minimum", "multiply", "replace", "generic"])
@pytest.mark.parametrize("dt", [np.float32, BF, np.int32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", range(len(SCATTER_CASES)))
def test_scatter(kind, dt, case):
    oshape, idx, ushape, kw = SCATTER_CASES[case]
    rs = np.random.RandomState(case)
    x = (rs.randint(-5, 6, oshape)).astype(dt)
    u = (rs.randint(-5, 6, ushape)).astype(dt)
    idx = idx.astype(np.int32)
    kw2 = {("input_batching_dims" if k == "operand_batching_dims" else k): v for k, v in kw.items()}
    dn = lax.ScatterDimensionNumbers(**{("operand_batching_dims" if k == "input_batching_dims" else k): v
                                        for k, v in kw2.items()})
    ref = "add" if kind == "generic" else kind
    want = np.asarray(SC_FN[ref](x, idx, u, dn, mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS))
    name = type_name(dt)
    if kind == "generic":
        comp = python_computation([name, name], lambda a, b: (a.astype(np.float64) + b).astype(dt), name)
    elif kind == "replace":
        ps = scalar_computation("add", name).parameters
        comp = Computation("c", ps, ps[1])
    else:
        comp = scalar_computation(kind, name)
    sd = ScatterDims(index_vector_dim=idx.ndim - 1, **kw2)
    operands = [shape_text(dt, oshape), shape_text(np.int32, idx.shape), shape_text(dt, ushape)]
    inst = make_inst("scatter", shape_text(dt, oshape), operands,
                     update_window_dims=sd.update_window_dims, inserted_window_dims=sd.inserted_window_dims,
                     scatter_dims_to_operand_dims=sd.scatter_dims_to_operand_dims, index_vector_dim=sd.index_vector_dim,
                     input_batching_dims=sd.input_batching_dims,
                     scatter_indices_batching_dims=sd.scatter_indices_batching_dims, called={"to_apply": comp})
    got = IX.prepare_scatter(inst, FakeContext())(x, idx, u)
    np.testing.assert_array_equal(got, want)


def test_scatter_variadic_generic():
    x0, x1 = np.zeros(4, np.float32), np.zeros(4, np.int32)
    idx = np.array([[1], [3], [1]], np.int32)
    u0, u1 = np.array([1, 2, 3], np.float32), np.array([10, 20, 30], np.int32)
    comp = python_computation(["f32", "s32", "f32", "s32"], lambda a, ai, b, bi: (a + b, ai + bi))
    inst = make_inst("scatter", "(f32[4], s32[4])", ["f32[4]", "s32[4]", "s32[3,1]", "f32[3]", "s32[3]"],
                     update_window_dims=(), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,),
                     index_vector_dim=1, called={"to_apply": comp})
    g0, g1 = IX.prepare_scatter(inst, FakeContext())(x0, x1, idx, u0, u1)
    np.testing.assert_array_equal(g0, [0, 4, 0, 2])
    np.testing.assert_array_equal(g1, [0, 40, 0, 20])


SPECIAL = np.array([np.nan, -np.nan, -np.inf, np.inf, -0.0, 0.0, 1.0, -1.0, 2.0, 1.0, 0.0], np.float32)


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16, BF, np.int32, np.uint8, np.bool_],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("direction", ["LT", "GT"])
def test_sort_fast(dt, direction):
    rs = np.random.RandomState(0)
    if np.dtype(dt).kind == "f" or dt is BF:
        x = np.concatenate([SPECIAL, rs.randn(13).astype(np.float32)]).astype(dt)
        x = np.stack([x, x[::-1]])
    elif dt is np.bool_:
        x = rs.rand(2, 24) > 0.5
    else:
        x = rs.randint(0, 50, (2, 24)).astype(dt)
    payload = np.broadcast_to(np.arange(24, dtype=np.int32), x.shape).copy()
    # XLA's own TOTALORDER compare (jax's comparator canonicalizes -0 and NaN, so use HLO text)
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    n_ = type_name(dt)
    tot = ", type=TOTALORDER" if np.dtype(dt).kind == "f" or dt is BF else ""
    text = f"""HloModule m
cmp {{ a = {n_}[] parameter(0) b = {n_}[] parameter(1) c = s32[] parameter(2) d = s32[] parameter(3)
  ROOT r = pred[] compare(a, b), direction={direction}{tot} }}
ENTRY e {{ x = {shape_text(dt, x.shape)} parameter(0) p = s32[2,24] parameter(1)
  ROOT s = ({shape_text(dt, x.shape)}, s32[2,24]) sort(x, p), dimensions={{1}}, is_stable=true, to_apply=cmp }}"""
    want = run_on_xla_cpu(text, [x, payload])
    name = type_name(dt)
    comp = scalar_computation("compare", name, extra_params=("s32", "s32"), direction=direction, type="TOTALORDER")
    inst = make_inst("sort", f"({shape_text(dt, x.shape)}, s32[2,24])", [shape_text(dt, x.shape), "s32[2,24]"],
                     dimensions=(1,), is_stable=True, called={"to_apply": comp})
    gx, gp = IX.prepare_sort(inst, FakeContext())(x, payload)
    np.testing.assert_array_equal(gx.view(np.uint8), np.asarray(want[0]).view(np.uint8))
    np.testing.assert_array_equal(gp, want[1])


def test_sort_general_comparator_two_keys():
    rs = np.random.RandomState(1)
    a = rs.randint(0, 3, (3, 10)).astype(np.int32)
    b = rs.randn(3, 10).astype(np.float32)

    def less(a0, a1, b0, b1):
        return np.bool_((a0 < a1) or (a0 == a1 and b0 > b1))
    comp = python_computation(["s32", "s32", "f32", "f32"], less, "pred")
    inst = make_inst("sort", "(s32[3,10], f32[3,10])", ["s32[3,10]", "f32[3,10]"], dimensions=(1,),
                     called={"to_apply": comp})
    ga, gb = IX.prepare_sort(inst, FakeContext())(a, b)
    wa, wb = lax.sort((a, -b), dimension=1, num_keys=2)
    np.testing.assert_array_equal(ga, wa)
    np.testing.assert_array_equal(gb, -np.asarray(wb))
