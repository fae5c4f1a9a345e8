"""gather / scatter / sort against XLA:CPU through jax.lax."""
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import hloexec
import hloexec.ops.indexing as IX
from hloexec.errors import HloParseError
from hloexec.ir.attributes import GatherDims, ScatterDims
from hloexec.ir.module import Computation
from hloexec.tools.xla_cpu import XlaCpuError, parse_with_xla, run_on_xla_cpu
from op_helpers import make_inst, run, python_computation, scalar_computation, shape_text, type_name

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
    got = run(inst, x, idx)
    np.testing.assert_array_equal(got, want)


def test_gather_implicit_index_vector_dim():
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    idx = np.array([3, 0, 7], np.int64)  # 7 clamps to 4
    inst = make_inst("gather", "f32[3,4]", ["f32[5,4]", "s64[3]"], offset_dims=(1,), collapsed_slice_dims=(0,),
                     start_index_map=(0,), index_vector_dim=1, slice_sizes=(1, 4))
    np.testing.assert_array_equal(run(inst, x, idx), x[[3, 0, 4]])


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
    # one index vector: one window (the single-window path), in bounds and out of bounds
    ((35, 35), np.array([3, 7]), (), dict(update_window_dims=(), inserted_window_dims=(0, 1),
                                          scatter_dims_to_operand_dims=(0, 1))),
    ((5, 4), np.array([3]), (4,), dict(update_window_dims=(0,), inserted_window_dims=(0,),
                                       scatter_dims_to_operand_dims=(0,))),
    ((5, 6), np.array([[1, 4]]), (1, 2, 2), dict(update_window_dims=(1, 2), inserted_window_dims=(),
                                                 scatter_dims_to_operand_dims=(0, 1))),
    ((5, 6), np.array([[4, 5]]), (1, 2, 2), dict(update_window_dims=(1, 2), inserted_window_dims=(),
                                                 scatter_dims_to_operand_dims=(0, 1))),
    ((5, 6), np.array([-1, 2]), (), dict(update_window_dims=(), inserted_window_dims=(0, 1),
                                         scatter_dims_to_operand_dims=(0, 1))),
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
    got = run(inst, x, idx, u)
    np.testing.assert_array_equal(got, want)


def test_scatter_variadic_generic():
    x0, x1 = np.zeros(4, np.float32), np.zeros(4, np.int32)
    idx = np.array([[1], [3], [1]], np.int32)
    u0, u1 = np.array([1, 2, 3], np.float32), np.array([10, 20, 30], np.int32)
    comp = python_computation(["f32", "s32", "f32", "s32"], lambda a, ai, b, bi: (a + b, ai + bi))
    inst = make_inst("scatter", "(f32[4], s32[4])", ["f32[4]", "s32[4]", "s32[3,1]", "f32[3]", "s32[3]"],
                     update_window_dims=(), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,),
                     index_vector_dim=1, called={"to_apply": comp})
    g0, g1 = run(inst, x0, x1, idx, u0, u1)
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
    comp = scalar_computation("compare", name, extra_params=("s32", "s32"), direction=direction,
                              **({"type": "TOTALORDER"} if tot else {}))
    inst = make_inst("sort", f"({shape_text(dt, x.shape)}, s32[2,24])", [shape_text(dt, x.shape), "s32[2,24]"],
                     dimensions=(1,), is_stable=True, called={"to_apply": comp})
    gx, gp = run(inst, x, payload)
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
    ga, gb = run(inst, a, b)
    wa, wb = lax.sort((a, -b), dimension=1, num_keys=2)
    np.testing.assert_array_equal(ga, wa)
    np.testing.assert_array_equal(gb, -np.asarray(wb))


# Denormals are left out: XLA:CPU compares with DAZ, so jax's `x == 0` canonicalization makes them ties of
# 0 there, while hloexec does not flush (see hloexec/ops/elementwise.py).
SORT_SPECIAL = np.concatenate([SPECIAL, np.array([0x7FC00001, 0xFFC00002, 0x7F800001], np.uint32).view(np.float32)])
JAX_SORTS = {  # name -> (number of operands, function of them); every one lowers to a canonicalizing comparator
    "argsort": (1, lambda x: jnp.argsort(x, axis=1)),
    "argsort-descending": (1, lambda x: jnp.argsort(x, axis=1, descending=True)),
    "sort-axis0": (1, lambda x: jnp.sort(x, axis=0)),
    "sort-payload": (2, lambda x, y: lax.sort((x, y), dimension=1, num_keys=1)),
    "sort-2keys": (2, lambda x, y: lax.sort((x, y, -y), dimension=1, num_keys=2)),
    "sort-3keys-int": (2, lambda x, y: lax.sort((y % 3, x, y.astype(jnp.uint8)), dimension=1, num_keys=3)),
    "lexsort": (2, lambda x, y: jnp.lexsort((y, x), axis=1)),
}


def _bit_equal(got, want):
    got = got if isinstance(got, (tuple, list)) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


def _no_slow_sort(*args):
    raise AssertionError("sort ran its comparator per comparison")


def _jax_sort_case(dt, name):
    """The inputs of JAX_SORTS' `name` for keys of type `dt` (ties, -0, NaNs of both signs, infinities) and it."""
    rs = np.random.RandomState(3)
    with np.errstate(invalid="ignore"):  # NaN payloads cast to f16/bf16
        row = np.concatenate([SORT_SPECIAL, np.round(rs.randn(17), 1).astype(np.float32)]).astype(dt)
    x = np.stack([row, row[::-1], rs.permutation(row), np.zeros_like(row), -row])
    y = rs.randint(-4, 5, x.shape).astype(np.int32)
    nargs, f = JAX_SORTS[name]
    return f, [x, y][:nargs]


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16, BF], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(JAX_SORTS))
def test_sort_jax_comparators_run_vectorized(monkeypatch, dt, name):
    """jax's sorts (NaN/-0 canonicalizing TOTALORDER comparators, lexicographic keys) vs XLA:CPU, bit for bit,
    without calling the comparator per comparison."""
    f, args = _jax_sort_case(dt, name)
    text = jax.jit(f).lower(*args).as_text(dialect="hlo")
    want = run_on_xla_cpu(text, args)
    monkeypatch.setattr(IX, "_comparator_permutation", _no_slow_sort)
    _bit_equal(hloexec.load(text).run(*args), want)


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16, BF], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", ["argsort", "argsort-descending", "sort-payload", "sort-2keys", "lexsort"])
def test_sort_xla_cpus_optimized_comparators_run_vectorized(monkeypatch, dt, name):
    """XLA:CPU's optimized modules of jax's sorts compare a key's total order by hand (`select(b < 0, b xor MAX,
    b)`, b the bits of the canonicalized key): read as the float's TOTALORDER key, they run as keys, bit for bit
    XLA:CPU's result (before: one comparator call per comparison)."""
    f, args = _jax_sort_case(dt, name)
    text = jax.jit(f).lower(*args).compile().as_text()
    assert " bitcast(" in text and " xor(" in text  # (the premise: the form by hand)
    want = jax.jit(f)(*args)
    monkeypatch.setattr(IX, "_comparator_permutation", _no_slow_sort)
    _bit_equal(hloexec.load(text).run(*args), jax.tree_util.tree_leaves(want))


def test_sort_a_total_order_by_hand_compared_gt_sorts_descending(monkeypatch):
    """The total order by hand under a GT root (jax sorts descending by reversing, so an edit of its text): read as
    a descending TOTALORDER key, run as keys, bit for bit XLA:CPU's (its bitcasts as bitcast-converts: XLA does not
    compile an optimized module's scalar bitcast again)."""
    f, args = _jax_sort_case(np.float32, "sort-payload")
    text, count = re.subn(r"(ROOT %\S+ = pred\[\] compare\(%select, %select.1\)), direction=LT", r"\1, direction=GT",
                          jax.jit(f).lower(*args).compile().as_text())
    assert count == 1
    exe = hloexec.load(text)
    [sort] = [i for c in exe.module.computations for i in c.instructions if i.opcode == "sort"]
    [key] = IX.sort_keys(sort.called["to_apply"].root)
    assert key.compare_type == "TOTALORDER" and key.descending and key.root.shape.element_type.kind == "float"
    want = run_on_xla_cpu(text.replace(" bitcast(", " bitcast-convert("), args)
    monkeypatch.setattr(IX, "_comparator_permutation", _no_slow_sort)
    _bit_equal(exe.run(*args), want)


NEAR_TOTAL_ORDERS = {  # what breaks the total order by hand (XLA:CPU's form of an f32 key): a pattern, its edit
    "xor-constant": (r"constant\(2147483647\)", "constant(2147483646)"),
    "sign-test": (r"(compare\(%bitcast[.\d]*, %constant\)), direction=LT", r"\1, direction=GT"),
    "branches": (r"select\((%compare[.\d]*), (%xor[.\d]*), (%bitcast[.\d]*)\)", r"select(\1, \3, \2)"),
}


@pytest.mark.parametrize("edit", sorted(NEAR_TOTAL_ORDERS))
def test_sort_comparators_almost_a_total_order_by_hand_are_not_read(edit):
    """A comparator one edit away from the total order by hand (another xor constant, the sign tested the other
    way, the select's branches swapped) orders otherwise: not read as keys; it runs by comparisons, as XLA:CPU does
    (its bitcasts as bitcast-converts: XLA does not compile an optimized module's scalar bitcast again)."""
    f, args = _jax_sort_case(np.float32, "sort-payload")
    pattern, edit = NEAR_TOTAL_ORDERS[edit]
    text, count = re.subn(pattern, edit, jax.jit(f).lower(*args).compile().as_text())
    assert count >= 1
    exe = hloexec.load(text)
    [sort] = [i for c in exe.module.computations for i in c.instructions if i.opcode == "sort"]
    assert IX.sort_keys(sort.called["to_apply"].root) is None
    _bit_equal(exe.run(*args), run_on_xla_cpu(text.replace(" bitcast(", " bitcast-convert("), args))


def _sort_module(comparator_body: str) -> str:
    """sort((f32[3,12], s32[3,12])) along dimension 1 by a comparator of a, b: f32 and c, d: s32."""
    return f"""HloModule m
cmp {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = s32[] parameter(2)
  d = s32[] parameter(3){comparator_body}
}}
ENTRY e {{
  x = f32[3,12] parameter(0)
  y = s32[3,12] parameter(1)
  ROOT s = (f32[3,12], s32[3,12]) sort(x, y), dimensions={{1}}, is_stable=true, to_apply=cmp
}}"""


SORT_COMPARATORS = {  # name -> (runs vectorized, comparator body): valid orders all
    # lexicographic through select, the first key descending (operands swapped), the second descending (GT)
    "select-lexicographic": (True, """
  eq = pred[] compare(a, b), direction=EQ, type=TOTALORDER
  gt1 = pred[] compare(c, d), direction=GT
  lt0 = pred[] compare(b, a), direction=LT, type=TOTALORDER
  ROOT r = pred[] select(eq, gt1, lt0)"""),
    # a key of the second operand only, through arithmetic: sorts by -(d >> 1)
    "int-expression": (True, """
  one = s32[] constant(1)
  sc = s32[] shift-right-arithmetic(c, one)
  nc = s32[] negate(sc)
  sd = s32[] shift-right-arithmetic(d, one)
  nd = s32[] negate(sd)
  ROOT r = pred[] compare(nc, nd), direction=LT, type=SIGNED"""),
    # the two sides differ (2a against b + b): a valid order, but not one expression of each side
    "unmirrored": (False, """
  two = f32[] constant(2)
  a2 = f32[] multiply(a, two)
  b2 = f32[] add(b, b)
  ROOT r = pred[] compare(a2, b2), direction=LT, type=TOTALORDER"""),
    # XLA's old total order by hand: bitcast to s32, flip the magnitude bits of negatives; descending
    "bitcast-total-order": (True, """
  zero = s32[] constant(0)
  magnitude = s32[] constant(2147483647)
  ia = s32[] bitcast-convert(a)
  na = pred[] compare(ia, zero), direction=LT
  xa = s32[] xor(ia, magnitude)
  ka = s32[] select(na, xa, ia)
  ib = s32[] bitcast-convert(b)
  nb = pred[] compare(ib, zero), direction=LT
  xb = s32[] xor(ib, magnitude)
  kb = s32[] select(nb, xb, ib)
  ROOT r = pred[] compare(ka, kb), direction=GT"""),
    # equal constants written twice
    "equal-constants": (True, """
  one = s32[] constant(1)
  one2 = s32[] constant(1)
  c1 = s32[] multiply(c, one)
  d1 = s32[] multiply(d, one2)
  ROOT r = pred[] compare(c1, d1), direction=LT"""),
    # a commuted operand on one side only
    "commuted": (False, """
  one = s32[] constant(1)
  c1 = s32[] add(c, one)
  d1 = s32[] add(one, d)
  ROOT r = pred[] compare(c1, d1), direction=LT"""),
}


@pytest.mark.parametrize("name", sorted(SORT_COMPARATORS))
def test_sort_comparator_forms(monkeypatch, name):
    """Hand-written comparators vs XLA:CPU; the ones not recognized as keys run per comparison."""
    vectorized, body = SORT_COMPARATORS[name]
    text = _sort_module(body)
    rs = np.random.RandomState(4)
    x = np.round(rs.randn(3, 12), 0).astype(np.float32)
    x[0, :4] = [np.nan, -0.0, 0.0, -np.inf]
    y = rs.randint(-6, 6, x.shape).astype(np.int32)
    assert _runs_per_comparison(monkeypatch, text, x, y) != vectorized


def _runs_per_comparison(monkeypatch, text: str, x, y) -> bool:
    """Whether hloexec's sort `text` called its comparator per comparison (its result checked against XLA:CPU's)."""
    from hloexec.tools.xla_cpu import run_on_xla_cpu

    want = run_on_xla_cpu(text, [x, y])
    slow_calls = []
    slow = IX._comparator_permutation
    monkeypatch.setattr(IX, "_comparator_permutation", lambda *a: slow_calls.append(1) or slow(*a))
    _bit_equal(hloexec.load(text).run(x, y), want)
    return bool(slow_calls)


_TIE_BREAK = """
  lt = pred[] compare(a, b), direction=LT, type=TOTALORDER
  eq = pred[] compare({eq}), direction=EQ
  lt1 = pred[] compare(c, d), direction=LT
  tie = pred[] and(eq, lt1)
  ROOT r = pred[] or(lt, tie)"""
NOT_KEYS = {  # comparator bodies (see _sort_module) that compare no keys: they must run per comparison
    "different-constants": """
  one = s32[] constant(1)
  two = s32[] constant(2)
  c1 = s32[] multiply(c, one)
  d2 = s32[] multiply(d, two)
  ROOT r = pred[] compare(c1, d2), direction=LT""",
    "both-elements-on-one-side": """
  ab = f32[] add(a, b)
  ROOT r = pred[] compare(ab, b), direction=LT""",
    "non-strict": "\n  ROOT r = pred[] compare(c, d), direction=LE",
    # lexicographic in shape, but the tie is not the first key's equality: of the second key's operands
    # (the EQ compares c, d), or of the first key under another order (plain EQ beside a TOTALORDER LT)
    "tie-of-another-key": _TIE_BREAK.format(eq="c, d"),
    "tie-of-another-order": _TIE_BREAK.format(eq="a, b"),
}


@pytest.mark.parametrize("name", sorted(NOT_KEYS))
def test_sort_comparators_that_are_not_keys(name):
    module = hloexec.parse(_sort_module(NOT_KEYS[name]))[0]
    comparator = next(c for c in module.computations if c.name == "cmp")
    assert IX.sort_keys(comparator.root) is None


TOPK_DECOMPOSITION = """
  eq = pred[] compare(a, b), direction=EQ, type=TOTALORDER
  lt1 = pred[] compare(c, d), direction=LT
  gt = pred[] compare(a, b), direction=GT
  ROOT r = pred[] select(eq, lt1, gt)"""


def test_sort_topk_decomposition_runs_vectorized(monkeypatch):
    """XLA's TopK decomposition's comparator (compare-value-and-index: a TOTALORDER EQ as the tie of a plain GT,
    then the index) runs as keys, and matches XLA:CPU on values with ties (without NaN or zeros: there its
    TOTALORDER tie and FLOAT order part, the comparator is no strict weak order, the order unspecified)."""
    rs = np.random.RandomState(5)
    x = (np.round(rs.randn(3, 12), 0) + 0.5).astype(np.float32)  # (ties, no zeros)
    y = rs.randint(-6, 6, x.shape).astype(np.int32)
    assert not _runs_per_comparison(monkeypatch, _sort_module(TOPK_DECOMPOSITION), x, y)
