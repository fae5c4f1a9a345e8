"""A divide of divides as XLA's algebraic simplifier rewrites it (DeviceProfile.divide_of_divides: XLA:CPU's).

xla/hlo/transforms/simplifiers/algebraic_simplifier.cc, HandleDivide, with no fast-math condition:
(A / B) / (C / D) => (A * D) / (B * C), (A / B) / C => A / (B * C), A / (B / C) => (A * C) / B (tried in that order,
after the rules that make a divide by a constant, a broadcast, sqrt, rsqrt, pow or exp a multiply; their one-use
conditions are not read). Measured (jaxlib 0.10.2): every one fires for f16 and f32 (each product rounded to the
type; f32's flushed below its normals); not for bf16, which XLA:CPU converts to f32 around each op first.

The roundings are as many as the module's, so the bound of the module as written holds while the new products stay
normal. Where they do not (or a factor's interval holds 0, or an inner quotient XLA:CPU does not make is out of
the normals), the range decides: a product below the normals keeps only its absolute subnormal step (f16's
2^-25; none under FTZ: it may be 0), one past the type's largest value is infinite. There the quotient's bound is
widened to the rewritten form's interval (the products' magnitudes over their factors' intervals, each rounded,
then the quotient's rounding) and its samples moved as far (a later op's calibration keeps it), and its
may-be-non-finite marks get the kinds the rewritten form can make: x / 0 and inf / x infinities, 0 / 0 and
inf / inf NaN ((a/b) / (a/b), b tiny: the two products are the same rounding, 1 or NaN).

The factors A, B (and C, D) are the inner divides' operands: kept (`pending`) when an inner divide is observed
until its rewritten user is. One level: an inner divide XLA rewrote itself (((a/b)/c)/d is a / ((b*c)*d)) is read
as written (its quotient a factor).
"""

from __future__ import annotations

import numpy as np

from .bound_overflow import NAN, NEG_INF, POS_INF, range_marks, rounding_limit
from .bound_samples import SAMPLES

# divisors HandleDivide makes a multiply before it looks for a divide of divides: A / constant, A / broadcast(B)
# (on CPU), A / sqrt(B), A / rsqrt(B), A / pow(B, C), A / exp(B)
_MULTIPLIED = frozenset({"constant", "broadcast", "sqrt", "rsqrt", "power", "exponential"})
# per type: (unit roundoff, a product at or below it may be 0, half the subnormal spacing, the least positive value,
# the least normal); f32 under FTZ: below its normals a product is 0 or normal
_RANGE = {
    "f16": (2.0**-11, 2.0**-25, 2.0**-25, 2.0**-24, 2.0**-14),
    "f32": (2.0**-24, 2.0**-150, 2.0**-150, 2.0**-149, 2.0**-126),
}
_FLUSHED_F32 = (2.0**-24, 2.0**-126, 0.0, 2.0**-126, 2.0**-126)


def stays_divide(inst) -> bool:
    """Whether divide `inst` is still a divide when HandleDivide reaches its divide-of-divides rules."""
    return inst.opcode == "divide" and inst.operands[1].opcode not in _MULTIPLIED


def rewritten_factors(inst) -> tuple | None:
    """((numerator's factors), (denominator's)) of divide `inst` as rewritten, each factor (k, j): operand k's
    operand j (an inner divide's), (k, None): operand k itself; None where no rewrite applies."""
    if not stays_divide(inst) or inst.shape.element_type.name not in _RANGE:
        return None
    p, q = inst.operands
    if stays_divide(p) and stays_divide(q):
        return ((0, 0), (1, 1)), ((0, 1), (1, 0))
    if stays_divide(p):
        return ((0, 0),), ((0, 1), (1, None))
    if stays_divide(q):
        return ((0, None), (1, 1)), ((1, 0),)
    return None


def divide_of_divides(bounds, inst, x, operands) -> None:
    """Divide `inst` (value `x`) observed by `bounds` (an ErrorBounds on a device with divide_of_divides): its
    rewritten form's range where it is one (module docstring), then its operands kept where a user's rewrite
    reads them."""
    orig = bounds.plans.original(inst)
    if orig is None:
        return
    factors = rewritten_factors(orig)
    if factors is not None:
        inner = [bounds.pending.get(id(o)) for o in orig.operands]
        if all(held is not None for held, o in zip(inner, orig.operands) if stays_divide(o)):
            _widen(bounds, orig, x, operands, inner, factors)
        for o in orig.operands:
            if len({id(u) for u in o.users}) == 1:
                bounds.pending.pop(id(o), None)
    if any(_reads(u, orig) for u in orig.users):
        bounds.pending[id(orig)] = [(v, bounds.of(v)) for v in operands]


def _reads(user, inst) -> bool:
    """Whether `user`'s rewrite reads divide `inst`'s operands."""
    factors = rewritten_factors(user) if user.opcode == "divide" else None
    return factors is not None and any(user.operands[k] is inst and j is not None for side in factors for k, j in side)


def _product(bounds, orig, x, operands, inner, side) -> tuple:
    """(least magnitude, least nonzero magnitude, largest, may be 0, may be infinite, a factor's interval holding 0)
    of the product of `side`'s factors as the device rounds it, per element of `x`."""
    name = orig.shape.element_type.name
    unit, zero, step, least, normal = _FLUSHED_F32 if name == "f32" and bounds.device.flush_subnormals else _RANGE[name]
    lo, hi = np.ones(np.shape(x)), np.ones(np.shape(x))
    for k, j in side:
        v, e = (operands[k], bounds.of(operands[k])) if j is None else inner[k][j]
        v = np.abs(np.broadcast_to(v, np.shape(x)).astype(np.float64))
        e = np.where(np.isfinite(e), e, np.inf)
        lo, hi = lo * np.maximum(v - e, 0.0), hi * (v + e)
    holds_zero = lo == 0
    if len(side) == 1:
        return lo, lo, hi, holds_zero, np.zeros(np.shape(x), bool), holds_zero
    may_be_zero = lo <= zero
    nonzero = np.maximum(lo * (1 - unit) - step * (lo < normal), least)
    hi = hi * (1 + unit) + step * (hi < normal)
    limit = rounding_limit(orig.shape.element_type.numpy)[0]
    return np.where(may_be_zero, 0.0, nonzero), nonzero, hi, may_be_zero, hi >= limit, holds_zero


def _widen(bounds, orig, x, operands, inner, factors) -> None:
    """The quotient's bound widened and its marks added where the rewritten products may leave the normals."""
    name = orig.shape.element_type.name
    unit, _, _, _, normal = _RANGE[name]
    n_lo, _, n_hi, n_zero, n_inf, n_sign = _product(bounds, orig, x, operands, inner, factors[0])
    d_lo, d_nonzero, d_hi, d_zero, d_inf, d_sign = _product(bounds, orig, x, operands, inner, factors[1])
    products = [(lo, inf) for side, lo, inf in ((factors[0], n_lo, n_inf), (factors[1], d_lo, d_inf)) if len(side) > 1]
    where = n_sign | d_sign  # (a factor's interval holds 0: the module's divisor need not)
    for lo, inf in products:
        where |= (lo < normal) | inf
    limit = rounding_limit(orig.shape.element_type.numpy)[0]
    for o, v in zip(orig.operands, operands):  # (a quotient the device does not make, out of the normals: the
        if stays_divide(o):  # module's bound there is its own rounding's, not the rewritten form's)
            v = np.abs(np.broadcast_to(np.real(v), np.shape(x)))
            where |= (v < normal) | (v >= limit)
    if not where.any():
        return
    marks = bounds.marks_of(x)
    marks = np.zeros(np.shape(x), np.uint8) if marks is None else np.array(marks)
    if orig.operands[0] is orig.operands[1]:  # (the same product over itself: 1, or 0 / 0, inf / inf)
        bounds._mark(x, marks | ((n_zero | n_inf) & where) * NAN)
        return
    infinite = (d_zero & (n_hi > 0)) | n_inf
    undefined = (d_zero & n_zero) | (n_inf & d_inf)
    marks |= (infinite & where) * (POS_INF | NEG_INF) | (undefined & where) * NAN
    largest = float(np.finfo(orig.shape.element_type.numpy).max)
    r_lo = np.where(d_inf, 0.0, n_lo / d_hi)
    r_hi = np.minimum(n_hi, largest) / d_nonzero  # (its finite values: an infinite product or 0 divisor is a mark)
    r = np.abs(np.real(x)).astype(np.float64)
    flips = n_sign | d_sign  # (a factor's interval holds 0: the quotient's sign too)
    reach = np.where(flips, r + r_hi, np.maximum(r - r_lo, r_hi - r)) + unit * r_hi
    stored = bounds._stored_bound(x)
    bound = np.array(np.broadcast_to(bounds.of(x), np.shape(x)), np.float64)
    widened = where & (reach > bound)
    bound[widened] = reach[widened]
    keep = stored.dtype if stored is not None else np.float64
    bounds._put(x, bound.astype(keep), bounds._decided_or_none(x), _moved_samples(bounds, x, widened, reach))
    bounds._mark(x, marks | range_marks(x, np.where(where, bound, 0.0), orig.shape.element_type.numpy))
    bounds._keep_reach(x, None)


def _moved_samples(bounds, x, where, reach) -> np.ndarray:
    """`x`'s samples with its elements at `where` moved by +-`reach` (alternating by sample and element): a later
    op's calibration sees the rewritten form's reach there, not the module's few roundings."""
    samples = bounds._read_samples(bounds._stored_samples(x))
    samples = np.zeros((SAMPLES, *np.shape(x)), np.float32) if samples is None else np.array(samples, np.float32)
    signs = 1.0 - 2.0 * ((np.arange(SAMPLES)[:, None] + np.arange(np.size(x))) % 2)
    moved = signs * np.where(np.isfinite(reach), np.minimum(reach, 1e38), 0.0).reshape(-1)  # (in bf16's range)
    flat = samples.reshape(SAMPLES, -1)
    at = np.flatnonzero(where)
    flat[:, at] = moved[:, at]
    return samples
