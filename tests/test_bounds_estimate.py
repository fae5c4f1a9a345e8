"""The memory estimate of the error bounds (tools/shadow_runs.py bounds_memory), against what a shadow run with
its bounds takes beyond the same run without them (tracemalloc): never less, and not far more. The estimate
decides which shadow runs (f64, 16-bit floats in f32, in turns) and refuses one that cannot fit before it
starts; an underestimate lets a run be killed halfway, an overestimate refuses runs that fit."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import hloexec
from hloexec.exec.shadow import shadow_module
from hloexec.options import device_profile
from hloexec.tools.shadow_runs import Runner, executable_like, run_memory, shadow_run

M = 1 << 18  # elements of each value: 2 MB in the shadow's f64
LIVE = 16  # values alive at once (the outputs)


def _module(dtype: str) -> str:
    """LIVE elementwise values of type `dtype`, each made from the one before, all outputs (alive to the end)."""
    ops = ("multiply", "add", "divide", "subtract")
    lines = ["HloModule live", "ENTRY e {", f"  v0 = {dtype}[{M}] parameter(0)", f"  w = {dtype}[{M}] parameter(1)"]
    lines += [f"  v{k} = {dtype}[{M}] {ops[k % len(ops)]}(v{k - 1}, w)" for k in range(1, LIVE + 1)]
    values = ", ".join(f"v{k}" for k in range(1, LIVE + 1))
    lines.append(f"  ROOT t = ({', '.join([f'{dtype}[{M}]'] * LIVE)}) tuple({values})")
    return "\n".join(lines + ["}", ""])


def _traced_peak(run) -> int:
    run()  # (kernels prepared: not what a run holds)
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(("dtype", "half_in_f32"), [("f16", False), ("f16", True), ("f32", False), ("f64", False)])
def test_the_bounds_estimate_covers_what_the_bounds_take_and_not_much_more(dtype, half_in_f32):
    """Per element of an f64 value a float64 bound, of a narrower one a float32 bound, four bfloat16 deviations
    each and the outputs' bounds as the run returns them: within the estimate, which is not
    above 1.6x what the bounds took. What they take is a difference of two runs' peaks, and the program's
    executable recycles its outputs from its last run: by the runs before, f16 1.27-1.37x, f32 1.26-1.50x (f16
    with 16-bit floats in f32 1.27x); f64 1.29-2.0x (the bounds' peak less by its outputs' 32 MB), so not
    checked above."""
    exe = hloexec.load(_module(dtype), compile="eager")  # (both runs in one tier, whatever the load)
    r = np.random.default_rng(0)
    numpy_type = {"f16": np.float16, "f32": np.float32, "f64": np.float64}[dtype]
    inputs = [r.uniform(1, 2, M).astype(numpy_type) for _ in range(2)]
    profile = device_profile("reference")
    shadow = shadow_module(exe.module, half_in_f32=half_in_f32)
    estimate = run_memory(executable_like(exe, shadow.module, use_numba=False), inputs, Runner(), shadow, 1)
    alone = _traced_peak(lambda: shadow_run(exe, inputs, shadow=shadow))
    with_bounds = _traced_peak(lambda: shadow_run(exe, inputs, shadow=shadow, devices=[profile]))
    taken = with_bounds - alone
    assert taken <= estimate["bounds"], (taken, estimate["bounds"])
    if dtype != "f64":
        assert estimate["bounds"] <= 1.6 * taken, (taken, estimate["bounds"])
