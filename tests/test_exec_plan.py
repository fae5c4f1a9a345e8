"""Plans: parameter-independent values are computed by a computation's first run and reused after it."""
from __future__ import annotations

import numpy as np

import hloexec
from hloexec.exec.plan import MAX_FOLDED_BYTES

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
    return next(p for p in exe.context.plans if p.computation.name == name)


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
