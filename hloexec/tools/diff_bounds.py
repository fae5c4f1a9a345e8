"""`diff --reference shadow`: each divergence judged by the two sides' error bounds.

Two versions of a program that compute the same function differ by rounding where a pass changed how they round
(a sum reordered, a bf16 add computed in f32): each value is within its error bound of the exact answer
(tools/bounds.py), so the two are within the sum of their allowances (the verdict's `allowed_error`) of each
other. A divergence past that -- a changed constant, a wrong operand -- is more than the arithmetic allows.

Each side runs twice more, op by op: the module at its precision (the values the divergences pair) and its shadow
with the bounds observed (the exact values, each value's bound under the side's device profile). Only the
divergences' values are kept. Rounding-decided elements and elements without a bound are not judged.
"""

from __future__ import annotations

import numpy as np

from .match import instruction_key


def judge_by_bounds(report, executables, inputs) -> None:
    """Sets `bound_ratio` (the largest |a - b| over what both sides' bounds allow together; None where nothing is
    judged) and `beyond_bound` (ratio > 1) on every first divergence and first change of `report`.
    `executables`: A's and B's (their options: the device profile and reductions their bounds follow); `inputs`:
    A's and B's input lists."""
    divergences = [*report.first_divergence, *report.first_change]
    if not divergences:
        return
    wanted: list[dict] = [{}, {}]
    for d in divergences:
        wanted[0][instruction_key(d.a.inst)] = d.occurrence
        wanted[1][instruction_key(d.b.inst)] = d.occurrence
    sides = [_values_and_bounds(exe, args, want) for exe, args, want in zip(executables, inputs, wanted)]
    for d in divergences:
        a = sides[0].get((instruction_key(d.a.inst), d.occurrence))
        b = sides[1].get((instruction_key(d.b.inst), d.occurrence))
        if a is not None and b is not None:
            d.bound_ratio = _ratio(a, b)
            d.beyond_bound = None if d.bound_ratio is None else d.bound_ratio > 1


def _ratio(a: tuple, b: tuple) -> float | None:
    """max |a - b| / (A's allowance + B's), over the elements both judge; None where none is."""
    from .verdict import RULE, allowed_error

    (value_a, exact_a, bound_a, decided_a), (value_b, exact_b, bound_b, decided_b) = a, b
    if value_a.size != value_b.size:
        return None
    shape = value_a.shape
    value_b, exact_b, bound_b, decided_b = (np.reshape(x, shape) for x in (value_b, exact_b, bound_b, decided_b))
    allowed = allowed_error(bound_a, np.abs(exact_a), value_a.dtype, RULE) + allowed_error(
        bound_b, np.abs(exact_b), value_b.dtype, RULE
    )
    with np.errstate(all="ignore"):
        difference = np.abs(value_a.astype(np.float64) - value_b.astype(np.float64))
        judged = ~decided_a & ~decided_b & np.isfinite(allowed) & np.isfinite(difference)
        if not judged.any():
            return None
        ratio = np.where(difference == 0, 0.0, difference / allowed)
    return float(np.max(ratio[judged]))


def _values_and_bounds(exe, inputs, wanted: dict) -> dict:
    """(instruction key, occurrence) -> (its value at the program's precision, its exact value, its bound, its
    rounding-decided elements), for the `wanted` instructions (key -> occurrence) with a float value."""
    from ..exec.shadow import shadow_module
    from .bounds import ErrorBounds, _float, _leaves
    from .shadow_runs import Runner, executable_like, run_profile

    def watcher(keep):
        seen: dict = {}

        def observe(_device, inst, value, operands=None):
            key = instruction_key(inst)
            if key not in wanted:
                return
            k = seen[key] = seen.get(key, -1) + 1
            leaf = next((v for v in _leaves(value) if _float(v)), None)
            if k == wanted[key] and leaf is not None:
                keep((key, k), leaf, inst, value, operands)

        return observe

    values: dict = {}
    Runner().run(
        executable_like(exe, exe.module, use_numba=False),
        inputs,
        watcher(lambda at, leaf, *_: values.__setitem__(at, np.array(leaf))),
    )
    shadow = shadow_module(exe.module)
    shadow_exe = executable_like(exe, shadow.module, use_numba=False)
    bounds = ErrorBounds(shadow, shadow_exe.context, run_profile(exe))
    found: dict = {}

    def keep(at, leaf, *_):
        if at in values:
            found[at] = (values[at], np.array(leaf, np.float64), np.array(bounds.of(leaf)), bounds.decided_of(leaf))

    record = watcher(keep)

    def observe(device, inst, value, operands=None):
        bounds(inst, value, operands)
        record(device, inst, value, operands)

    Runner().run(shadow_exe, shadow.inputs(inputs), observe, observe_operands=True)
    return found
