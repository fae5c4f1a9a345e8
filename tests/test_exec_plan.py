"""Plans: parameter-independent values are computed by a computation's first run and reused after it; the
peak memory estimate follows buffers through the views that share them."""
from __future__ import annotations

import numpy as np

import hloexec
from hloexec.exec.plan import MAX_FOLDED_BYTES, MAX_KEPT_EXPANSION_BYTES

# XLA's loop-invariant benchmark (jax.b380442861) in small: each of N steps calls a computation whose
# sum(iota * iota) does not depend on its parameters.
LOOP = """HloModule loop
sum { a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT s = s32[] add(a, b) }
step_value { x = s32[] parameter(0)
  i = s32[4096] iota(), iota_dimension=0
  sq = s32[4096] multiply(i, i)
  z = s32[] constant(0)
  total = s32[] reduce(sq, z), dimensions={0}, to_apply=sum
  ROOT r = s32[] add(x, total) }
body { t = (s32[], s32[]) parameter(0)
  k = s32[] get-tuple-element(t), index=0
  acc = s32[] get-tuple-element(t), index=1
  one = s32[] constant(1)
  k1 = s32[] add(k, one)
  acc1 = s32[] call(acc), to_apply=step_value
  ROOT r = (s32[], s32[]) tuple(k1, acc1) }
cond { t = (s32[], s32[]) parameter(0)
  k = s32[] get-tuple-element(t), index=0
  n = s32[] constant(50)
  ROOT lt = pred[] compare(k, n), direction=LT }
ENTRY main { x = s32[] parameter(0)
  zero = s32[] constant(0)
  t = (s32[], s32[]) tuple(zero, x)
  w = (s32[], s32[]) while(t), condition=cond, body=body
  ROOT acc = s32[] get-tuple-element(w), index=1 }
"""


def _plan_of(exe, name):
    return next(p for p in exe.plans if p.computation.name == name)


def test_a_parameter_independent_value_is_computed_once():
    exe = hloexec.load(LOOP)
    step_value = _plan_of(exe, "body")               # the call of step_value is inlined there
    calls = []
    for step in step_value.steps:
        if step.inst.name == "total":
            kernel = step.kernel
            step.kernel = lambda *v, kernel=kernel: calls.append(1) or kernel(*v)
    x = np.int32(7)
    want = np.uint32((7 + 50 * int(np.sum(np.arange(4096, dtype=np.int64) ** 2))) % 2**32).view(np.int32)  # wraps
    assert exe.run(x) == want and exe.run(x) == want
    assert len(calls) == 1                          # the first call computed it; 99 more reused it
    folded = [step_value.order[s].name for s in step_value.folded]
    assert sorted(folded) == ["one", "total"]       # only what a parameter-dependent step reads is kept


def test_device_dependent_and_large_values_are_not_folded():
    text = f"""HloModule m
ENTRY e {{ p = f32[] parameter(0)
  r = u32[] replica-id()
  c = f32[] convert(r)
  z = f32[] constant(0)
  big = f32[{MAX_FOLDED_BYTES // 4 + 1}] broadcast(z), dimensions={{}}
  s = f32[] reduce(big, z), dimensions={{0}}, to_apply=add
  a = f32[] add(c, s)
  ROOT o = f32[] add(a, p) }}
add {{ x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y) }}"""
    exe = hloexec.load(text)
    names = {exe.plan.order[s].name for s in exe.plan.invariant_slots}
    assert names == {"z"}                           # not replica-id's, not the oversized broadcast's
    assert exe.run(np.float32(1)) == 1 and exe.run(np.float32(2)) == 2


def test_broadcasts_of_one_value_are_recomputed_not_kept():
    """A broadcast of a scalar holds one number: a fused computation run op by op keeps the constant, and warm
    runs make the broadcast again (kept, such broadcasts were 259 KB of a bf16 train step's 542 KB peak)."""
    text = """HloModule m
fused {
  p = f32[64,64] parameter(0)
  c = f32[] constant(0.5)
  half = f32[64,64] broadcast(c), dimensions={}
  ROOT m = f32[64,64] multiply(p, half)
}
ENTRY e {
  x = f32[64,64] parameter(0)
  ROOT f = f32[64,64] fusion(x), kind=kLoop, calls=fused
}"""
    exe = hloexec.load(text, use_numba=False)
    fused = _plan_of(exe, "fused")
    assert {fused.order[s].name for s in fused.folded} == {"c"}
    assert fused.memory.folded_bytes() == 4 and exe.peak_bytes() - exe.plan.memory.peak_bytes() == 4
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    for _ in range(3):                              # the checked first run, then the generated schedule
        np.testing.assert_array_equal(exe.run(x), x * np.float32(0.5))


def test_big_broadcasts_are_recomputed_not_kept():
    """A plan keeps its folded values as long as it lives: a big broadcast of a constant would hold its whole
    output (in the 16-device GPT seed, 435 of them held 2.3 GB), so warm runs recompute it, and keep only the
    small values derived from it."""
    n = MAX_KEPT_EXPANSION_BYTES // 4 + 1
    text = f"""HloModule m
add {{ x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y) }}
ENTRY e {{ p = f32[{n}] parameter(0)
  c = f32[] constant(0.5)
  half = f32[{n}] broadcast(c), dimensions={{}}
  z = f32[] constant(0)
  total = f32[] reduce(half, z), dimensions={{0}}, to_apply=add
  scaled = f32[{n}] multiply(p, half)
  t = f32[{n}] broadcast(total), dimensions={{}}
  ROOT o = f32[{n}] add(scaled, t) }}"""
    exe = hloexec.load(text, use_numba=False)
    kept = {exe.plan.order[s].name for s in exe.plan.folded}
    assert kept == {"c", "total"}                   # not `half`: a multiply reads it, so warm runs redo it
    assert exe.plan.memory.folded_bytes() == 8
    x = np.arange(n, dtype=np.float32)
    for _ in range(3):                              # the checked first run, then the generated schedule
        np.testing.assert_array_equal(exe.run(x), x * np.float32(0.5) + np.float32(0.5 * n))


def test_a_view_keeps_its_operands_buffer_live():
    """`r` reshapes `a` without a copy: `a`'s buffer lives as long as `r`, past `a`'s own last use."""
    text = """HloModule m
ENTRY e { p = f32[1024] parameter(0)
  a = f32[1024] exponential(p)
  r = f32[32,32] reshape(a)
  b = f32[1024] negate(p)
  c = f32[1024] add(b, b)
  rc = f32[32,32] reshape(c)
  ROOT o = f32[32,32] add(r, rc) }"""
    exe = hloexec.load(text, use_numba=False)
    assert exe.peak_bytes() == 4 * 4096             # p, a (held by r), b and c while c is computed


def test_tuple_elements_outlive_their_tuple():
    """The root returns get-tuple-elements of a while's result: those buffers are live to the end, and a
    layout-changing bitcast makes a new buffer (one more)."""
    text = """HloModule m
cond { t = (f32[256], s32[]) parameter(0)
  k = s32[] get-tuple-element(t), index=1
  n = s32[] constant(3)
  ROOT lt = pred[] compare(k, n), direction=LT }
body { t = (f32[256], s32[]) parameter(0)
  x = f32[256] get-tuple-element(t), index=0
  k = s32[] get-tuple-element(t), index=1
  one = s32[] constant(1)
  k1 = s32[] add(k, one)
  x1 = f32[256] add(x, x)
  ROOT r = (f32[256], s32[]) tuple(x1, k1) }
ENTRY e { p = f32[256] parameter(0)
  zero = s32[] constant(0)
  t = (f32[256], s32[]) tuple(p, zero)
  w = (f32[256], s32[]) while(t), condition=cond, body=body
  x = f32[256] get-tuple-element(w), index=0
  m = f32[16,16]{1,0} bitcast(x)
  mt = f32[16,16]{0,1} bitcast(m)
  ROOT o = (f32[256], f32[16,16]{0,1}) tuple(x, mt) }"""
    exe = hloexec.load(text, use_numba=False)
    inputs, loop_result, transposed = 1024, 1024 + 4, 1024
    assert exe.plan.memory.peak_bytes(scratch=False) == inputs + loop_result + transposed
    x = np.arange(256, dtype=np.float32)
    got_x, got_t = exe.run(x)
    np.testing.assert_array_equal(got_x, 8 * x)
    np.testing.assert_array_equal(got_t, (8 * x).reshape(16, 16).T)


# Two parameter updates, each a fused kernel writing root outputs (Adam's shape in small).
UPDATES = """HloModule updates
ENTRY e { p = f32[65536] parameter(0)
  g = f32[65536] parameter(1)
  q = f32[65536] parameter(2)
  h = f32[65536] parameter(3)
  k = f32[] constant(0.5)
  kb = f32[65536] broadcast(k), dimensions={}
  a = f32[65536] multiply(g, kb)
  p1 = f32[65536] subtract(p, a)
  b = f32[65536] multiply(h, kb)
  q1 = f32[65536] subtract(q, b)
  ROOT t = (f32[65536], f32[65536]) tuple(p1, q1) }"""


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_outputs_the_caller_dropped_are_recycled_by_the_next_run():
    """Fresh pages cost a third of a memory-bound kernel's time: a run writes into the buffers of the last
    run's outputs once nothing references them. Outputs the caller still holds are never reused."""
    exe = hloexec.load(UPDATES, compile="eager")
    assert sum(getattr(getattr(s.kernel, "kernel", s.kernel), "recycle", False) for s in exe.plan.steps) == 2     # set up by load
    assert exe.peak_bytes() == 6 * 65536 * 4        # 4 inputs, 2 outputs: recycling raised nothing
    inputs = exe.random_inputs(0)
    want = hloexec.load(UPDATES, use_numba=False).run(*inputs)
    kept = exe.run(*inputs)
    kept_copy = [a.copy() for a in kept]
    again = exe.run(*inputs)                        # `kept` is held: fresh buffers
    assert not any(np.shares_memory(a, b) for a in kept for b in again)
    addresses = [_address(a) for a in again]
    del again
    third = exe.run(*inputs)                        # `again` was dropped: its buffers come back
    assert [_address(a) for a in third] == addresses
    for got, ref, old in zip(third, want, kept_copy):
        np.testing.assert_array_equal(got, ref)
    for a, old in zip(kept, kept_copy):
        np.testing.assert_array_equal(a, old)       # what the caller held was never written
    view = third[0][:10]                            # a view of an output holds its buffer too
    del third
    fourth = exe.run(*inputs)
    assert not np.shares_memory(view, fourth[0])


def test_recycling_stays_off_where_it_would_raise_the_peak():
    """Held from the start of a run, the last run's outputs would coexist with the temporaries made before
    them (here as big as they are): the plan keeps allocating fresh buffers."""
    text = UPDATES.replace("""  a = f32[65536] multiply(g, kb)""", """  wide = f32[4,65536] broadcast(g), dimensions={1}
  big = f32[4,65536] sort(wide), dimensions={1}, to_apply=less
  s = f32[65536] reduce(big, k), dimensions={0}, to_apply=add
  a = f32[65536] multiply(s, kb)""") + """
add { x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y) }
less { x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT lt = pred[] compare(x, y), direction=LT }"""
    exe = hloexec.load(text, compile="eager")
    assert exe.plan.memory.recycle_outputs() == 0
    assert not any(getattr(getattr(s.kernel, "kernel", s.kernel), "recycle", False) for s in exe.plan.steps)


FUSED_LOOP = """HloModule observed
fused { a = f32[65536] parameter(0)
  b = f32[65536] multiply(a, a)
  ROOT c = f32[65536] add(b, a) }
body { t = (s32[], f32[65536]) parameter(0)
  k = s32[] get-tuple-element(t), index=0
  x = f32[65536] get-tuple-element(t), index=1
  one = s32[] constant(1)
  k1 = s32[] add(k, one)
  h = f32[] constant(0.5)
  hb = f32[65536] broadcast(h), dimensions={}
  x1 = f32[65536] multiply(x, hb)
  ROOT r = (s32[], f32[65536]) tuple(k1, x1) }
cond { t = (s32[], f32[65536]) parameter(0)
  k = s32[] get-tuple-element(t), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(k, n), direction=LT }
ENTRY main { p = f32[65536] parameter(0)
  f = f32[65536] fusion(p), kind=kLoop, calls=fused
  zero = s32[] constant(0)
  t = (s32[], f32[65536]) tuple(zero, f)
  w = (s32[], f32[65536]) while(t), condition=cond, body=body
  ROOT x = f32[65536] get-tuple-element(w), index=1 }
"""


def test_an_observed_run_sees_every_value_in_every_tier():
    """`observe` sees each instruction's value after it runs: inside fusions and loop bodies (each step), even
    where the module's fusions and loops are compiled; the outputs are the unobserved run's."""
    p = np.random.default_rng(0).standard_normal(65536).astype(np.float32)
    for options in ({"use_numba": False}, {"compile": "eager"}):
        exe = hloexec.load(FUSED_LOOP, **options)
        want = exe.run(p)
        seen = []
        got = exe.run(p, observe=lambda inst, value: seen.append((inst.name, value if isinstance(value, tuple) else value.copy())))
        assert got.tobytes() == want.tobytes()
        names = [name for name, _ in seen]
        assert names.count("x1") == 3 and names.count("b") == 1 and names[-1] == "x"
        values = dict(seen)
        assert np.array_equal(values["b"], p * p) and np.array_equal(values["c"], p * p + p)
        assert [v for n, v in seen if n == "k1"] == [1, 2, 3]
        assert exe.run(p).tobytes() == want.tobytes()       # and the next run is not observed


def test_an_observed_run_does_not_see_the_scalar_steps_of_reducers():
    """A reducer that is not one vectorizable op runs through its computation once per element: observers see the
    reduce, not the 3 x 4096 scalar steps."""
    text = """HloModule argmax
arg { a = f32[] parameter(0)
  i = s32[] parameter(1)
  b = f32[] parameter(2)
  j = s32[] parameter(3)
  gt = pred[] compare(a, b), direction=GE
  m = f32[] select(gt, a, b)
  k = s32[] select(gt, i, j)
  ROOT t = (f32[], s32[]) tuple(m, k) }
ENTRY e { x = f32[4096] parameter(0)
  ids = s32[4096] iota(), iota_dimension=0
  lo = f32[] constant(-inf)
  zero = s32[] constant(0)
  ROOT r = (f32[], s32[]) reduce(x, ids, lo, zero), dimensions={0}, to_apply=arg }
"""
    exe = hloexec.load(text)
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    seen = []
    best, where = exe.run(x, observe=lambda inst, value: seen.append(inst.name))
    assert seen == ["ids", "lo", "zero", "r"] and where == np.argmax(x) and best == x.max()


def test_an_observed_run_looks_only_inside_the_computations_it_is_told_to():
    """`observe_inside` picks the fused, loop and branch computations whose values are seen (run op by op);
    the others run as unobserved (compiled where they would be) and are seen as their instruction's value."""
    p = np.random.default_rng(1).standard_normal(65536).astype(np.float32)
    exe = hloexec.load(FUSED_LOOP, compile="eager")
    want = exe.run(p)
    seen = []
    got = exe.run(p, observe=lambda inst, value: seen.append(inst.name),
                  observe_inside=lambda comp: comp.name == "body")
    assert got.tobytes() == want.tobytes()
    assert "b" not in seen and "c" not in seen and seen.count("f") == 1       # the fusion: one value
    assert seen.count("x1") == 3 and "lt" not in seen                         # the body, not the condition
    operands = {}
    exe.run(p, observe=lambda inst, value, ops: operands.setdefault(inst.name, ops), observe_operands=True,
            observe_inside=lambda comp: False)
    assert np.array_equal(operands["f"][0], p) and set(operands) == {"f", "zero", "t", "w", "x"}


def test_an_observed_spmd_run_sees_each_participant_with_its_device_id():
    """run_spmd(observe=) observes every participant's values (device id first, with operands when asked)."""
    exe = hloexec.load("""HloModule ar, num_partitions=2
add { x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y) }
ENTRY e { p = f32[3] parameter(0)
  d = f32[3] multiply(p, p)
  ROOT r = f32[3] all-reduce(d), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add }
""")
    inputs = [[np.arange(3, dtype=np.float32) + d] for d in range(2)]
    seen = {}
    outputs = exe.run_spmd(inputs, report=lambda message: None, observe_operands=True,
                           observe=lambda d, inst, value, ops: seen.__setitem__((d, inst.name), (value.copy(), ops)))
    assert set(seen) == {(0, "d"), (1, "d"), (0, "r"), (1, "r")}
    for d in range(2):
        assert np.array_equal(seen[d, "d"][0], inputs[d][0] ** 2) and seen[d, "d"][1][0] is not None
        assert np.array_equal(seen[d, "r"][0], outputs[d])
