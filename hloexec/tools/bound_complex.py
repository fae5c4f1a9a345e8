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
Samples: none (NaN: a complex value's deviations are not kept), so a complex value's bound, and everything made
from it, is not calibrated: the rules' bounds stand as they are (sound, and looser where errors cancel)."""

from __future__ import annotations

import math

import numpy as np

from ..ir.dtypes import element_type
from ..kernels.bound_rules import round_bounds
from .bound_elementwise import TRANSCENDENTAL_ULPS, rounding_rule
from .bound_samples import SIGMAS
from .bound_store import float_leaf

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
_DIRECTIONS = np.exp(2j * np.pi * np.arange(8) / 8)
_AXES = (1, -1, 1j, -1j)
_PART = {"c64": "f32", "c128": "f64"}


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
    part = element_type(_PART.get(orig.shape.element_type.name, orig.shape.element_type.name))
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
