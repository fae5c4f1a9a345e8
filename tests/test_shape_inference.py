"""Shape inference (hloexec/ir/shape_inference.py): one set of rules, used by the parser for omitted shapes and by
the op registry to check written ones.

* over the examples and ../shared/corpus/xla, every instruction whose opcode has a rule gets its written shape
  back from its operands and attributes (the corpus files XLA's tests write inconsistent on purpose are listed);
* instructions written without a shape are inferred for every opcode with a rule, and run;
* an omitted shape that cannot be inferred, and a written shape the operands contradict, are clear errors.
"""
from __future__ import annotations

import numpy as np
import pytest

import hloexec
from conftest import EXAMPLES, shared_path
from hloexec.errors import HloParseError, UnsupportedError
from hloexec.ir.shape import parse_shape
from hloexec.ir.shape_inference import INFERABLE, RESULT_TYPE_FREE, ShapeInferenceError, check_shape, infer_shape
from test_parser_errors import at, parse_error

# Corpus files whose written shapes XLA's verifier would reject (tests of passes and importers that skip it):
# file -> (instruction, why).
INCONSISTENT = {
    "xla__hlo__transforms__tests__operand_upcaster.hlo": ("result", "a dot without contracting dimensions is an "
                                                          "outer product, written s32[8]"),
    "xla__hlo__transforms__tests__rewrite_bf16_conv_to_onednn.hlo": (
        "convolution", "batch 8 written as 4, and a spatial dimension padded -1_-1 below the window's size 3"),
    "xla__hlo__translate__hlo_to_mhlo__tests__import.hlo": ("reduce.2", "a reduce with an f32[4] init value"),
    "xla__tools__tests__data__invalid_concat.hlo": ("cat.3", "concatenated operands differing outside the axis"),
}


def _mismatches(path) -> list[tuple[str, str]]:
    """(instruction, why) for every instruction of `path` with a rule whose written shape is not inferred."""
    try:
        modules = hloexec.parse(path)
    except HloParseError:
        return []           # files of other dialects (the corpus holds some); the parser tests cover them
    out = []
    for module in modules:
        for comp in module.computations:
            for inst in comp.instructions:
                if inst.opcode not in INFERABLE:
                    continue
                operands = [o.shape for o in inst.operands]
                try:
                    inferred = infer_shape(inst.opcode, operands, inst.attr)
                except ShapeInferenceError as e:
                    out.append((inst.name, f"cannot infer: {e}"))
                    continue
                same = inferred.dims == inst.shape.dims if inst.opcode in RESULT_TYPE_FREE and \
                    not inst.shape.is_tuple else inferred.same_dims_and_type(inst.shape)
                if not same:
                    out.append((inst.name, f"written {inst.shape.to_text(False)}, inferred {inferred.to_text(False)}"))
    return out


def test_examples_shapes_are_inferred():
    files = sorted(EXAMPLES.glob("*.hlo"))
    assert files
    problems = [f"{p.name}: {name}: {why}" for p in files for name, why in _mismatches(p)]
    assert not problems, "\n".join(problems)


def test_corpus_shapes_are_inferred():
    files = sorted(shared_path("corpus", "xla").glob("*.hlo"))
    problems = []
    for p in files:
        found = _mismatches(p)
        if p.name in INCONSISTENT:
            name, why = INCONSISTENT[p.name]
            assert name in [n for n, _ in found], f"{p.name}: {name} ({why}) is no longer inconsistent"
            found = [f for f in found if f[0] != name]
        problems += [f"{p.name}: {name}: {why}" for name, why in found]
    assert not problems, f"{len(problems)} written shapes not inferred:\n" + "\n".join(problems[:30])


OMITTED = """HloModule omitted

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = add(%a, %b)
}

ENTRY %main (p0: f32[2,3], p1: f32[3,4], i: s32[2,1]) -> (f32[7], pred[4,2], f32[2,3], s32[2,3], f32[2,3]) {
  %p0 = f32[2,3] parameter(0)
  %p1 = f32[3,4] parameter(1)
  %i = s32[2,1] parameter(2)
  %d = dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %t = transpose(%d), dimensions={1,0}
  %e = exponential(%t)
  %c = compare(%t, %e), direction=LT
  %sel = select(%c, %t, %e)
  %sl = slice(%sel), slice={[0:4:2], [0:2]}
  %cat = concatenate(%sl, %sl), dimensions={0}
  %zero = f32[] constant(0)
  %r = reduce(%cat, %zero), dimensions={1}, to_apply=%add
  %pd = pad(%r, %zero), padding=1_2
  %rev = reverse(%p0), dimensions={0}
  %cl = clamp(%zero, %rev, %zero)
  %ci = s32[2,3] convert(%p0)
  %sh = shift-left(%ci, %ci)
  %g = gather(%p0, %i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,3}
  %tp = tuple(%cl, %sh)
  %gt = get-tuple-element(%tp), index=0
  %k = s32[] constant(0)
  %dus = dynamic-update-slice(%gt, %g, %k, %k)
  ROOT %out = tuple(%pd, %c, %dus, %sh, %g)
}
"""


def test_omitted_shapes_are_inferred_and_run():
    module = hloexec.parse(OMITTED)[0]
    shapes = {i.name: i.shape.to_text(layout=False) for i in module.entry.instructions}
    assert shapes["d"] == "f32[2,4]" and shapes["t"] == "f32[4,2]" and shapes["c"] == "pred[4,2]"
    assert shapes["sl"] == "f32[2,2]" and shapes["cat"] == "f32[4,2]" and shapes["r"] == "f32[4]"
    assert shapes["pd"] == "f32[7]" and shapes["g"] == "f32[2,3]" and shapes["tp"] == "(f32[2,3], s32[2,3])"
    assert module["add"].root.shape.to_text() == "f32[]"
    assert module.entry.root.shape.to_text(layout=False) == "(f32[7], pred[4,2], f32[2,3], s32[2,3], f32[2,3])"
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    idx = np.array([[1], [0]], np.int32)
    pd, c, dus, sh, g = hloexec.load(OMITTED, use_numba=False).run(x, y, idx)
    t = (x @ y).T
    sl = np.where(t < np.exp(t), t, np.exp(t))[0:4:2, 0:2]
    np.testing.assert_allclose(pd, np.pad(np.concatenate([sl, sl]).sum(1), (1, 2)), rtol=1e-5)
    np.testing.assert_array_equal(g, x[[1, 0]])
    np.testing.assert_array_equal(dus, g)


def test_an_uninferable_omitted_shape_points_at_its_opcode():
    text = OMITTED.replace("  %k = s32[] constant(0)\n", "  %k = s32[] constant(0)\n  %bad = convert(%p0)\n").encode()
    e = parse_error(text)
    assert "the shape of this convert is omitted and cannot be inferred (convert has no shape rule); write it" \
        in str(e)
    assert (e.line, e.column) == at(text, b"convert(%p0)\n  %dus")


def test_operands_that_do_not_fit_are_a_parse_error_naming_why():
    text = OMITTED.replace("rhs_contracting_dims={0}", "rhs_contracting_dims={1}").encode()
    e = parse_error(text)
    assert "the shape of this dot is omitted and cannot be inferred (contracting dimensions [1] of f32[2,3] and " \
           "[1] of f32[3,4] differ); write it" in str(e)
    assert (e.line, e.column) == at(text, b"dot(")


def test_a_bad_attribute_of_an_omitted_shape_points_at_the_value():
    text = OMITTED.replace("dimensions={1,0}", "dimensions={1,x}").encode()
    e = parse_error(text)
    assert "dimensions" in str(e) and (e.line, e.column) == at(text, b"{1,x}")


def test_check_shape():
    f23, f32_ = parse_shape("f32[2,3]"), parse_shape("f32[3,2]")
    attrs = {"dimensions": (1, 0)}.get
    assert check_shape("transpose", [f23], attrs, f32_) is None
    assert check_shape("transpose", [f23], attrs, f23) == "transpose of f32[2,3] gives f32[3,2]"
    assert check_shape("reshape", [f23], attrs, parse_shape("f32[5]")) == \
        "the operand f32[2,3] has 6 elements, the result 5"
    assert check_shape("transpose", [f23], {}.get, f23) is None     # no dimensions: the op itself says so
    dot_attrs = {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0,)}.get
    lhs, rhs = parse_shape("bf16[2,3]"), parse_shape("bf16[3,2]")
    assert check_shape("dot", [lhs, rhs], dot_attrs, parse_shape("f32[2,2]")) is None   # preferred_element_type
    assert check_shape("dot", [lhs, rhs], dot_attrs, parse_shape("bf16[2,3]")) == \
        "dot of bf16[2,3], bf16[3,2] gives bf16[2,2]"
    f32_ = parse_shape("f32[]")        # mixed float precision, as TPU dumps write it (XLA's verifier allows it)
    assert check_shape("multiply", [f32_, f32_], {}.get, parse_shape("bf16[]")) is None
    assert check_shape("multiply", [f32_, f32_], {}.get, parse_shape("s32[]")) == "multiply of f32[], f32[] gives f32[]"


def test_a_contradicted_written_shape_fails_when_loaded():
    text = """HloModule m
ENTRY %main (p: f32[2,4]) -> f32[2,4] {
  %p = f32[2,4] parameter(0)
  ROOT %t = f32[2,4] transpose(%p), dimensions={1,0}
}
"""
    hloexec.parse(text)             # the parser takes a written shape as written; preparing the op checks it
    with pytest.raises(UnsupportedError, match=r"shape f32\[2,4\] is not what the operands give: transpose of "
                                            r"f32\[2,4\] gives f32\[4,2\]"):
        hloexec.load(text, use_numba=False)


def test_omitted_shapes_of_tuple_results_and_of_ops_without_operands():
    module = hloexec.parse("""HloModule m
ENTRY e { a = after-all()
  p = partition-id()
  x = f32[4] parameter(0)
  t = topk(x), k=2
  b = batch-norm-training(x, x, x), epsilon=0.1, feature_index=0
  ROOT r = tuple(a, p, t, b) }""")[0]
    assert module.entry.root.shape.to_text() == "(token[], u32[], (f32[2], s32[2]), (f32[4], f32[4], f32[4]))"
    e = parse_error(b"""HloModule m
ENTRY e { x = f32[4] parameter(0)
  z = f32[] constant(0)
  ROOT r = reduce(x, z, z), dimensions={0}, to_apply=e }""")
    assert "reduce is omitted and cannot be inferred (expects an even number of operands" in str(e)
