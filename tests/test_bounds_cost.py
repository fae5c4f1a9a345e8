"""What the per-element error bounds (tools/bounds.py) cost alongside the shadow run: a value's bound and its
samples go when the value goes, so a long chain of elementwise ops holds O(1) values' worth of them, not one per
instruction; bounds are stored in float32 where the program's type is no wider (half the memory of f64)."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import hloexec
from hloexec.options import device_profile
from hloexec.tools.numerics import shadow_run

N = 1 << 16  # elements of each value: 512 KB in the shadow's f64


def _chain(length: int) -> str:
    """An f32 module of `length` elementwise ops, each value used by the next one only."""
    lines = ["HloModule chain", "ENTRY e {", f"  v0 = f32[{N}] parameter(0)", f"  w = f32[{N}] parameter(1)"]
    ops = ("multiply", "add", "divide", "subtract")
    for k in range(1, length + 1):
        lines.append(f"  v{k} = f32[{N}] {ops[k % len(ops)]}(v{k - 1}, w)")
    lines[-1] = lines[-1].replace(f"  v{length} =", f"  ROOT v{length} =")
    return "\n".join(lines + ["}", ""])


def _peak(length: int) -> int:
    """Peak traced bytes of a shadow run with bounds over a chain of `length` ops."""
    r = np.random.default_rng(0)
    x, w = (r.uniform(1, 2, N).astype(np.float32) for _ in range(2))
    exe = hloexec.load(_chain(length))
    shadow_run(exe, [x, w], devices=[device_profile("reference")])  # kernels prepared
    tracemalloc.start()
    try:
        run = shadow_run(exe, [x, w], devices=[device_profile("reference")])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.all(np.isfinite(run.bounds["reference"].bounds[0]))
    return peak


def test_a_long_chain_of_elementwise_ops_holds_a_few_values_of_bounds():
    """The peak of a 48-op chain is about the 6-op chain's (each bound and sample freed at its value's last use), and a
    few values' worth either way: f64 value + bound + SAMPLES float32 samples, a handful of them at once."""
    value = N * 8
    short, long = _peak(6), _peak(48)
    # (kept per op, 42 more ops would hold ~70 values more: 13 bytes per element each; the runs' temporaries vary
    # by a few values, 2-6 seen)
    assert long < short + 8 * value, (short / value, long / value)
    assert long < 24 * value, long / value


def _stored_dtypes(etype: str) -> set:
    """The dtypes the bounds of a small `etype` chain's values are kept in (ErrorBounds' store, observed run)."""
    from hloexec.exec.shadow import shadow_module
    from hloexec.tools.bounds import ErrorBounds
    from hloexec.tools.numerics import Runner, executable_like

    text = _chain(3).replace("f32[", f"{etype}[")
    exe = hloexec.load(text)
    shadow = shadow_module(exe.module)
    shadow_exe = executable_like(exe, shadow.module, use_numba=False)
    bounds = ErrorBounds(shadow, shadow_exe.context, device_profile("reference"))
    kept = set()

    def observe(_device, inst, value, operands):
        bounds(inst, value, operands)
        entry = bounds._entry(value) if inst.opcode != "parameter" else None
        if entry is not None and entry[1] is not None:
            kept.add(entry[1].dtype)
            assert bounds.of(value).dtype == np.float64  # the rules read float64

    r = np.random.default_rng(1)
    inputs = [r.uniform(1, 2, N).astype(etype.replace("f", "float")) for _ in range(2)]
    Runner().run(shadow_exe, shadow.inputs(inputs), observe, observe_operands=True)
    return kept


def test_bounds_of_32_bit_values_are_kept_in_float32_and_of_f64_values_in_float64():
    assert _stored_dtypes("f32") == {np.dtype(np.float32)}
    assert _stored_dtypes("f64") == {np.dtype(np.float64)}


@pytest.mark.parametrize("dims", ["{1}", "{0,2}", "{}"])
def test_a_reduces_term_count_is_the_count_its_kernel_makes_of_ones(dims, monkeypatch):
    """A reduce's count of terms per element is its reduced dims' product (not its kernel run on ones, a pass over
    the operand): the same numbers, as the accumulation rule reads them."""
    from hloexec.exec.shadow import shadow_module
    from hloexec.tools.bounds import ErrorBounds
    from hloexec.tools.numerics import Runner, executable_like

    kept = [d for d in range(3) if str(d) not in dims]
    out = ",".join(str((4, 6, 5)[d]) for d in kept)
    text = f"""HloModule m
add {{ x = f32[] parameter(0)  y = f32[] parameter(1)  ROOT s = f32[] add(x, y) }}
ENTRY e {{
  a = f32[4,6,5] parameter(0)
  b = f32[4,6,5] multiply(a, a)
  z = f32[] constant(0)
  ROOT r = f32[{out}] reduce(b, z), dimensions={dims}, to_apply=add
}}
"""
    exe = hloexec.load(text)
    shadow = shadow_module(exe.module)
    shadow_exe = executable_like(exe, shadow.module, use_numba=False)
    bounds = ErrorBounds(shadow, shadow_exe.context, device_profile("reference"))
    counts = []
    from hloexec.tools import bound_sums

    accumulation = bound_sums.accumulation_variance
    monkeypatch.setattr(bound_sums, "accumulation_variance", lambda b, e, count, *a, **k: counts.append(count)
                        or accumulation(b, e, count, *a, **k))

    def observe(_device, inst, value, operands):
        bounds(inst, value, operands)
        if inst.opcode == "reduce":
            ones = bounds._kernel(inst)(np.ones_like(operands[0]), np.zeros_like(operands[1]))
            assert len(counts) == 1 and np.array_equal(np.broadcast_to(counts[0], np.shape(ones)), ones)

    inputs = [np.random.default_rng(3).uniform(1, 2, (4, 6, 5)).astype(np.float32)]
    Runner().run(shadow_exe, shadow.inputs(inputs), observe, observe_operands=True)
    assert len(counts) == 1
