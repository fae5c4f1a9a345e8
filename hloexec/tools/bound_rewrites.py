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

from .bound_overflow import DROPPED_NAN, NAN, NEG_INF, POS_INF, range_marks, rounding_limit
from .bound_elementwise import TRANSCENDENTAL_ULPS
from .bound_samples import SAMPLES
from .compare import ulp_at

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


def _alternating(reach, size: int) -> np.ndarray:
    """+-`reach` (flat), alternating by sample and element: [SAMPLES, size]; 0 where it is not finite, at most 1e38
    (in bf16's range)."""
    signs = 1.0 - 2.0 * ((np.arange(SAMPLES)[:, None] + np.arange(size)) % 2)
    return signs * np.where(np.isfinite(reach), np.minimum(reach, 1e38), 0.0).reshape(-1)


def _moved_samples(bounds, x, where, reach) -> np.ndarray:
    """`x`'s samples with its elements at `where` moved by +-`reach` (alternating by sample and element): a later
    op's calibration sees the rewritten form's reach there, not the module's few roundings."""
    samples = bounds._read_samples(bounds._stored_samples(x))
    samples = np.zeros((SAMPLES, *np.shape(x)), np.float32) if samples is None else np.array(samples, np.float32)
    moved = _alternating(reach, np.size(x))
    flat = samples.reshape(SAMPLES, -1)
    at = np.flatnonzero(where)
    flat[:, at] = moved[:, at]
    return samples


# -- the rules that round differently, not as often: the bound grows by the rewritten form's own errors ----------
# types whose rewrites are measured (bf16 is converted to f32 around each op first: its adds and exps are not
# rewritten, its pow(A, 3)'s products are f32's, exact, rounded to bf16 once; f64's shadow is no wider than it)
_NATIVE = ("f16", "f32")
_FLUSHED = ("f32", "bf16")  # types whose arithmetic flushes subnormals on a device that does (DeviceProfile)


def rewritten(bounds, inst, x, operands) -> None:
    """The rewrites the device's profile says its compiler makes, observed at `inst` (value `x`): none inside a
    fusion's computation (XLA's AlgebraicSimplifier runs on MakeNonfusionComputations; measured: XLA:CPU computes a
    fused (a/b)/(a/b) as written)."""
    device, op = bounds.device, inst.opcode
    orig = bounds.plans.original(inst)
    if orig is None or id(orig.computation) in bounds.plans.fused:
        return
    if op == "divide" and device.divide_of_divides:
        divide_of_divides(bounds, inst, x, operands)
    if not isinstance(x, np.ndarray):
        return
    native = orig.shape.element_type.name in _NATIVE
    with np.errstate(all="ignore"):
        if op in ("add", "subtract") and device.folded_constant_sums and native:
            _folded_constant_sum(bounds, orig, x)
        if op == "add" and device.factored_sums and native:  # (a sum of products: not one of constants)
            _factored_sum(bounds, orig, x)
        if op == "power" and device.log_of_powers and native:
            _power_operands(bounds, orig, operands)
        if op == "log" and device.log_of_powers and native and orig.operands[0].opcode == "power":
            _log_of_power(bounds, orig, x)
        if op == "power" and device.power_as_products:
            _power_as_products(bounds, orig, x, operands, native)
        elif op == "exponential" and device.exp_of_differences and native:
            _exp_operand(bounds, orig, operands[0])
        elif op == "divide" and device.exp_of_differences and native and orig.operands[1].opcode == "exponential":
            if orig.operands[0].opcode == "exponential":
                _exp_of_difference(bounds, orig, x, operands)
            else:
                _divide_by_exp(bounds, orig, x, operands)


def _constant_value(inst):
    """A constant's value (a broadcast scalar constant's: the scalar), None where `inst` is neither."""
    if inst.opcode == "broadcast" and inst.operands[0].opcode == "constant" and not inst.operands[0].shape.dims:
        return inst.operands[0].literal
    return inst.literal if inst.opcode == "constant" else None


def _constant_term(inst) -> tuple | None:
    """(its non-constant operand, (the constant it adds, its sign)) of an add or subtract XLA's HandleAdd /
    HandleSubtract canonicalize to A + C (Const + A => A + Const, a constant not a broadcast; A - Const =>
    A + (-Const)), or (None, C) of C - A (it stays a subtract); None where neither."""
    if inst.opcode not in ("add", "subtract"):
        return None
    p, q = inst.operands
    if inst.opcode == "add" and p.opcode == "constant" and q.opcode != "constant":
        p, q = q, p
    if p.opcode == "constant" or _constant_value(q) is None:
        return None if inst.opcode == "add" or _constant_value(p) is None else (None, p)
    return p, (q, -1 if inst.opcode == "subtract" else 1)


def _folded_constants(outer) -> tuple | None:
    """(C1, C2), each a constant's value with its sign, where XLA makes `outer` A + (C1 + C2) or (C1 + C2) - A,
    the constants' sum folded in the type: (A + C1) + C2, (C1 - A) + C2 (HandleAdd's reassociation, after the
    canonicalizations above: A - C1, Const + A...; C1 and C2 both constants or both broadcast scalar constants)."""
    term = _constant_term(outer)
    if term is None or term[0] is None:
        return None
    inner, (k2, sign2) = term
    term = _constant_term(inner)
    if term is None:
        return None
    k1, sign1 = (term[1], 1) if term[0] is None else term[1]
    if k1.opcode != k2.opcode:
        return None
    return sign1 * np.asarray(_constant_value(k1), np.float64), sign2 * np.asarray(_constant_value(k2), np.float64)


def _folded_constant_sum(bounds, add, x) -> None:
    """(A + C1) + C2 as A + fl(C1 + C2) (DeviceProfile.folded_constant_sums): the folded constant's rounding d
    shifts every element alike (its samples too: a sum of them keeps it), and the one add rounds A + C1 + C2 + d.
    One level: in ((A + C1) + C2) + C3 the folded fl(C1 + C2) is read as C1 + C2."""
    constants = _folded_constants(add)
    if constants is None:
        return
    dtype = add.shape.element_type.numpy
    c1, c2 = constants
    near = c1 + c2  # (exact but for f64's own rounding, which Knuth's two-sum recovers)
    left = near - (near - c2)
    lost = (c1 - left) + (c2 - (near - left))
    d = np.broadcast_to((near.astype(dtype).astype(np.float64) - near) - lost, np.shape(x))
    bound = np.broadcast_to(bounds.of(x), np.shape(x))
    reach = np.abs(np.real(x)) + bound + np.abs(d)
    _widen_by(bounds, add, x, np.abs(d) + 0.5 * ulp_at(reach, dtype), d, None)


def _common_power_of_two(add) -> float | None:
    """C where HandleAdd makes `add` of A * C and B * C (either order, each product's only user) (A + B) * C: C a
    scalar constant or a broadcast one, +-2^k."""
    p, q = add.operands
    if p.opcode != "multiply" or q.opcode != "multiply" or p is q:
        return None
    if any(len({id(u) for u in m.users}) != 1 for m in (p, q)):
        return None
    for c in p.operands[::-1]:  # (the matcher tries C on the right first)
        if any(o is c for o in q.operands):
            value = _constant_value(c)
            if value is None or np.size(value) != 1:
                return None
            mantissa = np.frexp(float(np.asarray(value, np.float64).reshape(-1)[0]))[0]
            return float(np.asarray(value, np.float64).reshape(-1)[0]) if abs(mantissa) == 0.5 else None
    return None


def _factored_sum(bounds, add, x) -> None:
    """A * C + B * C as (A + B) * C (DeviceProfile.factored_sums; C a power of 2): the same value while A + B, A * C
    and B * C stay in the type's range, but A + B = x / C may overflow where the products' sum does not (C < 1):
    an infinity of its sign where |x| + its bound, over |C|, may reach the type's overflow limit."""
    c = _common_power_of_two(add)
    if c is None:
        return
    r = np.real(x).astype(np.float64)
    reach = (np.abs(r) + np.broadcast_to(bounds.of(x), np.shape(x))) / abs(c)
    over = reach >= rounding_limit(add.shape.element_type.numpy)[0]
    if over.any():
        marks = (over & (r > 0)) * POS_INF | (over & (r < 0)) * NEG_INF
        _add_marks(bounds, x, marks)


def _power_as_products(bounds, power, x, operands, native: bool) -> None:
    """pow(A, 3) as A * (A * A) (DeviceProfile.power_as_products): two roundings where the module's pow has one, the
    inner one carried by |A|. pow(A, 2) (A * A) and pow(A, -1) (1 / A) round once, as pow, but 1 / A divides:
    where the device flushes f32 subnormals (bf16's too, computed in f32) an A it may read as 0 makes an infinity
    of its sign (a flushed zero keeps it)."""
    exponent = _constant_value(power.operands[1])
    if exponent is None:
        return
    a = np.broadcast_to(np.real(operands[0]), np.shape(x)).astype(np.float64)
    e = np.broadcast_to(bounds.of(operands[0]), np.shape(x))
    if native and np.all(exponent == 3):
        dtype = power.shape.element_type.numpy
        m = np.abs(a) + e
        _widen_by(bounds, power, x, 0.5 * ulp_at(m * m, dtype) * m + 0.5 * ulp_at(m * m * m, dtype), None, None)
    elif np.all(exponent == -1) and bounds.device.flush_subnormals and power.shape.element_type.name in _FLUSHED:
        flushed = np.abs(a) - e < float(np.finfo(np.float32).tiny)
        marks = (flushed & (a + e > 0)) * POS_INF | (flushed & (a - e < 0)) * NEG_INF
        _add_marks(bounds, x, marks)


def _exp_of_difference(bounds, divide, x, operands) -> None:
    """exp(A) / exp(B) as exp(A - B) (DeviceProfile.exp_of_differences; A and B kept when their exps were observed):
    D = A - B rounds, h = half its ulp (at |D| and its operands' bounds), and exp carries it as a relative error:
    e^D expm1(h) more, and |e^D - x| where the shadow's quotient is not e^D (its exps out of f64's normals: not
    judged where it is not finite; any value where it is NaN: DROPPED_NAN). An infinity where D may pass the log of
    the type's overflow limit."""
    held = [_taken(bounds, o) for o in divide.operands]
    if any(h is None for h in held) or divide.operands[0] is divide.operands[1]:
        return
    dtype = divide.shape.element_type.numpy
    (a, e_a), (b, e_b) = ((np.broadcast_to(np.real(v), np.shape(x)).astype(np.float64), e) for v, e in held)
    d = a - b
    reach = np.abs(d) + e_a + e_b
    h = 0.5 * ulp_at(reach, dtype)
    exact = np.exp(d)
    r = np.real(x).astype(np.float64)
    extra = np.abs(exact) * np.expm1(h) + np.where(np.isfinite(r), np.abs(exact - r), 0.0)
    extra = np.where(np.isfinite(exact), extra, 0.0)
    extra[~np.isfinite(r) & np.isfinite(exact)] = np.inf
    marks = (d + e_a + e_b + h >= np.log(rounding_limit(dtype)[0])) * POS_INF
    marks |= (np.isnan(r) & ~np.isnan(d)) * DROPPED_NAN  # (exps past f64's range: e^D is no NaN, any value goes)
    _widen_by(bounds, divide, x, extra, None, marks.astype(np.uint8))


def _taken(bounds, inst):
    """What `bounds` keeps of `inst` for its user's rewrite (None: nothing), let go where it has no other user."""
    held = bounds.pending.get(id(inst))
    if len({id(u) for u in inst.users}) == 1:
        bounds.pending.pop(id(inst), None)
    return held


def _exp_operand(bounds, exp, operand) -> None:
    """Keep exp's operand and its bound where a user divides by it or divides it by another exp."""
    if any(u.opcode == "divide" and u.operands[1].opcode == "exponential" for u in exp.users):
        bounds.pending[id(exp)] = (operand, np.broadcast_to(bounds.of(operand), np.shape(operand)))


def _divide_by_exp(bounds, divide, x, operands) -> None:
    """A / exp(B) as A * exp(-B) (HandleDivide, before the divide-of-divides rules; with exp_of_differences):
    exp(-B) is infinite where -B may pass the log of the type's overflow limit, though exp(B) is not 0 (f16:
    B < -11.1): an infinity of A's sign there, NaN where A may be 0."""
    held = _taken(bounds, divide.operands[1])
    if held is None:
        return
    b, e_b = (np.broadcast_to(np.real(v), np.shape(x)).astype(np.float64) for v in held)
    a = np.broadcast_to(np.real(operands[0]), np.shape(x)).astype(np.float64)
    e_a = np.broadcast_to(bounds.of(operands[0]), np.shape(x))
    over = e_b - b >= np.log(rounding_limit(divide.shape.element_type.numpy)[0])
    marks = (over & (a + e_a > 0)) * POS_INF | (over & (a - e_a < 0)) * NEG_INF | (over & (np.abs(a) <= e_a)) * NAN
    _add_marks(bounds, x, marks)


# exponents HandlePower rewrites first (pow(A, 0) => 1, A, A * A, A * (A * A), 1 / A): no power is left to a log
_REWRITTEN_EXPONENTS = (0.0, 1.0, 2.0, 3.0, -1.0)


def _power_operands(bounds, power, operands) -> None:
    """Keep pow's operands and their bounds where a log of it is computed as B * log(|A|)."""
    exponent = _constant_value(power.operands[1])
    if exponent is not None and np.size(exponent) == 1 and float(np.ravel(exponent)[0]) in _REWRITTEN_EXPONENTS:
        return
    if any(u.opcode == "log" for u in power.users):
        bounds.pending[id(power)] = [(v, np.broadcast_to(bounds.of(v), np.shape(v))) for v in operands]


def _log_of_power(bounds, log, x) -> None:
    """log(pow(A, B)) as B * log(|A|) (DeviceProfile.log_of_powers; A and B kept when pow was observed; 0 where B is
    0): log(|A|) carries A's bound as a relative one, rounds (half an ulp and XLA's approximation's
    TRANSCENDENTAL_ULPS f32 ulps) and is scaled by B, whose bound it scales; the product rounds. The bound grows by
    that and |Y - x| (Y = B log|A|) where the module's value is finite; any value goes where it is not and Y is
    (DROPPED_NAN: pow of a negative A is NaN, pow past f64's range makes the shadow's log infinite). Where A's
    interval reaches 0 (or f32's flushed subnormals) log(|A|) may be -inf: an infinity of -B's sign."""
    held = _taken(bounds, log.operands[0])
    if held is None:
        return
    dtype = log.shape.element_type.numpy
    (a, e_a), (b, e_b) = ((np.broadcast_to(np.real(v), np.shape(x)).astype(np.float64), e) for v, e in held)
    m = np.abs(a)
    floor = float(np.finfo(np.float32).tiny) if bounds.device.flush_subnormals and dtype == np.float32 else 0.0
    vanishes = m - e_a <= floor
    ell = np.log(m)
    e_ell = np.where(vanishes, np.inf, e_a / np.maximum(m - e_a, floor))
    e_ell = e_ell + 0.5 * ulp_at(np.abs(ell) + e_ell, dtype) + TRANSCENDENTAL_ULPS * ulp_at(ell, np.float32)
    y = np.where(b == 0, 0.0, b * ell)
    e_y = np.abs(b) * e_ell + (np.abs(ell) + e_ell) * e_b
    e_y = e_y + 0.5 * ulp_at(np.abs(y) + e_y, dtype)
    r = np.real(x).astype(np.float64)
    extra = np.where(np.isfinite(r), np.abs(y - r), np.inf) + e_y
    extra[~np.isfinite(y)] = np.inf
    marks = (vanishes & (b - e_b < 0)) * POS_INF | (vanishes & (b + e_b > 0)) * NEG_INF
    marks |= (~np.isfinite(r) & np.isfinite(y)) * DROPPED_NAN  # (Y is the device's answer, not the module's x)
    _widen_by(bounds, log, x, extra, None, marks.astype(np.uint8))


def _widen_by(bounds, orig, x, extra, shift, marks) -> None:
    """`x`'s bound grown by `extra`, its samples by `shift` (an error every sample shares) or, where None, by
    +-`extra` (alternating by sample and element, as _moved_samples); its may-be-non-finite marks `marks` (None:
    none) and where the interval now reaches an infinity."""
    extra = np.where(np.isfinite(extra), extra, np.inf)
    stored = bounds._stored_bound(x)
    bound = np.broadcast_to(bounds.of(x), np.shape(x)) + extra
    keep = stored.dtype if stored is not None else np.float64
    samples = bounds._read_samples(bounds._stored_samples(x))
    samples = np.zeros((SAMPLES, *np.shape(x)), np.float32) if samples is None else np.array(samples, np.float32)
    if shift is None:
        shift = _alternating(extra, np.size(x)).reshape(samples.shape)
    samples += np.where(np.isfinite(shift), np.clip(shift, -1e38, 1e38), 0.0).astype(np.float32)
    bounds._put(x, bound.astype(keep), bounds._decided_or_none(x), samples)
    _add_marks(bounds, x, range_marks(x, bound, orig.shape.element_type.numpy) | (0 if marks is None else marks))


def _add_marks(bounds, x, marks) -> None:
    """`x`'s may-be-non-finite marks with `marks` (bound_overflow's bits) added."""
    kept = bounds.marks_of(x)
    marks = np.asarray(marks, np.uint8)
    bounds._mark(x, marks if kept is None else marks | kept)
