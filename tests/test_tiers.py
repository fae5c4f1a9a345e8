"""Every tier of hloexec gives the numpy tier's answer (tests/tiers.py): bit for bit where the ops are exact.

* the compiled-loop bugs of issue 12, each an HLO module: nested loops updating their carried values in
  parallel (the outer loop once moved the inner loop's per-step buffers above itself), scatter whose updates
  are its operand, a conditional returning its argument beside an in-place update of that argument, and
  the nested loop run long enough to switch from interpreted to compiled under the default settings;
* a generated family of loop programs (tests/loop_programs.py): nested loops, parallel updates of several
  carried values, in-place updates, scatter, conditionals, calls, hoisted invariants, loops switching
  tiers after their first step;
* the bundled examples.

The op tests' own cases go through every tier at the end of each op test module (conftest.py,
tiers.sweep_op_cases).
"""
from __future__ import annotations

import numpy as np
import pytest

import hloexec
from conftest import EXAMPLES
from hloexec.tools.xla_cpu import load_arrays
from loop_programs import loop_program
from tiers import TIERS, Case, NotInTier, assert_tiers_agree

NESTED = """HloModule nested_loops

%inner_body (p: (s32[], f32[4], f32[4])) -> (s32[], f32[4], f32[4]) {
  %p = (s32[], f32[4]{0}, f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %a = f32[4]{0} get-tuple-element(%p), index=1
  %b = f32[4]{0} get-tuple-element(%p), index=2
  %a1 = f32[4]{0} add(%a, %b)
  %b1 = f32[4]{0} subtract(%a, %b)
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[4]{0}, f32[4]{0}) tuple(%i1, %a1, %b1)
}

%inner_cond (p: (s32[], f32[4], f32[4])) -> pred[] {
  %p = (s32[], f32[4]{0}, f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(INNER)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%outer_body (q: (s32[], f32[4], f32[4])) -> (s32[], f32[4], f32[4]) {
  %q = (s32[], f32[4]{0}, f32[4]{0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %x = f32[4]{0} get-tuple-element(%q), index=1
  %y = f32[4]{0} get-tuple-element(%q), index=2
  %z = s32[] constant(0)
  %t = (s32[], f32[4]{0}, f32[4]{0}) tuple(%z, %x, %y)
  %w = (s32[], f32[4]{0}, f32[4]{0}) while(%t), condition=%inner_cond, body=%inner_body
  %wa = f32[4]{0} get-tuple-element(%w), index=1
  %wb = f32[4]{0} get-tuple-element(%w), index=2
  %one = s32[] constant(1)
  %j1 = s32[] add(%j, %one)
  %half = f32[] constant(SCALE)
  %h = f32[4]{0} broadcast(%half), dimensions={}
  %x1 = f32[4]{0} multiply(%wa, %h)
  %y1 = f32[4]{0} multiply(%wb, %h)
  ROOT %r = (s32[], f32[4]{0}, f32[4]{0}) tuple(%j1, %x1, %y1)
}

%outer_cond (q: (s32[], f32[4], f32[4])) -> pred[] {
  %q = (s32[], f32[4]{0}, f32[4]{0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(OUTER)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (x: f32[4], y: f32[4]) -> (s32[], f32[4], f32[4]) {
  %x = f32[4]{0} parameter(0)
  %y = f32[4]{0} parameter(1)
  %z = s32[] constant(0)
  %t = (s32[], f32[4]{0}, f32[4]{0}) tuple(%z, %x, %y)
  ROOT %w = (s32[], f32[4]{0}, f32[4]{0}) while(%t), condition=%outer_cond, body=%outer_body
}
"""
XY = [np.array([1, 2, 3, 4], np.float32), np.array([10, 20, 30, 40], np.float32)]


def nested(inner, outer, scale):
    return NESTED.replace("INNER", str(inner)).replace("OUTER", str(outer)).replace("SCALE", str(scale))


def test_nested_loops_updating_in_parallel():
    """Issue 12: (2, x/2, y/2) in XLA:CPU; the compiled loop gave (2, [2.6875, ...], [1.75, ...])."""
    results = assert_tiers_agree(Case("nested_loops", nested(3, 2, 0.25), XY))
    assert all(not isinstance(r, NotInTier) for name, r in results.items() if name != "fused")
    i, a, b = results["numpy"]
    assert i == 2 and np.array_equal(a, XY[0] / 2) and np.array_equal(b, XY[1] / 2)


def test_nested_loops_switching_to_compiled_mid_run():
    """Issue 12: 20,000 outer steps under the default settings switch to the compiled loop after a few
    thousand and came out all NaN. Two inner steps make (2a, 2b), scaled by 0.5: every outer step is exact
    identity, so the answer is the inputs."""
    exe = hloexec.load(nested(2, 20000, 0.5), compile="eager", compile_after=1)
    i, a, b = exe.run(*XY)
    ((loop,),) = [[s.kernel for s in exe.plan.steps if s.inst.opcode == "while"]]
    assert loop.compiled is not None and 0 < loop.work[0] < 20000 * loop.step_work, "no switch mid-run"
    assert i == 20000 and np.array_equal(a, XY[0]) and np.array_equal(b, XY[1])


SCATTER_ITS_OPERAND = """HloModule scatter_its_operand
%set (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  ROOT %b = f32[] parameter(1)
}
%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4] get-tuple-element(%p), index=1
  %idx = s32[4,1] constant({{1},{2},{3},{0}})
  %u = f32[4] scatter(%x, %idx, %x), update_window_dims={}, inserted_window_dims={0},
    scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%set
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[4]) tuple(%i1, %u)
}
%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(2)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
ENTRY %main (x: f32[4]) -> (s32[], f32[4]) {
  %x = f32[4] parameter(0)
  %z = s32[] constant(0)
  %t = (s32[], f32[4]) tuple(%z, %x)
  ROOT %w = (s32[], f32[4]) while(%t), condition=%cond, body=%body
}
"""

BRANCH_RETURNS_ITS_ARGUMENT = """HloModule branch_returns_its_argument
%id (a: f32[4]) -> f32[4] {
  ROOT %a = f32[4] parameter(0)
}
%neg (a: f32[4]) -> f32[4] {
  %a = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%a)
}
%body (p: (s32[], f32[4], f32[4])) -> (s32[], f32[4], f32[4]) {
  %p = (s32[], f32[4], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4] get-tuple-element(%p), index=1
  %zero = s32[] constant(0)
  %pr = pred[] compare(%i, %zero), direction=GE
  %c = f32[4] conditional(%pr, %x, %x), true_computation=%id, false_computation=%neg
  %v = f32[1] constant({100})
  %d = f32[4] dynamic-update-slice(%x, %v, %zero)
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[4], f32[4]) tuple(%i1, %d, %c)
}
%cond (p: (s32[], f32[4], f32[4])) -> pred[] {
  %p = (s32[], f32[4], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(1)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
ENTRY %main (x: f32[4]) -> (s32[], f32[4], f32[4]) {
  %x = f32[4] parameter(0)
  %z = s32[] constant(0)
  %t = (s32[], f32[4], f32[4]) tuple(%z, %x, %x)
  ROOT %w = (s32[], f32[4], f32[4]) while(%t), condition=%cond, body=%body
}
"""


def test_scatter_whose_updates_are_its_operand():
    """`scatter(x, perm, x)` in a compiled loop wrote x in place while reading its updates from x: [1, 1, 1, 1]."""
    results = assert_tiers_agree(Case("scatter_its_operand", SCATTER_ITS_OPERAND, XY[:1]))
    assert np.array_equal(results["loop"][1], [3, 4, 1, 2])


def test_branch_result_aliasing_an_argument_written_in_place():
    """A conditional returning its argument, then a dynamic-update-slice of that argument: the compiled loop
    wrote the update in place, into the branch's result too."""
    results = assert_tiers_agree(Case("branch_returns_its_argument", BRANCH_RETURNS_ITS_ARGUMENT, XY[:1]))
    assert np.array_equal(results["loop"][2], XY[0])


LOOP_SEEDS = 8


@pytest.mark.parametrize("seed", range(LOOP_SEEDS))
def test_generated_loop_programs_agree_in_every_tier(seed):
    text, inputs = loop_program(seed)
    results = assert_tiers_agree(Case(f"loop_program({seed})", text, inputs))
    for tier in ("loop", "switched"):
        assert not isinstance(results[tier], NotInTier), f"{tier}: {results[tier]}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(LOOP_SEEDS, 400))
def test_more_generated_loop_programs_agree_in_every_tier(seed):
    test_generated_loop_programs_agree_in_every_tier(seed)


def test_adding_a_tier_is_one_entry(monkeypatch):
    monkeypatch.setitem(TIERS, "negated", lambda case: [-x for x in TIERS["numpy"](case)])
    with pytest.raises(AssertionError, match="negated: out0"):
        assert_tiers_agree(Case("nested_loops", nested(3, 2, 0.25), XY))


INT4_OPS = """HloModule int4_ops

ENTRY %main () -> (pred[3], s4[3], s8[3]) {
  %a = s4[3]{0} constant({-3, 1, -8})
  %b = s4[3]{0} constant({3, 2, 1})
  %lt = pred[3]{0} compare(%a, %b), direction=LT
  %one = s4[3]{0} constant({1, 1, 1})
  %sra = s4[3]{0} shift-right-arithmetic(%a, %one)
  %cv = s8[3]{0} convert(%a)
  ROOT %t = (pred[3]{0}, s4[3]{0}, s8[3]{0}) tuple(%lt, %sra, %cv)
}
"""


def test_int4_module_of_the_issue():
    """Issue 12: hloexec read s4 as unsigned in compare and shifted its byte logically: lt = [0, 1, 0],
    sra = [6, 0, 4]; XLA:CPU: [1, 1, 1], [-2, 0, -4], [-3, 1, -8]. Sub-byte types run op by op in every tier
    (the generators refuse them)."""
    results = assert_tiers_agree(Case("int4_ops", INT4_OPS, []))
    lt, sra, cv = results["numpy"]
    assert lt.tolist() == [True, True, True] and sra.tolist() == [-2, 0, -4] and cv.tolist() == [-3, 1, -8]
    assert isinstance(results["loop"], NotInTier)


OP_TEST_MODULES = ["test_ops_elementwise.py", "test_ops_movement.py", "test_ops_reduction.py",
                   "test_ops_indexing.py", "test_ops_contraction.py"]


@pytest.mark.slow
def test_every_op_case_in_every_tier():
    """Every case of the op tests through every tier (by default a sample of each module's cases goes; see
    tiers.sweep_op_cases): the op test modules run again with HLOEXEC_TIERS=all (~15 min on 2 cores)."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                           *[os.path.join(here, m) for m in OP_TEST_MODULES]],
                          env={**os.environ, "HLOEXEC_TIERS": "all"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
