"""The error bounds of the unary elementwise ops ErrorBounds evaluates at their operand's interval ends (sqrt,
rsqrt, the transcendentals, floor...: tools/bounds.py `_moved_by`) in one compiled pass
(kernels/bound_generic.unary_pass): the op evaluated by the shadow's own kernel on the interval's ends and the
samples' perturbed operands at once, then the bound, the rounding, the samples' deviations with their own-error
draws and calibration's block statistics in one loop: the separate rules' formulas (`_elementwise`,
`_evaluated`, `_round`, `_sample`) in their order, the same noise windows, so the bounds and samples are theirs
(a sample's deviation of -0 may come out +0)."""

from __future__ import annotations

import numpy as np

from ..kernels.bound_generic import select_pass, unary_pass
from .bound_elementwise import _NO_DEVIATIONS, _NO_DRAWS, _flat, rounding_rule
from .bound_samples import CALIBRATION_BLOCK, SAMPLES, SIGMAS

_NO_BOUND = np.empty(0)
_NO_MARKS = np.empty(0, bool)
_NO_DECISIONS = np.empty((SAMPLES, 0), bool)
for _none in (_NO_BOUND, _NO_MARKS, _NO_DECISIONS):
    _none.flags.writeable = False


def _f64(v) -> bool:
    return isinstance(v, (np.ndarray, np.generic)) and v.dtype == np.float64


def unary_elementwise(bounds, inst, orig, x, operands, singular: bool, steps: bool, rounds: bool) -> bool:
    """`x`'s bound, rounding-decided marks and samples (calibrated) into `bounds` (an ErrorBounds) in one pass,
    where `inst` is a unary op on float64 (the shadow's values): `singular`, an operand's interval holding 0
    decides the element; `steps`, its ends giving different values do; `rounds`, the op rounds to its type.
    False (nothing done) otherwise."""
    if len(operands) != 1 or not _f64(x) or not _f64(operands[0]) or np.shape(operands[0]) != np.shape(x):
        return False
    bits = int(orig.attr("mantissa_bits")) if inst.opcode == "reduce-precision" else 0
    rule = rounding_rule(orig.shape.element_type, inst.opcode, bits)
    if rule is None:  # (not a float type: the separate rules')
        return False
    (a,) = operands
    shape = np.shape(x)
    e = bounds._stored_bound(a)
    moving = e is not None and bool(np.any(e))
    perturbed = bounds._samples_or_none(a)
    sampled = rounds or perturbed is not None
    samples = np.empty((SAMPLES, *shape) if sampled else (SAMPLES, 0), np.float32)
    bound = np.empty(shape, np.float32 if getattr(bounds.current, "narrow", False) else np.float64)
    decided = np.zeros(shape if moving and (singular or steps) else 0, bool)
    state, pool = bounds.rng.bit_generator.state, bounds.pool
    draws = bounds._window(SAMPLES * np.size(x)) if rounds else (_NO_DRAWS, 0)
    any_own, *stats = unary_pass(
        bounds._kernel(inst),
        (singular, steps, rounds),
        _flat(x),
        _flat(a),
        _flat(np.broadcast_to(e, shape)) if moving else _NO_BOUND,
        _NO_DEVIATIONS if perturbed is None else _flat(perturbed, SAMPLES),
        rule,
        (_flat(draws[0]), draws[1], float(SIGMAS)),
        bound.reshape(-1),
        samples.reshape(SAMPLES, -1),
        decided.reshape(-1),
        CALIBRATION_BLOCK,
    )
    if rounds and not any_own:  # (`_sample` draws a value's own errors only where it has some)
        bounds.rng.bit_generator.state, bounds.pool = state, pool
    marks = bounds._decided_or_none(a)  # the operand's marks carried
    marked = decided if marks is None else decided | marks if decided.size else np.array(marks, bool)
    if sampled:
        bound = bounds._calibrate(bound, samples, stats=stats)
    bounds._put(x, bound, marked if np.size(marked) else None, samples if sampled else None)
    return True


def fused_select(bounds, x, operands) -> bool:
    """A select's bound, rounding-decided marks and samples (calibrated) into `bounds` in one pass
    (kernels/bound_generic.select_pass: `_select`'s and `_sample`'s rules, the same bits), where its branches are
    float64 (the shadow's values) and its predicate a bool array of their shape; False (nothing done) otherwise."""
    p, t, f = operands
    shape = np.shape(x)
    if not (_f64(x) and _f64(t) and _f64(f) and isinstance(p, np.ndarray) and p.dtype == np.bool_):
        return False
    if not np.shape(p) == np.shape(t) == np.shape(f) == shape:
        return False
    bounds_of = [bounds._stored_bound(o) for o in (t, f)]
    marks = [bounds._decided_or_none(o) for o in (t, f, p)]
    perturbed = [bounds._samples_or_none(o) for o in operands]
    sampled = any(q is not None for q in perturbed)
    bound = np.empty(shape, np.float32 if getattr(bounds.current, "narrow", False) else np.float64)
    decided = np.empty(shape, bool)
    samples = np.empty((SAMPLES, *shape) if sampled else (SAMPLES, 0), np.float32)
    stats = select_pass(
        _flat(p),
        _flat(t),
        _flat(f),
        _flat(x),
        *(_NO_BOUND if e is None else _flat(np.broadcast_to(e, shape)) for e in bounds_of),
        tuple(_NO_MARKS if m is None else _flat(np.broadcast_to(m, shape)) for m in marks),
        _NO_DECISIONS if perturbed[0] is None else _flat(perturbed[0], SAMPLES),
        *(_NO_DEVIATIONS if q is None else _flat(q, SAMPLES) for q in perturbed[1:]),
        bound.reshape(-1),
        decided.reshape(-1),
        samples.reshape(SAMPLES, -1),
        CALIBRATION_BLOCK,
    )
    if sampled:
        bound = bounds._calibrate(bound, samples, stats=stats)
    bounds._put(x, bound, decided, samples if sampled else None)
    return True
