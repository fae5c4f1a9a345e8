"""Sums' bounds (tools/bounds.py's rules for add-reductions, reduce-windows and add scatters): the terms' bounds,
the accumulation's rounding in the device's accumulation type and order (a probabilistic bound, SIGMAS sigmas of a
sequential sum's rounding error), its floor where the roundings repeat in a known order, and its may-be-non-finite
marks where partial sums may pass the type's range."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..ir.dtypes import element_type
from ..ir.opcodes import converted_reducer
from ..kernels.bound_products import window_products
from ..kernels.elementwise import accumulates_in_f32
from ..ops.indexing import scatter_targets
from ..ops.reduction import in_ynn_order, window_dims, window_terms
from .bound_complex import NORMWISE, PART, squared_magnitude
from .bound_dots import SIGNIFICAND, SMALLEST, widest
from .bound_generic import sum_terms
from .bound_overflow import EVERY, rounding_limit, sum_marks
from .bound_samples import SIGMAS
from .bound_shared import (
    any_order_rounding,
    repeated_rounding,
    scattered_rounding,
    tree_order_rounding,
    tree_order_steps,
)

# a reduce-window of fewer terms a window takes no floor: its row-major repeats stay within the accumulation's bound
# (the largest found over 3,000 adversarial term vectors a length, f16 and f32: 0.72 of it at 8 terms, 0.88 at 12,
# 1.06 at 16; bench/bench_window_repeats.py)
WINDOW_FLOOR_TERMS = 12
# a product reduce-window's terms gathered at most about this many at a time (_product_terms)
PRODUCT_CHUNK = 1 << 22


def unit_roundoff(etype) -> float:
    """2^-p for a float type of p significand bits (the implicit one counted): half its epsilon."""
    return float(ml_dtypes.finfo(etype.numpy).eps) / 2


def reduce_bounds(bounds, inst, orig, x, operands, per_step: bool = False) -> tuple:
    """An add, max or min reduce's or reduce-window's bound into `bounds` (tools/bounds.py's rules); returns
    _sample's (own error, ceiling, summed deviations, floor). `per_step`: its sums round every step in its type,
    in the HLO's order, whatever the device's reductions rule (a variadic reduce's part, InstructionPlans.parts)."""
    reducer = inst.called.get("to_apply")
    kind = reducer.root.opcode if reducer is not None else ""
    a, init = operands
    etype = orig.shape.element_type
    if kind == "convert" and (stepwise := rounded_steps(orig)) is not None:
        (kind, etype), per_step = stepwise, True  # (every step rounds to the narrow type, in the HLO's order)
    if kind in ("maximum", "minimum"):  # (a narrow type's round trip: exact on its values, which its operand holds)
        bounds._put(x, np.asarray(bounds._kernel(inst)(bounds.of(a), bounds.of(init)), np.float64), None)
        return None, None, None, None
    if kind == "multiply" and etype.kind in ("float", "complex"):
        return _product_bounds(bounds, inst, orig, x, a, init, per_step, etype), None, None, None
    if kind != "add":
        bounds.unbounded.setdefault(inst.name, f"{inst.opcode} with a {kind} reducer")
        bounds._put(x, np.full(x.shape, np.inf))
        return None, None, None, None
    kernel = bounds._kernel(inst)
    zero = np.zeros_like(init)
    variance, squares, linear, deviations = sum_terms(bounds, inst, a, init)
    count: np.ndarray | float  # (a reduce's: every element sums the same terms; a window's varies at its edges)
    if inst.opcode == "reduce":
        count = float(np.prod([a.shape[int(d)] for d in inst.attr("dimensions", ())]))
    else:
        count = np.asarray(np.real(kernel(np.ones_like(a), zero)), np.float64)
    # where the device says its compiler sums long 16-bit sums in a tree of windows (XLA:CPU), the partial sums
    # of that order
    steps = None
    window = bounds.device.tree_reduction_window
    tree = window and not per_step and inst.opcode == "reduce" and etype.bits < 32
    if tree and orig.operands[0].opcode != "reduce-window":
        steps = tree_order_steps(a, tuple(inst.attr("dimensions", ())), window)
    accumulation = accumulation_variance(bounds, etype, count, squares, x, per_step, steps)
    bound, own = bounds._round(orig, x, variance + accumulation, "reduce")
    bounds._put(x, bound)
    if etype.kind == "float" and etype.bits < 64:
        # (partial sums past the accumulation type's range in some order: gated by Cauchy-Schwarz on the rule's sums)
        wide = not per_step and accumulates_in_f32(bounds.device.reductions, "add", etype)
        limit = rounding_limit(np.float32 if wide else etype.numpy)[0]
        if np.any(np.sqrt(count * squares) + linear() + np.sqrt(accumulation) >= limit):
            bounds._mark(x, sum_marks(kernel, a, bounds.of(a), zero, limit))
    local = np.sqrt(accumulation + np.square(own))
    reductions = "per-step" if per_step else bounds.device.reductions
    floor = _repeated_rounding(bounds, inst, etype, a, init, x, steps, accumulation, reductions)
    return local, lambda: linear() + local, deviations, floor


def _product_bounds(bounds, inst, orig, x, a, init, per_step: bool, etype) -> np.ndarray:
    """A product reduce's or reduce-window's bound into `bounds`; returns its own error (SIGMAS sigmas). First
    order: each term's bound times the other terms' product (the init value's too), added (errors the terms share
    add up; the samples calibrate it down where they do not), and its roundings: one a step, of relative size u,
    independent (n steps: SIGMAS sigmas of their sum), in the device's accumulation type ("accumulate": 16-bit
    products in f32) unless `per_step`, then the final rounding; a step below the normals errs by half their
    spacing (flushed: by f32's smallest normal), whatever its size. A window's terms in its order (row-major), its
    padding the product's identity (no step). Complex terms: on the moduli (|d prod| <= sum_k |d_k| prod_j!=k
    |t_j| to first order), a step's rounding sqrt(5) u of the partial product (bound_complex.NORMWISE), a step
    below the normals errs in both parts. Marks every kind where a partial product's interval may pass the
    accumulation type's range in some order (the terms' magnitudes above 1 multiplied). `etype`: the type its
    steps round to (the result's, or a narrower one: `rounded_steps`)."""
    propagated, counts, later, reach = (np.empty(np.size(x)) for _ in range(4))
    init_value, init_bound = np.abs(init), bounds.of(init)
    for at, terms, errors, present in _product_terms(bounds, inst, a, np.shape(x)):
        spread, later[at], whole, most = window_products(terms, errors, present)
        propagated[at] = spread * init_value + init_bound * whole
        counts[at] = np.sum(present, -1)
        reach[at] = most * np.maximum(init_value + init_bound, 1.0)
    propagated, counts, later, reach = (np.reshape(v, np.shape(x)) for v in (propagated, counts, later, reach))
    complex_ = etype.kind == "complex"
    wide = not per_step and accumulates_in_f32(bounds.device.reductions, "multiply", etype)
    part = "f32" if wide else PART.get(etype.name, etype.name)
    u = unit_roundoff(element_type(part)) * (NORMWISE["multiply"] if complex_ else 1.0)
    steps = SIGMAS * u / np.sqrt(3) * np.sqrt(counts) * np.abs(x)
    # (a partial product below the normals rounds by half the subnormals' spacing, or is flushed, whatever its size)
    least = max(SMALLEST[part] / 2, 2.0**-126 if bounds.device.flush_subnormals else 0.0) * (1 + complex_)
    steps = steps + least * later  # (its own error: the samples draw it, so calibration keeps it)
    bound, own = bounds._round(orig, x, np.square(propagated) + np.square(steps), "reduce")
    bounds._put(x, bound)
    over = reach >= (rounding_limit(element_type(part).numpy)[0] if part != "f64" else np.inf)  # (f64: the shadow's)
    if over.any():
        bounds._mark(x, over * EVERY)
    return np.sqrt(np.square(steps) + np.square(own))


def rounded_steps(orig):
    """(op, narrow type) where `orig`'s reducer is `convert(convert(op(p0, p1)) to narrow)` back to its own type
    (ir/opcodes.converted_reducer: XLA:CPU's float normalization of a bf16 reduce-window, the op in f32, every step
    rounded to bf16); else None."""
    reducer = orig.called.get("to_apply")
    found = converted_reducer(reducer) if reducer is not None else None
    if found is None or len(found[1]) != 2:
        return None
    op, (down, back) = found
    narrow, wide = down.shape.element_type, back.shape.element_type
    if narrow.bits >= wide.bits or op.shape.element_type != wide:
        return None
    return op.opcode, narrow


def _product_terms(bounds, inst, a, shape):
    """A product reduce's or reduce-window's outputs' terms, in chunks: (the chunk's flat output positions, the
    terms' magnitudes, their bounds, 1 where a step multiplies a term (0: a window's padding, the product's
    identity)), each (outputs, terms), in the order they are multiplied. A window's terms are gathered
    PRODUCT_CHUNK at a time (a cumprod's windows overlap: n^2 terms in all)."""
    e = np.broadcast_to(np.asarray(bounds.of(a), np.float64), np.shape(a))
    if inst.opcode == "reduce":
        dims = [int(d) for d in inst.attr("dimensions", ())]
        order = [d for d in range(a.ndim) if d not in dims] + dims
        terms = np.abs(np.transpose(a, order)).reshape(int(np.prod(shape)), -1).astype(np.float64, copy=False)
        errors = np.ascontiguousarray(np.transpose(e, order)).reshape(terms.shape)
        yield slice(None), terms, errors, np.ones(terms.shape[-1])
        return
    window = window_terms(inst)
    views = window(np.asarray(a), 1.0), window(e, 0.0), window(np.ones(np.shape(a)), 0.0)
    size, n = int(np.prod(shape)), int(np.prod(views[0].shape[len(shape) :]))
    chunk = max(1, PRODUCT_CHUNK // max(n, 1))
    for start in range(0, size, chunk):
        stop = min(start + chunk, size)
        at = np.unravel_index(np.arange(start, stop), shape) if shape else ()
        t, err, present = (np.reshape(v[at], (stop - start, n)) for v in views)
        yield slice(start, stop), np.abs(t).astype(np.float64, copy=False), err, present


def _repeated_rounding(bounds, inst, etype, a, init, x, steps, accumulation, reductions) -> np.ndarray | None:
    """A reduce's or reduce-window's own error in its order (with_floor's `floor`). Where the order is the
    HLO's (per-step: row-major, every step rounded to the type), all of a reduce's. Else, and a window's
    (short sums: its repeats rarely reach the rule's bound), only where it exceeds the accumulation's own
    bound (elsewhere the rule allows it already: random residues leave the bound as it was), in XLA:CPU's
    known orders -- its compiler's tree of windows (`steps`), its loop emitter's row-major order (YNNPACK's f32
    row sums: none) -- or the largest over representative orders where the device's order is not known
    (reductions = "accumulate": f32 sums, 16-bit sums accumulated in f32; bound_shared.any_order_rounding).
    A window's terms: each window's, padding included (the add's identity, as the kernel pads); none for
    windows shorter than WINDOW_FLOOR_TERMS. `reductions`: the rule its order follows (the device's, or "per-step")."""
    if etype.kind != "float":
        return None
    dims, dtype = tuple(int(d) for d in inst.attr("dimensions", ())), etype.numpy
    windowed = inst.opcode == "reduce-window"
    if windowed:
        if np.prod([w.size for w in window_dims(inst, np.ndim(a))]) < WINDOW_FLOOR_TERMS:
            return None
        a = np.reshape(window_terms(inst)(np.asarray(a), 0.0), (*np.shape(x), -1))
        dims = (a.ndim - 1,)
    if reductions == "per-step" and not windowed:
        return repeated_rounding(a, dims, init, dtype, x)
    if steps is not None:
        floor = tree_order_rounding(a, dims, init, dtype, x, bounds.device.tree_reduction_window)
    elif not windowed and in_ynn_order(bounds.plans.original(inst), reductions, dims):
        return None  # (YNNPACK's f32 row sums: 16 lanes of short chains, tiles added compensated)
    elif reductions in ("xla-cpu", "per-step"):  # (its loop emitter's order; the HLO's)
        floor = repeated_rounding(a, dims, init, dtype, x)
    elif etype.bits <= 32:  # (f64: the shadow's own type, its sums as exact as the shadow's)
        return any_order_rounding(a, dims, init, dtype, np.float32, x, np.sqrt(accumulation))  # (f32: either way)
    else:
        return None
    floor = np.where(np.abs(floor) > np.sqrt(accumulation), floor, 0.0)
    return floor if np.any(floor) else None


def accumulation_variance(bounds, etype, count, squares, x, per_step: bool = False, steps=None) -> np.ndarray:
    """The variance (in SIGMAS sigmas squared) of a sum's rounding: `count` terms whose squares add to `squares`,
    summing to `x`, accumulated as the device's reductions rule says ("accumulate": 16-bit types in f32; the
    others, "per-step" and "xla-cpu", round every step to the type), or rounding every step (`per_step`).
    `steps`: sum_k s_k^2 over the partial sums s_k where the order is known; else estimated whatever the order
    as count (squares + x^2)."""
    u = (
        2.0 ** -SIGNIFICAND[widest(etype.name, "f32")]
        if not per_step and accumulates_in_f32(bounds.device.reductions, "add", etype) and etype.name in SIGNIFICAND
        else unit_roundoff(etype)
    )
    # (a complex sum's: |x|^2, its parts' roundings' root-sum-square)
    return np.square(SIGMAS * u / np.sqrt(3)) * (count * (squares + squared_magnitude(x)) if steps is None else steps)


def scatter_bounds(bounds, inst, orig, x, operands) -> tuple:
    """Scatter moves its operands' bounds; with an add combiner it also sums: as a reduction's, the updates
    landing on one element accumulate in the scatter's type (the HLO's meaning, every combiner step). Returns
    its own error (SIGMAS sigmas, None: none) and its floor (with_floor's: an add's updates to one element
    summed in the order of application -- XLA:CPU's loop, the HLO's -- or, where the device's order is not
    known (reductions = "accumulate": a GPU's atomics), the largest of representative orders'; kept where it
    exceeds the accumulation's bound: bound_shared.scattered_rounding)."""
    kernel = bounds._kernel(inst)
    target, indices, updates = operands
    bound = np.asarray(np.real(kernel(bounds.of(target), indices, bounds.of(updates))), np.float64)
    combiner = inst.called.get("to_apply")
    if combiner is not None and combiner.root.opcode == "add":
        zero = np.zeros_like(target)
        count = np.asarray(np.real(kernel(zero, indices, np.ones_like(updates))), np.float64)
        squares = np.real(kernel(squared_magnitude(target), indices, squared_magnitude(updates)))
        u = unit_roundoff(orig.shape.element_type)
        spread = SIGMAS * u / np.sqrt(3) * np.sqrt(count * (squares + squared_magnitude(x)))
        variance = np.square(bound) + np.square(spread)
        rounded, own = bounds._round(orig, x, variance, "scatter", at=bound)
        own = np.where(count > 0, own, 0.0)  # (no update lands there: nothing rounds)
        bounds._put(x, np.where(count > 0, rounded, np.sqrt(variance)))
        floor = None
        if orig.shape.element_type.kind == "float":
            positions, applied = scatter_targets(inst)(indices)
            floor = scattered_rounding(
                target,
                positions,
                np.ravel(updates)[applied],
                orig.shape.element_type.numpy,
                x,
                spread,
                known=bounds.device.reductions != "accumulate",
            )
        return np.sqrt(np.square(spread) + np.square(own)), floor
    bounds._put(x, bound)
    return None, None
