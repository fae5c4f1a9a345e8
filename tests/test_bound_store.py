"""What the error bounds keep per live value (tools/bound_store.py): moves keep views of their operand's bound,
marks and samples (the same elements the op's own kernel makes), exact widening converts share them, values moved
from exact operands keep nothing."""
from __future__ import annotations

import numpy as np
import pytest

import hloexec
from hloexec.exec.shadow import shadow_module
from hloexec.ir.dtypes import element_type
from hloexec.options import device_profile
from hloexec.tools.bound_store import moved_view, widens_exactly
from hloexec.tools.bounds import ErrorBounds
from hloexec.tools.numerics import Runner, executable_like

MOVES = {
    "broadcast": ("f32[3,5]", "f32[5,2,3] broadcast(p), dimensions={2,0}"),
    "broadcast-sorted": ("f32[5]", "f32[4,5,2] broadcast(p), dimensions={1}"),
    "transpose": ("f32[3,4,5]", "f32[5,3,4] transpose(p), dimensions={2,0,1}"),
    "slice": ("f32[7,9]", "f32[3,4] slice(p), slice={[1:7:2], [0:8:2]}"),
    "reshape": ("f32[6,4]", "f32[2,3,4] reshape(p)"),
    "copy": ("f32[6,4]", "f32[6,4] copy(p)"),
}


def _module(operand: str, op: str) -> str:
    return f"HloModule m\nENTRY e {{\n  p = {operand} parameter(0)\n  ROOT r = {op}\n}}\n"


@pytest.mark.parametrize("name", sorted(MOVES))
def test_a_moved_view_holds_the_elements_the_ops_kernel_moves_there(name):
    operand, op = MOVES[name]
    exe = hloexec.load(_module(operand, op))
    inst = exe.module.entry.root
    shape = tuple(inst.operands[0].shape.dims)
    r = np.random.default_rng(0)
    samples = r.standard_normal((4, *shape)).astype(np.float32)
    moved = moved_view(inst, samples, shape, (4,))
    expected = np.stack([np.asarray(exe.run(s)) for s in samples])
    assert moved.shape == expected.shape and np.array_equal(moved, expected)
    if name != "reshape":  # (a reshape of a contiguous array is a view too, but numpy decides)
        assert np.shares_memory(moved, samples)
    # a bound kept smaller than its value (broadcasting to it) moves as its broadcast would
    row = r.standard_normal(shape[-1:]).astype(np.float32)
    assert np.array_equal(moved_view(inst, row, shape), np.asarray(exe.run(np.broadcast_to(row, shape).copy())))


def test_widens_exactly_only_where_every_value_of_the_source_type_is_one_of_the_target():
    pairs = {("bf16", "f32"): True, ("f16", "f32"): True, ("f32", "f64"): True, ("f16", "f64"): True,
             ("f32", "bf16"): False, ("bf16", "f16"): False, ("f16", "bf16"): False, ("f64", "f32"): False,
             ("s32", "f32"): False}
    for (source, target), exact in pairs.items():
        assert widens_exactly(element_type(source), element_type(target)) is exact, (source, target)


CHAIN = """HloModule m
ENTRY e {
  a = bf16[8,16] parameter(0)
  b = bf16[8,16] parameter(1)
  c = f32[16] parameter(2)
  m = bf16[8,16] multiply(a, b)
  w = f32[8,16] convert(m)
  t = f32[16,8] transpose(w), dimensions={1,0}
  s = f32[4,8] slice(t), slice={[0:16:4], [0:8]}
  q = f32[128] reshape(w)
  g = f32[8,16] broadcast(c), dimensions={1}
  x = f32[8,16] add(w, g)
  ROOT out = (f32[4,8], f32[128], f32[8,16]) tuple(s, q, x)
}
"""


def test_moves_keep_views_converts_share_and_exact_values_keep_nothing():
    """Observed run of CHAIN: each move's bound is its kernel on its operand's bound (as before views), held as a
    view of the operand's arrays; the exact widening convert holds the multiply's samples themselves; the broadcast
    of a parameter keeps no entry."""
    exe = hloexec.load(CHAIN)
    shadow = shadow_module(exe.module)
    shadow_exe = executable_like(exe, shadow.module, use_numba=False)
    bounds = ErrorBounds(shadow, shadow_exe.context, device_profile("reference"))
    seen: dict = {}

    def observe(_device, inst, value, operands):
        bounds(inst, value, operands)
        if inst.opcode in ("multiply", "convert", "transpose", "slice", "reshape", "broadcast"):
            seen[inst.opcode] = (value, operands, bounds._entry(value), inst)

    r = np.random.default_rng(2)
    inputs = [r.uniform(-2, 2, (8, 16)).astype("bfloat16") for _ in range(2)] + [r.uniform(-1, 1, 16).astype(np.float32)]
    Runner().run(shadow_exe, shadow.inputs(inputs), observe, observe_operands=True)
    mul = seen["multiply"][2]
    assert mul[1] is not None and mul[3] is not None and np.any(mul[1] > 0)
    convert = seen["convert"][2]
    assert convert[3] is mul[3] and convert[2] is mul[2]  # (the same arrays; the bound calibrated again: no higher)
    assert np.all(convert[1] <= mul[1])
    for op in ("transpose", "slice", "reshape"):
        value, operands, entry, inst = seen[op]
        kernel = bounds._kernel(inst)
        assert np.array_equal(bounds.of(value), kernel(bounds.of(operands[0])))
        assert np.shares_memory(entry[1], mul[1]) and np.shares_memory(entry[3], mul[3])
    assert seen["broadcast"][2][1:] == (None, None, None)  # (known: exact)



@pytest.mark.parametrize("exact", ["t", "a"])
def test_a_tuple_holding_an_exact_value_keeps_its_other_leaves_samples(exact):
    """A transpose of a parameter is known (an entry with no bound), a parameter is not but is an input: a tuple of
    either and a computed value keeps the computed leaf's entry, not re-moved (which kept bounds only and dropped
    its samples: attention's bf16 bounds went 3x tighter, a false alarm)."""
    shape = "f32[16,8]" if exact == "t" else "f32[8,16]"
    text = f"""HloModule m
ENTRY e {{
  a = f32[8,16] parameter(0)
  b = f32[8,16] parameter(1)
  m = f32[8,16] multiply(a, b)
  t = f32[16,8] transpose(a), dimensions={{1,0}}
  ROOT out = (f32[8,16], {shape}) tuple(m, {exact})
}}
"""
    exe = hloexec.load(text)
    shadow = shadow_module(exe.module)
    shadow_exe = executable_like(exe, shadow.module, use_numba=False)
    bounds = ErrorBounds(shadow, shadow_exe.context, device_profile("reference"))
    kept = {}

    def observe(_device, inst, value, operands):
        bounds(inst, value, operands)
        if inst.opcode in ("multiply", "tuple"):
            leaf = value if inst.opcode == "multiply" else value[0]
            kept[inst.opcode] = bounds._entry(leaf)[3]

    r = np.random.default_rng(4)
    inputs = [r.uniform(1, 2, (8, 16)).astype(np.float32) for _ in range(2)]
    Runner().run(shadow_exe, shadow.inputs(inputs), observe, observe_operands=True)
    assert kept["multiply"] is not None and kept["tuple"] is kept["multiply"]
