"""The fusion pass over unfused computations (hloexec/exec/fuse.py) and the tiered kernels that run them.

Grouped chains must give the bits of the op-by-op path (elementwise ops are exact in both, f16 rounded
after every op in both), keep every value something outside the group reads, and never move work
across a non-fusible op. End-to-end checks against XLA:CPU are in test_programs.py ("pre-fused").
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import hloexec
from hloexec.exec.tiering import TieredKernel
from hloexec.exec.fuse import MAX_GROUP

# a: an elementwise chain whose middle value `t` also feeds a dot (so it must stay stored), a scalar
# broadcast shared by two groups and the dot's consumer, and a reduce fed by an elementwise producer.
MIXED = """HloModule mixed
add { x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y) }
ENTRY main {
  p = f32[256,256] parameter(0)
  q = f32[256,256] parameter(1)
  half = f32[] constant(0.5)
  h = f32[256,256] broadcast(half), dimensions={}
  a = f32[256,256] multiply(p, h)
  t = f32[256,256] tanh(a)
  d = f32[256,256] dot(t, q), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  e = f32[256,256] exponential(t)
  u = f32[256,256] add(e, d)
  v = f32[256,256] multiply(u, h)
  sq = f32[256,256] multiply(v, v)
  z = f32[] constant(0)
  r = f32[256] reduce(sq, z), dimensions={1}, to_apply=add
  ROOT out = (f32[256,256], f32[256]) tuple(v, r)
}
"""

def _f16_chain(suffix: str = "", first_parameter: int = 0) -> str:
    """An f16 chain with a round trip through f32, its names suffixed: the lines of one fusion group."""
    return f"""  x{suffix} = f16[64,1024] parameter({first_parameter})
  y{suffix} = f16[64,1024] parameter({first_parameter + 1})
  a{suffix} = f16[64,1024] add(x{suffix}, y{suffix})
  m{suffix} = f16[64,1024] multiply(a{suffix}, x{suffix})
  s{suffix} = f16[64,1024] subtract(m{suffix}, y{suffix})
  c{suffix} = f32[64,1024] convert(s{suffix})
  k{suffix} = f32[] constant(3)
  kb{suffix} = f32[64,1024] broadcast(k{suffix}), dimensions={{}}
  d{suffix} = f32[64,1024] divide(c{suffix}, kb{suffix})
  back{suffix} = f16[64,1024] convert(d{suffix})"""


F16_CHAIN = f"HloModule f16chain\nENTRY main {{\n{_f16_chain()}\n}}\n".replace("  back =", "  ROOT back =")


def _inputs(exe, seed=0):
    return exe.random_inputs(seed)


def _leaves(value):
    return list(value) if isinstance(value, tuple) else [value]


def _groups(exe):
    return [g for plan in exe.plans for g in plan.fused_groups]


def test_groups_follow_the_rules():
    exe = hloexec.load(MIXED, compile="eager")
    groups = {g.root.name: g for g in _groups(exe)}
    # t feeds the dot: it ends a group (a, t) and is stored; e, u, v fuse; sq feeds the reduce's group
    assert set(groups) == {"t", "v", "r"}
    assert [m.name for m in groups["t"].members] == ["a", "t"]
    assert [m.name for m in groups["v"].members] == ["e", "u", "v"]
    assert [m.name for m in groups["r"].members] == ["sq", "r"]
    assert {i.name for i in groups["r"].inputs} == {"v"}
    # the shared scalar broadcast is copied into the groups, never stored as a [256,256] array
    steps = [s.inst.name for s in exe.plan.steps]
    assert "h" not in steps and "a" not in steps and "e" not in steps and "sq" not in steps
    assert {"t", "d", "v", "r"} <= set(steps)
    assert all(isinstance(g.kernel, type(groups["t"].kernel)) for g in groups.values())


def test_grouped_run_matches_op_by_op():
    fused, reference = hloexec.load(MIXED, compile="eager"), hloexec.load(MIXED, use_numba=False)
    inputs = _inputs(reference)
    got, want = _leaves(fused.run(*inputs)), _leaves(reference.run(*inputs))
    # tanh / exp are libm's in the kernel and numpy's op by op (an ULP apart), amplified through the dot
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * np.abs(w).max())


def test_f16_chain_is_bit_identical_to_op_by_op():
    fused, reference = hloexec.load(F16_CHAIN, compile="eager"), hloexec.load(F16_CHAIN, use_numba=False)
    assert len(_groups(fused)) == 1 and len(fused.plan.steps) == 1
    inputs = _inputs(reference, seed=3)
    assert fused.run(*inputs).tobytes() == reference.run(*inputs).tobytes()


def test_tiered_kernel_interprets_then_compiles():
    exe = hloexec.load(F16_CHAIN, compile="eager", compile_after=1)    # op by op once, compiled from then on
    kernel = exe.plan.steps[0].kernel
    assert isinstance(kernel, TieredKernel) and kernel.calls == {}
    interpreted = []
    interpret = kernel.interpret
    kernel.interpret = lambda *operands: interpreted.append(1) or interpret(*operands)
    inputs = _inputs(exe, seed=5)
    first = exe.run(*inputs)
    assert interpreted == [1]
    second = exe.run(*inputs)
    assert interpreted == [1] and kernel.compiled._fn is not None      # the second run compiled it
    assert first.tobytes() == second.tobytes()                          # exact ops: both tiers agree


def test_a_kernel_that_does_not_compile_runs_op_by_op_with_a_warning(monkeypatch):
    from hloexec.errors import CompileWarning
    from hloexec.kernels.fusion import FusedKernel

    def broken(self):
        raise RuntimeError("generated code does not compile")
    monkeypatch.setattr(FusedKernel, "compile", broken)
    reference = hloexec.load(F16_CHAIN, use_numba=False)
    inputs = _inputs(reference, seed=2)
    want = reference.run(*inputs)
    for options in ({"compile": "eager"}, {"compile": "eager", "compile_after": 1}):
        with pytest.warns(CompileWarning, match="does not compile"):
            exe = hloexec.load(F16_CHAIN, **options)
            runs = [exe.run(*inputs) for _ in range(2)]
        assert all(r.tobytes() == want.tobytes() for r in runs)


def test_small_chains_stay_op_by_op():
    small = F16_CHAIN.replace("64,1024", "4,8")
    exe = hloexec.load(small, compile="eager")
    assert _groups(exe) == [] and len(exe.plan.steps) == 8      # every instruction but the parameters


def test_groups_are_bounded():
    n = MAX_GROUP + 50
    body = "\n".join(f"  x{k + 1} = f32[128,128] add(x{k}, p)" for k in range(n))
    text = f"HloModule long\nENTRY main {{\n  p = f32[128,128] parameter(0)\n  x0 = f32[128,128] negate(p)\n" \
           f"{body}\n  ROOT r = f32[128,128] negate(x{n})\n}}\n"
    groups = _groups(hloexec.load(text, compile="eager", compile_after=1))
    assert len(groups) == 2 and max(len(g.members) for g in groups) == MAX_GROUP


def _traced_run_peak(exe, inputs) -> int:
    """Bytes numpy allocated at the peak of one run (numpy reports its buffers to tracemalloc)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        exe.run(*inputs)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_peak_memory_counts_only_stored_values_once_compiled():
    fused = hloexec.load(F16_CHAIN, compile="eager")
    assert fused.peak_bytes() == 3 * 64 * 1024 * 2          # x, y and the result: no temporaries


@pytest.mark.parametrize("options", [{"use_numba": False}, {"compile": "eager", "compile_after": 1}], ids=["numpy", "first-run"])
def test_peak_memory_estimate_covers_op_by_op_temporaries(options):
    """Op by op (and on a fusion's first run), numpy computes f16 in f32 copies: the estimate counts them."""
    exe = hloexec.load(F16_CHAIN.replace("64,1024", "256,1024"), **options)
    inputs = _inputs(exe)
    inputs_bytes = sum(a.nbytes for a in inputs)
    traced = _traced_run_peak(exe, inputs)
    assert traced <= exe.peak_bytes() - inputs_bytes <= 1.3 * traced


# jax's shape of a jitted helper: add -> call(relu) -> multiply; and a call the plan must keep (its callee
# has a side effect).
CALLS = """HloModule calls
relu { x = f32[512,256] parameter(0)
  z = f32[] constant(0)
  zb = f32[512,256] broadcast(z), dimensions={}
  ROOT m = f32[512,256] maximum(x, zb) }
effect { x = f32[512,256] parameter(0)
  ROOT c = f32[512,256] custom-call(x), custom_call_target="some_host_effect", custom_call_has_side_effect=true }
ENTRY main {
  p = f32[512,256] parameter(0)
  q = f32[512,256] parameter(1)
  a = f32[512,256] add(p, q)
  r = f32[512,256] call(a), to_apply=relu
  ROOT o = f32[512,256] multiply(r, q)
}
"""


def test_calls_are_inlined_so_fusion_sees_through_them():
    module = hloexec.parse(CALLS)[0]
    users_before = {i.name: len(i.users) for c in module.computations for i in c}
    exe = hloexec.Executable(module, compile="eager")
    (group,) = _groups(exe)
    assert {i.opcode for i in group.members} >= {"add", "maximum", "multiply"}
    assert len(exe.plan.steps) == 1 and exe.plan.steps[0].fused
    # the module itself is untouched: the call is still there, no instruction gained users
    assert [i.opcode for i in module.entry].count("call") == 1
    assert users_before == {i.name: len(i.users) for c in module.computations for i in c}
    inputs = _inputs(exe, seed=4)
    assert exe.run(*inputs).tobytes() == hloexec.load(CALLS, use_numba=False).run(*inputs).tobytes()


def test_calls_with_side_effects_stay_calls_and_errors_name_the_callee():
    from hloexec.errors import UnsupportedError
    from hloexec.exec.inline import inline_calls
    from hloexec.ir.dataflow import has_side_effect
    effect = hloexec.parse(CALLS.replace("to_apply=relu", "to_apply=effect"))[0]
    assert inline_calls(effect.entry, keep_call=has_side_effect) is effect.entry
    assert inline_calls(hloexec.parse(CALLS)[0].entry, keep_call=has_side_effect) is not None
    unknown = CALLS.replace("ROOT m = f32[512,256] maximum(x, zb)",
                            'ROOT m = f32[512,256] custom-call(x), custom_call_target="no_such_target"')
    with pytest.raises(UnsupportedError, match="of computation %relu"):     # inlined, still named
        hloexec.load(unknown)


# Adam's shape: the f16 gradient, converted once, feeds two updates (m and v) that are separate groups.
SHARED_CONVERT = """HloModule adam_like
ENTRY main {
  g16 = f16[256,512] parameter(0)
  m = f32[256,512] parameter(1)
  v = f32[256,512] parameter(2)
  g = f32[256,512] convert(g16)
  b = f32[] constant(0.9)
  bb = f32[256,512] broadcast(b), dimensions={}
  m1 = f32[256,512] multiply(m, bb)
  m2 = f32[256,512] add(m1, g)
  gg = f32[256,512] multiply(g, g)
  v1 = f32[256,512] multiply(v, bb)
  v2 = f32[256,512] add(v1, gg)
  ROOT t = (f32[256,512], f32[256,512]) tuple(m2, v2)
}
"""


def test_a_convert_read_by_two_groups_is_redone_in_each():
    exe = hloexec.load(SHARED_CONVERT, compile="eager")
    groups = _groups(exe)
    assert len(groups) == 2 and all("convert" in [i.opcode for i in g.computation.instructions] for g in groups)
    assert [s.inst.opcode for s in exe.plan.steps if not s.fused] == ["tuple"]     # no f32 copy of g stored
    inputs = _inputs(exe, seed=6)
    for got, want in zip(exe.run(*inputs), hloexec.load(SHARED_CONVERT, use_numba=False).run(*inputs)):
        assert got.tobytes() == want.tobytes()


# One Adam tensor: new m and v are outputs and are read by the parameter update.
ADAM_TENSOR = SHARED_CONVERT.replace("  ROOT t = (f32[256,512], f32[256,512]) tuple(m2, v2)", """  p = f32[256,512] parameter(3)
  r = f32[256,512] rsqrt(v2)
  u = f32[256,512] multiply(m2, r)
  p2 = f32[256,512] subtract(p, u)
  ROOT t = (f32[256,512], f32[256,512], f32[256,512]) tuple(p2, m2, v2)""")


def test_values_read_inside_and_returned_are_extra_outputs_of_one_group():
    exe = hloexec.load(ADAM_TENSOR, compile="eager")
    (group,) = _groups(exe)
    assert [o.name for o in group.outputs] == ["m2", "v2", "p2"]
    (step,) = [s for s in exe.plan.steps if s.fused]
    assert [exe.plan.order[s].name for s in step.extra_outputs] == ["m2", "v2"]
    assert [s.inst.opcode for s in exe.plan.steps if not s.fused] == ["tuple"]
    inputs = _inputs(exe, seed=7)
    for tiered in (exe, hloexec.load(ADAM_TENSOR)):         # compiled, and the op-by-op first run
        for got, want in zip(tiered.run(*inputs), hloexec.load(ADAM_TENSOR, use_numba=False).run(*inputs)):
            assert got.tobytes() == want.tobytes()
    # the plan's peak counts the inputs (f16 g; f32 m, v, p) and the three outputs, each once
    assert exe.plan.memory.peak_bytes(scratch=False) == 256 * 512 * (2 + 4 * 3 + 4 * 3)


# Pre-optimization Adam with a finiteness check (jnp.where(all_finite, new, old) for p, m and v): the new
# moments are read by the parameter update and by their own select, which come later, after a scalar
# the update needs (XLA schedules the bias correction's scalars late too).
ADAM_WHERE = SHARED_CONVERT.replace("HloModule adam_like\n", """HloModule adam_where
and { x = pred[] parameter(0)
  y = pred[] parameter(1)
  ROOT a = pred[] and(x, y) }
""").replace("  g = f32[256,512] convert(g16)\n", """  p = f32[256,512] parameter(3)
  lr = f32[] parameter(4)
  fin = pred[256,512] is-finite(g16)
  yes = pred[] constant(true)
  ok = pred[] reduce(fin, yes), dimensions={0,1}, to_apply=and
  g = f32[256,512] convert(g16)
""").replace("  ROOT t = (f32[256,512], f32[256,512]) tuple(m2, v2)", """  step = f32[] multiply(lr, b)
  sb = f32[256,512] broadcast(step), dimensions={}
  r = f32[256,512] rsqrt(v2)
  u = f32[256,512] multiply(m2, r)
  us = f32[256,512] multiply(u, sb)
  p2 = f32[256,512] subtract(p, us)
  okb = pred[256,512] broadcast(ok), dimensions={}
  p3 = f32[256,512] select(okb, p2, p)
  READ_M2
  m3 = f32[256,512] select(okb, m2, m)
  v3 = f32[256,512] select(okb, v2, v)
  ROOT t = (f32[256,512], f32[256,512], f32[256,512]OUT_TYPE) tuple(p3, m3, v3OUT)""")
# a column sum of m2 (op by op), for the second test below
COLUMN_SUM = """add { x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y) }
"""


def _assert_bits_of_op_by_op(text, seed):
    inputs = _inputs(hloexec.load(text, use_numba=False), seed=seed)
    for options in ({"compile": "eager"}, {}):         # compiled, and the op-by-op first run
        got = hloexec.load(text, **options).run(*inputs)
        for g, w in zip(got, hloexec.load(text, use_numba=False).run(*inputs)):
            assert g.tobytes() == w.tobytes()


def test_selects_of_updated_moments_join_the_update_as_outputs_of_one_group():
    text = ADAM_WHERE.replace("  READ_M2\n", "").replace("OUT_TYPE", "").replace("OUT", "")
    exe = hloexec.load(text, compile="eager")
    update = [g for g in _groups(exe) if g.root.shape.dims == (256, 512)]
    assert len(update) == 1, [g.root.name for g in update]
    # one kernel reads g, m, v, p once and writes the kept or new p, m, v; no broadcast or select op by op
    assert sorted(o.name for o in update[0].outputs) == ["m3", "p3", "v3"]
    assert not [s.inst.name for s in exe.plan.steps if not s.fused and s.inst.shape.dims == (256, 512)]
    _assert_bits_of_op_by_op(text, seed=8)


def test_a_group_is_not_absorbed_past_a_reader_of_its_value():
    """m2 is also read by a column sum (op by op) scheduled between the update and m's select: the update's
    group may not move m2's computation past it, so m's select stays out of the update's group."""
    text = (ADAM_WHERE.replace("adam_where\n", "adam_where\n" + COLUMN_SUM)
            .replace("READ_M2", "cs = f32[512] reduce(m2, z), dimensions={0}, to_apply=add")
            .replace("  fin =", "  z = f32[] constant(0)\n  fin =").replace("OUT_TYPE", ", f32[512]").replace("OUT", ", cs"))
    exe = hloexec.load(text, compile="eager")
    steps = {s.inst.name: s for s in exe.plan.steps}
    assert not steps["cs"].fused
    (update,) = [g for g in _groups(exe) if "p3" in [o.name for o in g.outputs]]
    assert "m2" in [o.name for o in update.outputs] and "m3" not in [m.name for m in update.members]
    _assert_bits_of_op_by_op(text, seed=9)


# The 16-device GPT seed's one-hot: a fusion compares an iota with the token ids over [4,1024,vocab] and
# keeps one partition's columns. Op by op it computes the whole one-hot (1.7 GB per participant there).
ONE_HOT_SLICE = """HloModule one_hot
fused_one_hot { ids = s32[4,1024] parameter(0)
  col = s32[] parameter(1)
  i = s32[4,1024,512] iota(), iota_dimension=2
  b = s32[4,1024,512] broadcast(ids), dimensions={0,1}
  eq = pred[4,1024,512] compare(i, b), direction=EQ
  h = f16[4,1024,512] convert(eq)
  flat = f16[4096,512] bitcast(h)
  zero = s32[] constant(0)
  ROOT s = f16[4096,64] dynamic-slice(flat, zero, col), dynamic_slice_sizes={4096,64} }
ENTRY main { ids = s32[4,1024] parameter(0)
  col = s32[] parameter(1)
  ROOT f = f16[4096,64] fusion(ids, col), kind=kLoop, calls=fused_one_hot }
"""


def test_a_fusion_whose_intermediates_dwarf_its_output_compiles_at_once(monkeypatch):
    """Whether a fusion's first call runs op by op weighs the values op by op would write, not only its
    output and operands (scaled down here: the real threshold is ~1 s of numpy)."""
    from hloexec.exec import tiering
    monkeypatch.setattr(tiering, "EAGER_COMPILE_WORK", 1 << 24)
    exe = hloexec.load(ONE_HOT_SLICE, compile="eager", compile_after=1)
    kernel = exe.plan.steps[0].kernel
    assert kernel.compiled is not None                          # compiled before its first call
    assert exe.peak_bytes() < 2 * 4096 * 64 * 2                 # no op-by-op one-hot in the estimate
    ids = np.random.default_rng(0).integers(0, 512, (4, 1024)).astype(np.int32)
    want = hloexec.load(ONE_HOT_SLICE, use_numba=False).run(ids, np.int32(128))
    assert want.any() and exe.run(ids, np.int32(128)).tobytes() == want.tobytes()
    same_output = F16_CHAIN.replace("64,1024", "4096,64")      # written = read: stays tiered
    assert hloexec.load(same_output, compile="eager", compile_after=1).plan.steps[0].kernel.compiled is None


def test_equal_fusions_weigh_their_work_together(monkeypatch):
    """Structurally equal fusions share one compiled kernel (Adam's update of each tensor), so the op-by-op
    work they would all do is what one compile saves: past the threshold together, all compile at once."""
    from hloexec.exec import tiering
    two = (f"HloModule two\nENTRY main {{\n{_f16_chain()}\n{_f16_chain('2', 2)}\n"
           "  ROOT t = (f16[64,1024], f16[64,1024]) tuple(back, back2)\n}\n")
    one_group_work = 3 * 64 * 1024 * 8 * 2          # (output + 2 operands) x 8 ops x 2 (f16)
    monkeypatch.setattr(tiering, "EAGER_COMPILE_WORK", one_group_work + 1)
    exe = hloexec.load(two, compile="eager", compile_after=1)
    kernels = [s.kernel for s in exe.plan.steps if s.fused]
    assert len(kernels) == 2
    assert all(getattr(k, "after", 0) == 0 for k in kernels)   # compiled (or set to compile) at the first call
    reference = hloexec.load(two, use_numba=False)
    inputs = _inputs(reference, seed=1)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(exe.run(*inputs), reference.run(*inputs)))
    monkeypatch.setattr(tiering, "EAGER_COMPILE_WORK", 2 * one_group_work + 1)
    assert all(isinstance(s.kernel, TieredKernel) and s.kernel.after == 1
               for s in hloexec.load(two, compile="eager", compile_after=1).plan.steps if s.fused)


# Row statistics in the shape of LayerNorm backward: d = x (op) broadcast(s) is read by four groups (two row
# reduces, a column reduce, the elementwise output); y by a row reduce and two column reduces.
_ROW_STATISTICS_OPS = {     # element type: (op combining x with the statistic, product op, reducer, its init)
    "f16": ("subtract", "multiply", "add", "0"), "bf16": ("subtract", "multiply", "add", "0"),
    "f32": ("subtract", "multiply", "add", "0"), "s32": ("subtract", "multiply", "add", "0"),
    "pred": ("xor", "and", "or", "false"),
}


def _row_statistics(et: str) -> str:
    comb, mul, red, init = _ROW_STATISTICS_OPS[et]
    a = f"{et}[64,256]"
    return f"""HloModule row_statistics
red {{ a = {et}[] parameter(0)
  b = {et}[] parameter(1)
  ROOT c = {et}[] {red}(a, b) }}
ENTRY e {{
  x = {a} parameter(0)
  y = {a} parameter(1)
  s = {et}[64] parameter(2)
  sb = {a} broadcast(s), dimensions={{0}}
  d = {a} {comb}(x, sb)
  z = {et}[] constant({init})
  dd = {a} {mul}(d, d)
  r1 = {et}[64] reduce(dd, z), dimensions={{1}}, to_apply=red
  dy = {a} {mul}(d, y)
  r2 = {et}[64] reduce(dy, z), dimensions={{1}}, to_apply=red
  dy2 = {a} {mul}(y, d)
  c1 = {et}[256] reduce(dy2, z), dimensions={{0}}, to_apply=red
  c2 = {et}[256] reduce(y, z), dimensions={{0}}, to_apply=red
  out = {a} {comb}(d, y)
  ROOT t = ({a}, {et}[64], {et}[64], {et}[256], {et}[256]) tuple(out, r1, r2, c1, c2)
}}
"""


@pytest.mark.parametrize("et", sorted(_ROW_STATISTICS_OPS))
def test_reductions_sharing_their_inputs_run_as_one_kernel_per_direction(et, monkeypatch):
    """`d`, cheap to redo from x and a row statistic, is redone in each of the four groups that read it instead
    of being stored; the two row reduces (both read x) are one kernel, and so are the two column reduces (both
    read y; the generator's column loop); every group compiles and gives the op-by-op tier's bits (float sums
    folded in order under reductions="per-step", the other reducers exact). Scaled down: the pass does this
    from STREAMED_BYTES on."""
    from hloexec.exec import fuse, tiering
    monkeypatch.setattr(tiering, "MIN_COMPILED_BYTES", 0)
    text = _row_statistics(et)
    cached = hloexec.load(text, compile="eager", reductions="per-step")      # all of it fits in cache
    assert "d" in [s.inst.name for s in cached.plan.steps]                   # stored: no new kernels
    monkeypatch.setattr(fuse, "STREAMED_BYTES", 0)
    exe = hloexec.load(text, compile="eager", reductions="per-step")
    outputs = sorted(sorted(o.name for o in g.outputs) for g in _groups(exe))
    assert outputs == [["c1", "c2"], ["out"], ["r1", "r2"]]
    assert all(g.kernel.compiled is not None for g in _groups(exe))
    assert "d" not in [s.inst.name for s in exe.plan.steps]         # never stored
    reference = hloexec.load(text, use_numba=False, reductions="per-step")
    inputs = _inputs(reference, seed=11)
    if et == "pred":        # rare true values in x and y, so that the or-reductions are not all true
        rare = np.random.default_rng(11).random((2, 64, 256)) < 0.005
        inputs = [rare[0], rare[1], inputs[2]]
    for got, want in zip(exe.run(*inputs), reference.run(*inputs)):
        assert got.tobytes() == want.tobytes()
        if et == "pred":
            assert want.any() and not want.all()        # the inputs exercise both outcomes


_CONVERTS = [("f16", "f32"), ("bf16", "f32"), ("f32", "f64"), ("s8", "s32"), ("pred", "s32")]


@pytest.mark.parametrize("src,dst", _CONVERTS, ids=[f"{s}-{d}" for s, d in _CONVERTS])
def test_a_reduce_of_a_convert_read_twice_compiles(src, dst, monkeypatch):
    """A convert read by a reduce and by another group is redone in each; the reduce and its copy of the
    convert are two passes op by op (convert, then reduce), so the group compiles, with the op-by-op bits."""
    from hloexec.exec import tiering
    monkeypatch.setattr(tiering, "MIN_COMPILED_BYTES", 0)
    text = f"""HloModule reduce_of_convert
add {{ a = {dst}[] parameter(0)
  b = {dst}[] parameter(1)
  ROOT c = {dst}[] add(a, b) }}
ENTRY e {{
  x = {src}[64,256] parameter(0)
  c = {dst}[64,256] convert(x)
  z = {dst}[] constant(0)
  r = {dst}[64] reduce(c, z), dimensions={{1}}, to_apply=add
  sq = {dst}[64,256] multiply(c, c)
  ROOT t = ({dst}[64], {dst}[64,256]) tuple(r, sq)
}}
"""
    exe = hloexec.load(text, compile="eager", reductions="per-step")
    groups = {g.root.name: g for g in _groups(exe)}
    assert set(groups) == {"r", "sq"} and all(g.kernel.compiled is not None for g in groups.values())
    assert [s.inst.name for s in exe.plan.steps if not s.fused] == ["t"]
    reference = hloexec.load(text, use_numba=False, reductions="per-step")
    inputs = _inputs(reference, seed=12)
    for got, want in zip(exe.run(*inputs), reference.run(*inputs)):
        assert got.tobytes() == want.tobytes()
