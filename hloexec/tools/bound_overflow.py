"""May-be-non-finite marks of the error bounds (tools/bounds.py): where an order or a rounding the device's arithmetic
allows can make an element +inf, -inf or NaN although its exact value is finite (an f16 sum of near-overflow terms
whose windows reach +inf and -inf in XLA:CPU's order: NaN; index order's is +inf). A bit per kind (POS_INF,
NEG_INF, NAN) per element, kept beside the bounds (BoundStore.overflows: nothing in ordinary programs); the verdict
accepts a non-finite element of the kind its mark allows, and only there.

Where marks start:
- a sum (add reduce, reduce-window) whose partial sums may pass the largest finite value of the accumulation's type
  in some order: its terms' intervals' positive parts summed (the most any partial sum can reach) beyond it: +inf;
  the negative parts': -inf; both: NaN too (+inf + -inf). Checked where sqrt(n sum x^2) + sum e (Cauchy-Schwarz,
  from the rule's own sums) reaches it;
- a dot whose |A| |B| (the intervals' magnitudes) reaches past its accumulation type's largest value: every kind
  (its products' signs mixed); checked where K max|A| max|B| does;
- a value a rounding makes (elementwise ops, sums, dots...) whose interval |x| + e reaches the least magnitude that
  rounds to an infinity in its type: the infinity of that side (a type without infinities: NaN);
- a division whose divisor's interval holds 0 (rounding-decided: x / +-0, 0 / 0; not sqrt, log, rsqrt of such an
  interval: their operand is mostly a square or a norm, never negative however it rounds), and the marked
  elements of an elementwise op's operands: the op's kernel on every combination of the operands' possible values
  there (the value, its interval's ends, +-0 where the interval
  holds 0, the kinds its marks allow): non-finite results mark, finite ones far from the value widen its bound to
  reach them (tanh(+inf) = 1).
The range check is a pass over the value (`largest_reach`) only where an upper bound of max |x| + e estimated from
the operands' (kept per value: moves and max / min / converts their largest, add / subtract / select their sum,
multiply their product, dots K products; `_estimated_reach`) may reach the limit: on the GPT d256 step the values
of divides, transcendentals, sums and a few products.
A reduce that may ignore NaN terms on the device (DeviceProfile.nan_ignoring_reductions: XLA:CPU's max and min
reduces of 4,096 elements or more, YNNPACK's: f32 and f64 always, f16 and bf16 by the NaN's sign) marks DROPPED_NAN where the shadow's value is NaN: the device's
is the other terms' max; an op with such an operand marks it where its own value is NaN.
Carried: moves move the marks; a sum's (add reduce, reduce-window, scatter) gets its terms' kinds, +inf with -inf
NaN; a max / min reduce its terms'; a dot's or convolution's output every kind where a marked term reaches it
(inf * 0, inf - inf); a collective's (`collective_marks`) as its bounds travel: its kernel exchanges every
participant's marks, marked or not (every participant makes the same exchanges); any other op with a marked
operand: every kind on every element.
"""

from __future__ import annotations

import functools
import itertools

import ml_dtypes
import numpy as np

from ..kernels.bound_rules import holds_zero, largest_reach
from ..ops.indexing import ANY_SHAPE_ELEMENTWISE
from .bound_store import EXACT_ELEMENTWISE, VIEW_MOVES, float_leaf, leaves

POS_INF, NEG_INF, NAN = np.uint8(1), np.uint8(2), np.uint8(4)
EVERY = np.uint8(7)
# where the shadow is NaN, the device may make any value: a reduce that ignores NaN terms (DeviceProfile.
# nan_ignoring_reductions) dropped it, here or in an operand
DROPPED_NAN = np.uint8(8)
_KINDS = ((POS_INF, np.inf), (NEG_INF, -np.inf), (NAN, np.nan))
# ops that round nothing beyond their operands: no new mark from the range (their operands' were checked)
_NO_ROUNDING = EXACT_ELEMENTWISE | {
    "select",
    "compare",
    "tuple",
    "get-tuple-element",
    "fusion",
    "call",
    "while",
    "conditional",
    "dynamic-update-slice",
    "gather",
    "real",
    "imag",
    "complex",
}
_SUMS = frozenset({"reduce", "reduce-window", "scatter"})


@functools.cache
def rounding_limit(dtype) -> tuple[float, np.uint8, np.uint8]:
    """(the least magnitude that rounds to an infinity in float `dtype`: its largest value plus half its ulp there;
    the marks above and below it: its infinities, NaN for a type without them)."""
    info = ml_dtypes.finfo(dtype)
    limit = float(info.max) + 2.0 ** (info.maxexp - info.nmant - 2)
    with np.errstate(all="ignore"):
        infinite = bool(np.isinf(np.array(np.inf).astype(dtype).astype(np.float64)))
    return limit, (POS_INF if infinite else NAN), (NEG_INF if infinite else NAN)


def sum_marks(kernel, a, e, zero, limit: float) -> np.ndarray:
    """A sum's (`kernel`: the reduce on its terms `a` with bounds `e` and init `zero`) marks where its partial sums
    may pass `limit` in some order: the intervals' positive parts added reach it: +inf; the negative parts': -inf;
    both: NaN."""
    with np.errstate(all="ignore"):
        up = np.real(kernel(np.maximum(a + e, 0.0), zero)) >= limit
        down = np.real(kernel(np.maximum(e - a, 0.0), zero)) >= limit
    return (up * POS_INF) | (down * NEG_INF) | ((up & down) * NAN)


def collective_marks(bounds, inst, value, operands, etypes) -> None:
    """A collective's marks (SPMD runs), exchanged with its group as its bounds are: its kernel on every
    participant's marks, marked or not (the exchanges must be the same on every participant, so this one exchange
    is made at every collective whatever the marks). A moving collective (all-gather, all-to-all, permute,
    broadcast) moves them, each element's from the participant it comes from; an add all-reduce or reduce-scatter
    is a sum of one term per participant, its marks a sum's (`sum_marks`) over the participants' intervals in
    the collective's type (`etypes`: its value's leaves' element types; its partial sums travel in it): the
    intervals' positive parts and negative parts summed in one exchange (the real and imaginary parts of one
    complex payload; a term marked +inf adds +inf to the positive parts, -inf to the negative, NaN to both:
    every kind; a term without a bound its value; one whose NaN may have been dropped NaN: DROPPED_NAN); a max / min all-reduce (or another reducer) its terms' kinds, one exchange per kind."""
    kernel = bounds._kernel(inst)
    results = [(k, v) for k, v in enumerate(leaves(value)) if float_leaf(v) and not any(v is o for o in operands)]
    reducer = inst.called.get("to_apply")
    kind = reducer.root.opcode if reducer is not None else None
    none = np.uint8(0)

    def held(o):  # (an operand's marks; unmarked: zeros as a view, nothing allocated)
        marks = bounds.marks_of(o)
        return np.broadcast_to(none, np.shape(o)) if marks is None else marks

    if kind is None:  # (moves the elements: their marks as they are)
        moved = leaves(kernel(*[held(o) if float_leaf(o) else o for o in operands]))
        for k, v in results:
            bounds._mark(v, np.asarray(moved[k], np.uint8))
        return
    if kind == "add":
        lanes = []
        for o in operands:
            if not float_leaf(o):
                lanes.append(o)
                continue
            a, e, marks = np.real(o), bounds.of(o), bounds.marks_of(o)
            e = np.where(np.isfinite(e), e, 0.0)  # (an element without a bound says nothing; its marks do)
            lane = np.empty(np.shape(o), np.complex128)
            np.fmax(a + e, 0.0, out=lane.real)  # (fmax: a NaN of the shadow's is 0 here, NaN only if dropped)
            np.fmax(e - a, 0.0, out=lane.imag)
            if marks is not None:
                lane.real[(marks & (POS_INF | NAN)) > 0] = np.inf
                lane.imag[(marks & (NEG_INF | NAN)) > 0] = np.inf
                lane.real[(marks & DROPPED_NAN) > 0] = np.nan
            lanes.append(lane)
        summed = leaves(kernel(*lanes))
        for k, v in results:
            limit = rounding_limit(etypes[k].numpy)[0] if etypes[k].kind == "float" else np.inf
            up, down = np.real(summed[k]) >= limit, np.imag(summed[k]) >= limit
            dropped = np.isnan(np.real(summed[k])) * DROPPED_NAN
            bounds._mark(v, (up * POS_INF) | (down * NEG_INF) | ((up & down) * NAN) | dropped)
        return
    marks = {k: np.zeros(np.shape(v), np.uint8) for k, v in results}
    for bit in (*(bit for bit, _ in _KINDS), DROPPED_NAN):
        reached = leaves(kernel(*[(held(o) & bit) if float_leaf(o) else o for o in operands]))
        for k, _v in results:
            marks[k] |= (np.asarray(reached[k]) > 0) * bit
    for k, v in results:
        bounds._mark(v, marks[k])


def dot_marks(bounds, inst, orig, x, operands) -> None:
    """A dot's or convolution's marks (kept in `bounds` for mark_overflows) where |A| |B| over its intervals reaches
    past the largest value of its accumulation's type (the wider of its result's and f32: XLA's dots; an f64 one's
    is the shadow's own): every kind (the products' signs mixed). Checked where K max|A| max|B| does: only f32
    operands near f32's range can."""
    a, b = operands
    if orig.shape.element_type.bits > 32 or not (float_leaf(a) and float_leaf(b)) or np.iscomplexobj(x):
        return
    limit = rounding_limit(np.float32)[0]
    reach = _estimated_reach(bounds, inst, operands, 1.0)
    if reach is None or not reach >= limit:
        return
    # (the kept reaches are estimates, a chain's products of them far past the values: the operands' own first,
    # a pass each, before a float64 dot of them)
    refined = _estimated_reach(bounds, inst, operands, 1.0, [_whole_reach(bounds, o) for o in operands])
    if refined is not None and refined < limit:
        return
    with np.errstate(all="ignore"):
        reach = np.real(bounds._kernel(inst)(np.abs(a) + bounds.of(a), np.abs(b) + bounds.of(b)))
    bounds._mark(x, (reach >= limit) * EVERY)


def range_marks(x, bound, dtype) -> np.ndarray:
    """Where `x`'s interval (`bound` around the exact value) reaches a magnitude that rounds to an infinity in
    `dtype`: that side's mark. A bound that is not finite (no rule) marks nothing."""
    limit, up, down = rounding_limit(dtype)
    e = np.broadcast_to(np.asarray(bound if bound is not None else 0.0, np.float64), np.shape(x))
    x = np.real(x)
    finite = np.isfinite(e)
    return ((finite & (x + e >= limit)) * up) | ((finite & (x - e <= -limit)) * down)


def _whole_reach(bounds, x) -> float:
    """max |x| + its bound over `x`'s elements, inf where a bound is not finite (an op on |x| + bound reaches it
    there; `_reach` counts it 0)."""
    bound = bounds._stored_bound(x)
    return np.inf if bound is not None and not np.isfinite(bound).all() else _reach(x, bound)


def _reach(x, bound) -> float:
    """max |x| + bound over `x`'s elements (a bound that is not finite counted 0; None: none)."""
    flat = np.ravel(np.real(x))
    if flat.dtype not in (np.float32, np.float64):  # (a pinned op's own 16- or 8-bit values: the kernels take these)
        flat = flat.astype(np.float64)
    return largest_reach(flat, np.empty(0) if bound is None else np.ravel(np.broadcast_to(bound, np.shape(x))))


# ops whose |x| + e is at most their float operands' largest (times a rounding), or their sum (add, subtract,
# select: either branch, their distance added where rounding decides), or product (multiply): a value's reach
# (max |x| + e) estimated from its operands' skips the pass over it where that stays below the type's limit
_REACH_MAX = (
    frozenset({"convert", "negate", "abs", "maximum", "minimum", "clamp", "copy"})
    | VIEW_MOVES
    | {
        "concatenate",
        "pad",
        "reverse",
        "dynamic-slice",
        "dynamic-update-slice",
        "gather",
        "bitcast",
    }
)
_REACH_SUM = frozenset({"add", "subtract", "select"})


def mark_overflows(bounds, inst, value, operands, singular: tuple = (), carries: bool = True) -> None:
    """After `bounds` (an ErrorBounds) bounded `inst`'s `value`: its float leaves' marks (module docstring), with
    those its rule set already (a sum's, a dot's), kept; bounds widened where an elementwise op's marked operands
    can make a finite value far from its own. `singular`: the operands at which the op is singular at 0 (a
    divisor). `carries`: False where the rule set the marks the operands' give (a collective's: collective_marks).
    Cheap where nothing is marked: a look-up per operand, and a pass over the values a rounding makes
    only where their reach estimated from their operands' (`_estimated_reach`) may pass the type's limit."""
    held = [bounds.marks_of(o) if carries and float_leaf(o) else None for o in operands]
    opcode = inst.opcode
    made = value if isinstance(value, (tuple, list)) else [value]
    single = len(made) == 1 and float_leaf(made[0]) and not any(made[0] is o for o in operands)
    if all(h is None for h in held) and opcode in _NO_ROUNDING | VIEW_MOVES:
        if single and opcode in _REACH_MAX | _REACH_SUM:  # (its reach, for the ops after it)
            bounds._keep_reach(made[0], _estimated_reach(bounds, inst, operands, 1.0))
        return
    orig = bounds.plans.original(inst)
    if orig is None:  # (the shadow's own helpers)
        return
    dropped = any(h is not None and (h & DROPPED_NAN).any() for h in held)
    if not single:  # (a tuple's leaves made by the op itself, a sort's, from a marked operand: every kind)
        if any(h is not None for h in held) and opcode not in _NO_ROUNDING:
            for leaf in made:
                if float_leaf(leaf) and not any(leaf is o for o in operands):
                    every = np.full(np.shape(leaf), EVERY)
                    bounds._mark(leaf, every | _nan(leaf) * DROPPED_NAN if dropped else every)
        return
    x = made[0]
    kept = bounds.marks_of(x)
    # (made only where a mark may be: most values have none, and neither a full-size array of zeros nor passes over it)
    marks: np.ndarray | None = None if kept is None else np.array(kept)

    def add(more):
        nonlocal marks
        if marks is None:
            marks = np.zeros(np.shape(x), np.uint8)
        marks |= more

    if dropped or _ignores_nan(bounds.device, inst, orig, x, operands):
        add(_nan(x) * DROPPED_NAN)
    if any(h is not None for h in held):
        add(_carried(bounds, inst, x, operands, held, singular))
    elif singular and bounds._decided_or_none(x) is not None and _may_be_zero(bounds, operands, singular):
        add(_evaluated(bounds, inst, x, operands, held, singular))  # (a divisor's interval holding 0)
    etype = orig.shape.element_type
    reach = None
    marked = marks is not None and marks.any()
    if opcode not in _NO_ROUNDING | VIEW_MOVES and etype.kind == "float" and etype.bits < 64:
        limit = rounding_limit(etype.numpy)[0]
        if not marked:
            reach = _estimated_reach(bounds, inst, operands, 1 + 2.0 ** -ml_dtypes.finfo(etype.numpy).nmant)
        if reach is None or not reach < limit:
            reach = _reach(x, bounds._stored_bound(x))
            if reach >= limit:
                add(range_marks(x, bounds._stored_bound(x), etype.numpy))
                marked = marks is not None and marks.any()  # (set by add)
    bounds._mark(x, marks)
    bounds._keep_reach(x, None if marked else reach)


def _nan(x) -> np.ndarray:
    """Where the real value `x` (or its real part) is NaN, with its shape (a 0-d value's too)."""
    return np.broadcast_to(np.isnan(np.real(x)), np.shape(x))


# the types whose max / min reduces a device with nan_ignoring_reductions may compute ignoring NaN terms (XLA:CPU's
# YNNPACK: f32 and f64 always; f16 and bf16 by the NaN's sign bit, which the shadow does not follow)
_NAN_IGNORING = frozenset({"f16", "bf16", "f32", "f64"})


def _ignores_nan(device, inst, orig, x, operands) -> bool:
    """Whether `inst` is a max or min reduce (or reduce-window whose strides are its sizes) that `device` may compute
    ignoring NaN terms (DeviceProfile.nan_ignoring_reductions: at least that many elements in its result or an
    operand; _NAN_IGNORING's types), with a NaN in its value."""
    least = device.nan_ignoring_reductions
    reducer = inst.called.get("to_apply")
    if not least or inst.opcode not in ("reduce", "reduce-window") or len(operands) != 2 or reducer is None:
        return False
    if reducer.root.opcode not in ("maximum", "minimum") or orig.shape.element_type.name not in _NAN_IGNORING:
        return False
    if inst.opcode == "reduce-window":
        window = inst.attr("window") or ()
        if not any(w.size > 1 or w.stride > 1 for w in window) or any(
            w.size > 1 and (w.stride != w.size or w.base_dilation != 1 or w.window_dilation != 1 or w.reversal)
            for w in window
        ):
            return False
    return max(np.size(x), np.size(operands[0])) >= least and bool(np.isnan(np.real(x)).any())


def _estimated_reach(bounds, inst, operands, rounding: float, known: list | None = None) -> float | None:
    """An upper bound of max |x| + e of `inst`'s value from its float operands' (kept, or a pass over an operand
    where none is: a parameter, a constant; `known`: each operand's given), None where the op has no such rule (or
    an operand is complex). A dot or convolution: K products of the operands' reaches (its bound, calibrated, at
    most its terms' errors added, and its accumulation's; K a dot's contraction, a convolution's every pair of
    elements: an overestimate)."""
    opcode = inst.opcode
    if opcode not in _REACH_MAX and opcode not in _REACH_SUM and opcode not in ("multiply", "dot", "convolution"):
        return None
    reaches = []
    for k, o in enumerate(operands):
        if not float_leaf(o):
            continue
        if np.iscomplexobj(o):
            return None
        r = bounds.reach_of(o) if known is None else known[k]
        if r is None:
            r = _reach(o, bounds._stored_bound(o))
            bounds._keep_reach(o, r)
        reaches.append(r)
    if not reaches:
        return None
    if opcode == "multiply":
        return float(np.prod(reaches)) * rounding
    if opcode in ("dot", "convolution"):
        if len(reaches) != 2:
            return None
        a, b = operands
        terms = (
            np.prod([np.shape(a)[int(d)] for d in inst.attr("lhs_contracting_dims", ())])
            if opcode == "dot"
            else np.size(a) * np.size(b)
        )
        return float(terms) * reaches[0] * reaches[1] * (1 + 2.0**-7) * rounding  # (f32 accumulation's, bf16's)
    return (sum(reaches) if opcode in _REACH_SUM else max(reaches)) * rounding


def _may_be_zero(bounds, operands, places) -> bool:
    """Whether an interval of the operands at `places` holds 0 (one compiled pass each)."""
    for k in places:
        d, e = operands[k], bounds._stored_bound(operands[k]) if float_leaf(operands[k]) else None
        if e is not None and not np.iscomplexobj(d):
            d, e = np.asarray(d), np.broadcast_to(e, np.shape(d))
            # (a broadcast divisor, a row's sum: its source's elements, each once)
            at = tuple(0 if a == 0 and b == 0 else slice(None) for a, b in zip(d.strides, e.strides))
            if holds_zero(np.ravel(d[at]), np.ravel(e[at])):
                return True
    return False


def _carried(bounds, inst, x, operands, held, singular) -> np.ndarray:
    """The marks `x` gets from its operands' (`held`)."""
    opcode = inst.opcode
    shape = np.shape(x)
    if opcode == "select":
        p, (_, t, f) = operands[0], held
        t = np.zeros(shape, np.uint8) if t is None else t
        f = np.zeros(shape, np.uint8) if f is None else f
        either = bounds.decided_of(p)
        return np.where(either, t | f, np.where(p, t, f)).astype(np.uint8)
    if opcode in ANY_SHAPE_ELEMENTWISE:
        return _evaluated(bounds, inst, x, operands, held, singular)
    kernel = bounds._kernel(inst)
    reducer = inst.called.get("to_apply")
    kind = reducer.root.opcode if reducer is not None else ""
    if (
        opcode in VIEW_MOVES
        or opcode in ("concatenate", "pad", "reverse", "dynamic-slice", "gather", "bitcast")
        or (opcode in _SUMS and kind in ("add", "maximum", "minimum"))
    ):
        # (the op on each kind's indicator: moved, or any term's reaching the result)
        out = np.zeros(shape, np.uint8)
        for bit, _ in _KINDS:
            args = [
                (np.zeros(np.shape(o)) if h is None else (h & bit).astype(np.float64)) if float_leaf(o) else o
                for o, h in zip(operands, held)
            ]
            out |= (np.real(np.asarray(kernel(*args))) > 0) * bit
        both = (out & POS_INF).astype(bool) & (out & NEG_INF).astype(bool)
        return out | (both * NAN) if opcode in _SUMS and kind == "add" else out
    if opcode in ("dot", "convolution") and len(operands) == 2:
        reached = np.zeros(shape, bool)
        for k in (0, 1):
            if held[k] is None:
                continue
            args = [(held[j] > 0).astype(np.float64) if j == k else np.ones(np.shape(operands[j])) for j in (0, 1)]
            reached |= np.real(np.asarray(kernel(*args))) > 0
        return reached * EVERY
    return np.full(shape, EVERY)


def _evaluated(bounds, inst, x, operands, held, singular) -> np.ndarray:
    """An elementwise op's marks where an operand is marked or a `singular` operand's interval holds 0: its kernel
    on every combination of the operands' possible values there (the value, its interval's ends, +-0 where the
    interval holds 0, the kinds its marks allow); where a marked operand's finite result is farther from `x` than
    its bound, the bound is widened to reach it (tanh(+inf) = 1)."""
    shape = np.shape(x)
    carried = np.zeros(shape, bool)
    for h in held:
        if h is not None:
            carried |= h > 0
    where = carried.copy()
    for k in singular:
        e = bounds._bound_or_none(operands[k]) if float_leaf(operands[k]) else None
        if e is not None:
            where |= np.broadcast_to((np.abs(operands[k]) <= e) & (e > 0) & (e < np.inf), shape)
    at = np.flatnonzero(where)
    marks = np.zeros(shape, np.uint8)
    if not at.size:
        return marks
    index = np.unravel_index(at, shape or (1,))

    def pick(array):  # (its elements at `at`; a 0-d value's as one)
        whole = np.broadcast_to(array, shape)
        return (whole if shape else whole.reshape(1))[index]

    choices = []  # per operand: its possible values at `at` (a non-float operand's: as it is)
    for o, h in zip(operands, held):
        if not float_leaf(o) or np.iscomplexobj(o):
            choices.append([pick(o) if np.ndim(o) else o])
            continue
        a = pick(o).astype(np.float64)
        e = pick(bounds.of(o))
        e = np.where(np.isfinite(e), e, 0.0)
        options = [a, a - e, a + e]
        holds_zero = (a - e <= 0) & (a + e >= 0)
        if holds_zero.any():
            options += [np.where(holds_zero, 0.0, a), np.where(holds_zero, -0.0, a)]
        if h is not None:
            kinds = pick(h)
            options += [np.where(kinds & bit, special, a) for bit, special in _KINDS]
        choices.append(options)
    kernel = bounds._kernel(inst)
    found = np.zeros(at.size, np.uint8)
    farthest = np.zeros(at.size)
    value = pick(np.real(x))
    with np.errstate(all="ignore"):
        for args in itertools.product(*choices):
            y = np.broadcast_to(np.real(np.ravel(np.asarray(kernel(*args), np.float64))), at.shape)
            found |= (y == np.inf) * POS_INF
            found |= (y == -np.inf) * NEG_INF
            found |= np.isnan(y) * NAN
            farthest = np.maximum(farthest, np.where(np.isfinite(y), np.abs(y - value), 0.0))
    marks.reshape(-1)[at] = found
    farthest = np.where(pick(carried), farthest, 0.0)  # (a singular op's own interval: its rule bounded it)
    bound = pick(bounds.of(x))
    if (farthest > bound).any():
        stored = bounds._stored_bound(x)
        widened = np.array(np.broadcast_to(bounds.of(x), shape), np.float64)
        widened.reshape(-1)[at] = np.maximum(bound, farthest)
        keep = stored.dtype if stored is not None else np.float64
        bounds._put(x, widened.astype(keep), bounds._decided_or_none(x), bounds._stored_samples(x))
    return marks
