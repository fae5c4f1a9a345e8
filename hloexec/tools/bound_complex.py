"""The error bounds of elementwise ops with complex operands or results (tools/bounds.py): a complex value's bound
is a bound on the modulus of its error, |computed - exact| (a real array of its shape: what the verdict measures),
as a real value's is on |computed - exact|. Computed with numpy (complex programs are small; the real ops' compiled
passes read real floats only).

Propagation, per operand with an error e (a disk of radius e around its value), independent operands' added as a
root-sum-square (SIGMAS sigmas, as the real rules):
- add, subtract, negate, convert, real, imag, complex, abs: 1-Lipschitz in each place (|Re d| <= |d|;
  complex(re, im) moves by sqrt(e_re^2 + e_im^2), the root-sum-square itself, but by z's bound where re and im
  are +-Re z and +-Im z of one z: a conjugate, `_conjugated`);
- multiply: |b| e_a, |a| e_b, and e_a e_b where both have errors ((2 |a| + e) e for x * x);
- the others (divide, exp, sqrt, log, power...): the op's own kernel at the disk's edge in 8 directions, the largest
  move divided by cos(pi/8): to first order a move is L(d) with L real-linear, whose modulus over the circle is
  sqrt(A + B cos(2 (theta - theta0))), B <= A, so 8 directions 45 degrees apart reach at least
  sqrt((1 + cos 45deg) / 2) = cos(pi/8) of its largest (a holomorphic op's |f'| e in every direction); a branch
  cut crossed by the disk (sqrt, log on the negative reals) shows as a large move; two operands with errors also
  at the 4 x 4 corners of their disks' axis points beyond what each does alone (the real rule's corners).
  An operand's disk holding 0 where the op is singular there (a divisor, sqrt, log...) decides the element.

Own rounding, as a bound L on the modulus of the op's error, SIGMAS / sqrt(3) x L its SIGMAS sigmas (a uniform
error's, as the real rule counts a rounding), the bound after it at most the bound before plus L:
- add, subtract, convert: each part rounded once to the part's type (f32 for c64, f64 for c128), the real rule per
  part (half an ulp at it, none where the operands are exact and the part is of the type), their root-sum-square;
- multiply: |fl(a b) - a b| <= sqrt(5) u |a b| for XLA's (ar br - ai bi, ar bi + ai br) with or without a fused
  multiply-add (Brent, Percival, Zimmermann, "Error bounds on complex floating-point multiplication", Math.
  Comp. 76 (2007); with an FMA 2u, Jeannerod et al. 2017): a part's relative error can be any size (ar br - ai bi
  cancels), the modulus' cannot;
- divide: XLA's is Smith's algorithm (elemental_ir_emitter.cc EmitComplexDivide: r = d/c, den = c + d r, parts
  (a + b r) / den and (b - a r) / den for |d| <= |c|). To first order in u each part's error is at most
  3 u (|a| + |b r|) / den + 4 u |part| (r, b r, the sum; den's three roundings relative to den >= |c|, the
  division), and (|a| + |b r|)^2 + (|b| + |a r|)^2 <= 2 |a + ib|^2 (1 + r^2) with den = c (1 + r^2), so the
  modulus' error is at most (3 sqrt(2) + 4) u |x|;
- abs (a hypot, max sqrt(1 + (min / max)^2): five roundings, at most ~3.5 u of it): 4 u |x|;
- the transcendentals (exp, log, sqrt, tanh, power...: XLA builds them from its real ones, exp(a) (cos b, sin b)):
  each part within 2 TRANSCENDENTAL_ULPS + 1 ulps of the modulus, sqrt(2) times that; a log's real part
  log |z| also within them of 1 (near |z| = 1 its error is absolute).
Samples (tools/bounds.py `_sample`): each a complex deviation (complex64), so errors that cancel (z conj(z) less
|z|^2, a difference of near-equal dots) cancel in them as in real values. Ops linear in their operands (moves,
real, imag, complex, add, subtract, negate, convert, fft, sums, collectives) on the deviations alone; bilinear ones
(multiply, dot, convolution) as K(da, b) + K(a, db) + K(da, db) (exact: no perturbed run less the value); the others
(divide, abs, exp, sqrt, select...) the kernel on the perturbed operands less the value, in the shadow's types,
which resolves a c64 program's deviations (2^-24 of a value, in c128) but not a c128 program's (2^-53 of it: lost
to the difference's own rounding): there a smooth op's are a scaled difference (`scaled_samples`), a select's its
branches' deviations (`select_samples`, any type), the others' unknown (NaN: not calibrated, nor what is made from
them); a comparison's perturbed decisions are its kernel's on the perturbed operands (nothing subtracted). An
op's own error is drawn as two independent parts, each half its variance (`add_complex_noise`). A bound is
calibrated on the deviations' moduli, |d|^2 = Re^2 + Im^2 (bound_samples.calibrate)."""

from __future__ import annotations

import math

import numpy as np

from ..ir.dtypes import element_type
from ..kernels.bound_rules import add_noise, round_bounds
from .bound_elementwise import TRANSCENDENTAL_ULPS, rounding_rule
from .bound_samples import SAMPLES, SIGMAS
from .bound_store import float_leaf, leaves as _leaves

# ops 1-Lipschitz in each operand (the value moves by at most what an operand moves)
LIPSCHITZ = frozenset({"add", "subtract", "negate", "convert", "real", "imag", "complex", "abs"})
# ops that round each part once to the part's type (the real rule, per part)
COMPONENTWISE = frozenset({"add", "subtract", "convert"})
# ops with no rounding of their own on complex values
EXACT = frozenset({"negate", "real", "imag", "complex"})
# L / (u |x|) of the ops whose rounding is bounded on the modulus (the module docstring derives them)
NORMWISE = {"multiply": math.sqrt(5), "divide": 3 * math.sqrt(2) + 4, "abs": 4.0}
TRANSCENDENTAL_ROUNDING = math.sqrt(2) * (2 * TRANSCENDENTAL_ULPS + 1) * 2  # (an ulp: 2 u)
ABSOLUTE_AT_ONE = frozenset({"log", "log-plus-one"})  # their rounding is also an ulp of 1's
# ops linear in their operands, whose samples are the op on the deviations alone (beside tools/bounds.py's moves,
# sums and collectives)
COMPLEX_LINEAR = frozenset({"add", "subtract", "negate", "convert", "fft"})
# ops bilinear in their two operands (`bilinear_samples`)
BILINEAR = frozenset({"multiply", "dot", "convolution"})
# smooth elementwise ops (no step, no choice of operand) whose c128 samples are scaled differences (`scaled_samples`)
SMOOTH = frozenset(
    {"divide", "power", "atan2", "exponential", "exponential-minus-one", "log", "log-plus-one", "sqrt", "rsqrt",
     "cbrt", "tanh", "logistic", "sine", "cosine", "tan", "abs", "sign"}
)  # fmt: skip
RESOLVED_AT = 2.0**-26  # ... a deviation scaled up to this fraction of its operand's modulus (half f64's digits)
_DIRECTIONS = np.exp(2j * np.pi * np.arange(8) / 8)
_AXES = (1, -1, 1j, -1j)
# a complex type -> its parts' type
PART = {"c64": "f32", "c128": "f64"}


def involves_complex(value, operands) -> bool:
    """Whether an instruction's value or one of its operands is a complex array (or scalar)."""
    return any(float_leaf(v) and np.iscomplexobj(v) for v in (value, *operands))


def squared_magnitude(x) -> np.ndarray:
    """|x|^2 in float64 (a complex sum's terms' squares: its parts' squares added, as the real rules read them)."""
    return np.square(np.abs(x) if np.iscomplexobj(x) else x, dtype=np.float64)


def complex_elementwise(bounds, inst, orig, x, operands, singular: tuple = ()) -> np.ndarray:
    """Puts `x`'s bound (and rounding-decided marks) into `bounds` (an ErrorBounds), `inst` an elementwise op with
    a complex operand or result; returns its own rounding (SIGMAS sigmas) for the samples' draws. `singular`: the
    operand places where an interval holding 0 decides the element."""
    decided = np.zeros(np.shape(x), bool)
    groups: dict[int, list[int]] = {}  # one value passed twice (x * x) moves in both places at once
    for k, a in enumerate(operands):
        if float_leaf(a):
            groups.setdefault(id(a), []).append(k)
            marks = bounds._decided_or_none(a)
            if marks is not None:
                decided |= marks
    moved = []  # (places, value, bound, what it moves x by) of the operands with errors
    for places in groups.values():
        a = operands[places[0]]
        e = bounds._bound_or_none(a)
        if e is None or not np.any(e):
            continue
        e = np.broadcast_to(e, np.shape(a))
        delta = _moved_by(bounds, inst, x, operands, places, a, e)
        if set(places) & set(singular):
            decided |= (np.abs(a) <= e) & (e > 0)
        moved.append((places, a, e, np.where(np.isnan(delta), np.inf, delta)))
    if inst.opcode == "complex" and _conjugated(inst):  # (z's error rearranged: the parts' bounds are z's)
        variance = np.square(np.maximum(*(np.broadcast_to(bounds.of(o), np.shape(x)) for o in operands)))
    else:
        variance = sum((np.square(m[3]) for m in moved), np.zeros(np.shape(x)))
    if len(moved) == 2 and inst.opcode not in LIPSCHITZ:
        variance = variance + np.square(bounds._second_order(bounds._kernel(inst), x, operands, moved))
    before = np.sqrt(variance)
    largest = _own_rounding(inst.opcode, orig, x, variance)  # L: the rounding's largest error
    own = SIGMAS / math.sqrt(3) * largest
    bound = np.minimum(np.sqrt(variance + np.square(own)), before + largest)
    bounds._put(x, np.where(np.isnan(bound), np.inf, bound), decided)
    return own


def _conjugated(inst) -> bool:
    """Whether complex(re, im)'s operands are +-Re z and +-Im z of one z (jax's conj: complex(real(z),
    -imag(z))): its error is z's, its parts' rearranged, where the parts' root-sum-square would count it sqrt(2)
    times (at every conjugation: through a conjugate-gradient loop, 2^(n/2))."""

    def source(operand, part):
        while operand.opcode == "negate":
            operand = operand.operands[0]
        return operand.operands[0] if operand.opcode == part else None

    z = source(inst.operands[0], "real")
    return z is not None and z is source(inst.operands[1], "imag")


def _moved_by(bounds, inst, x, operands, places, a, e) -> np.ndarray:
    """How far `a`'s error (a disk of radius `e`, in all its `places`) moves x, to first order (the module
    docstring's rule per op)."""
    opcode = inst.opcode
    if opcode in LIPSCHITZ:
        return len(places) * e
    if opcode == "multiply":
        if len(places) == 2:
            return (2 * np.abs(a) + e) * e
        return np.abs(operands[1 - places[0]]) * e
    kernel = bounds._kernel(inst)
    worst = np.zeros(np.shape(x))
    for direction in _DIRECTIONS if np.iscomplexobj(a) else (1, -1):
        args = list(operands)
        for k in places:
            args[k] = a + e * direction
        worst = np.maximum(worst, np.abs(kernel(*args) - x))
    return worst / (math.cos(math.pi / 8) if np.iscomplexobj(a) else 1.0)


def corners(a) -> tuple:
    """Where an operand's error region's corners are (ErrorBounds._second_order): a real operand's interval ends,
    a complex one's disk's axis points."""
    return _AXES if np.iscomplexobj(a) else (1, -1)


def _own_rounding(opcode, orig, x, variance) -> np.ndarray:
    """L, the largest modulus of the op's own error (the module docstring's rule per op), at |x| plus the bound
    before it (`variance`: its square), as the real rule takes the ulp."""
    part = element_type(PART.get(orig.shape.element_type.name, orig.shape.element_type.name))
    if opcode in EXACT or part.kind != "float":
        return np.zeros(np.shape(x))
    if opcode in COMPONENTWISE:
        if not np.iscomplexobj(x):
            return _part_rounding(x, variance, opcode, part)
        return np.hypot(_part_rounding(x.real, variance, opcode, part), _part_rounding(x.imag, variance, opcode, part))
    u = float(np.finfo(part.numpy).eps) / 2
    magnitude = np.abs(x) + np.sqrt(variance)
    if opcode in NORMWISE:
        return NORMWISE[opcode] * u * magnitude
    return TRANSCENDENTAL_ROUNDING * u * (magnitude + (1.0 if opcode in ABSOLUTE_AT_ONE else 0.0))


def _part_rounding(part, variance, opcode, etype) -> np.ndarray:
    """One part's rounding to real type `etype` by the real rule (kernels/bound_rules.round_bounds: half an ulp at
    |part| plus the bound before it, none where that bound is 0 and the part is of the type): its largest error."""
    shape = np.shape(part)
    own = np.empty(shape)
    rule = rounding_rule(etype, opcode)
    assert rule is not None  # (a complex value's parts are f32 or f64)
    round_bounds(
        np.ravel(np.ascontiguousarray(part, np.float64)),
        np.ravel(np.broadcast_to(variance, shape)).astype(np.float64),
        np.empty(0),
        own.reshape(-1),
        np.empty(np.size(part)),
        *rule,
    )
    return own * (math.sqrt(3) / SIGMAS)  # (round_bounds' own error is SIGMAS sigmas of a uniform one)


def bilinear_samples(kernel, operands, perturbed, out) -> None:
    """The deviations of K(a, b), bilinear (multiply, dot, convolution), into `out` ((SAMPLES, *shape), complex64):
    K(da, b) + K(a, db) + K(da, db) per sample (`perturbed`: each operand's deviations, None where it has none;
    computed in the operands' type, the deviations exact to their own precision however small against the value)."""
    a, b = operands
    da, db = perturbed
    for k in range(SAMPLES):
        moved = 0
        if da is not None:
            moved = moved + kernel(np.asarray(da[k], a.dtype), b)
        if db is not None:
            moved = moved + kernel(a, np.asarray(db[k], b.dtype))
        if da is not None and db is not None:
            moved = moved + kernel(np.asarray(da[k], a.dtype), np.asarray(db[k], b.dtype))
        out[k] = moved


def resolves_deviations(orig) -> bool:
    """Whether a complex op's kernel on perturbed operands less its value (in the shadow's f64 parts) resolves the
    deviations of `orig` (the program's instruction): not where its value or an operand is of a 64-bit part type
    (c128, f64: its roundings' deviations, ~2^-53 of the value, are lost to the difference's own rounding)."""
    if orig is None:
        return False
    shapes = [leaf for _, leaf in orig.shape.leaves()] + [leaf for o in orig.operands for _, leaf in o.shape.leaves()]
    return all(s.element_type is None or s.element_type.name not in ("c128", "f64") for s in shapes)


def scaled_samples(inst, kernel, operands, perturbed, leaves, made) -> bool:
    """The samples of a smooth elementwise op (SMOOTH) of a c128 program, whose deviations (~2^-53 of a value) the
    shadow's f64 does not resolve as its kernel on perturbed operands less the value: per element, every operand's
    deviation scaled by one power of two s >= 1 (up to RESOLVED_AT of the operands' moduli), the kernel on the
    operands moved by those less the value, over s: the move f'(a) d to first order (the second-order part s |d|
    |f''| / 2 against |f'| |d|: 2^-27 relative where f'' / f' is of 1 / |a|; the difference's own rounding
    2^-53 |f| / s, 2^-27 of a deviation against a value of its operand's size), into `made` (one per leaf of the
    value). False (nothing done) for other ops or operands not of the value's shape."""
    shape = np.shape(leaves[0])
    if inst.opcode not in SMOOTH or not all(float_leaf(v) and np.shape(v) == shape for v in [*leaves, *operands]):
        return False
    for k in range(SAMPLES):
        reach = np.full(shape, np.inf)
        for o, p in zip(operands, perturbed):
            if p is not None:
                reach = np.fmin(reach, RESOLVED_AT * np.abs(o) / np.abs(p[k]).astype(np.float64))
        scale = np.exp2(np.floor(np.log2(np.clip(reach, 1.0, 2.0**60))))  # (NaN where a deviation is: unknown)
        moved = kernel(*(o if p is None else o + scale * p[k] for o, p in zip(operands, perturbed)))
        for leaf, value, out in zip(leaves, _leaves(moved), made):
            if out is not None:
                out[k] = (value - leaf) / scale
    return True


def select_samples(operands, perturbed, x, out) -> None:
    """A select's deviations (complex branches) into `out` ((SAMPLES, *shape), complex64): where a sample's decision
    is the run's, the chosen branch's own deviation (exact: no perturbed value less the value, in which a c128
    program's deviations would be lost); where it flips, the other branch's perturbed value less x (a jump)."""
    p, t, f = operands
    decided, dt, df = perturbed
    for k in range(SAMPLES):
        decision = p if decided is None else decided[k]
        moved_t, moved_f = (0 if d is None else np.asarray(d[k], np.complex128) for d in (dt, df))
        flipped = np.where(decision, t + moved_t, f + moved_f) - x
        out[k] = np.where(decision == p, np.where(p, moved_t, moved_f), flipped)


def add_complex_noise(out, key, own) -> None:
    """Each sample's own error into complex deviations `out` ((SAMPLES, *shape), complex64): `own` (SIGMAS sigmas of
    the error's modulus, E|d|^2 = (own / SIGMAS)^2) drawn as two independent normal parts of half that variance
    each (kernels/normal_draws' under `key`: the real and imaginary parts' draws are neighbouring elements)."""
    parts = np.zeros((SAMPLES, out[0].size, 2), np.float32)
    spread = np.repeat(np.ravel(own) / math.sqrt(2), 2)
    add_noise(parts.reshape(SAMPLES, -1), key, spread, SIGMAS)
    out += parts.view(np.complex64).reshape(out.shape)
