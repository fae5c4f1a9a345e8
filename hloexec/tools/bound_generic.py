"""The error bounds of the unary elementwise ops ErrorBounds evaluates at their operand's interval ends (sqrt,
rsqrt, the transcendentals, floor...: tools/bounds.py `_moved_by`) in one compiled pass
(kernels/bound_generic.unary_pass): the op evaluated by the shadow's own kernel on the interval's ends and the
samples' perturbed operands at once, then the bound, the rounding, the samples' deviations with their own-error
draws and calibration's block statistics in one loop: the separate rules' formulas (`_elementwise`,
`_evaluated`, `_round`, `_sample`) in their order, the same noise windows, so the bounds and samples are theirs
(a sample's deviation of -0 may come out +0)."""

from __future__ import annotations

import numpy as np

from ..kernels.bound_generic import (
    BOUNDS,
    BOUNDS_SQUARED,
    LEAST,
    REST_SQUARED,
    VALUES_SQUARED,
    select_pass,
    term_sums,
    unary_pass,
)
from ..kernels.bound_rules import add_noise
from .bound_complex import squared_magnitude
from .bound_elementwise import _flat, rounding_rule, store_pass
from .bound_samples import CALIBRATION_BLOCK, SAMPLES, SIGMAS
from .bound_shared import least_along
from .bound_store import SAMPLE_STORAGE, has_error

_NO_BOUND = np.empty(0, np.float32)  # (float32 as the narrow types' bounds: one compiled signature fewer)
_NO_MARKS = np.empty(0, bool)
_NO_DECISIONS = np.empty((SAMPLES, 0), bool)
_NO_TERM_BOUNDS = np.empty((0, 0), np.float32)
_NO_SAMPLES = np.empty((SAMPLES, 0, 0), np.uint16)  # (bfloat16 bits)
_NO_BITS = np.empty((SAMPLES, 0), np.uint16)  # (samples kept: their bfloat16 bits)
for _none in (_NO_BOUND, _NO_MARKS, _NO_DECISIONS, _NO_TERM_BOUNDS, _NO_SAMPLES, _NO_BITS):
    _none.flags.writeable = False


# moves whose kernel (numpy indexing: any dtype) moves the samples' bfloat16 bits as they are kept (`moved_samples`)
BIT_MOVES = frozenset({"concatenate", "dynamic-slice", "dynamic-update-slice", "reverse"})
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # (an exact float operand: zeros as its samples' bits)


def _f64(v) -> bool:
    return isinstance(v, (np.ndarray, np.generic)) and v.dtype == np.float64


def _or_zero(bounds, value):
    """`value`'s stored bound, 0 where it has none."""
    e = bounds._stored_bound(value)
    return 0.0 if e is None else e


def evaluated_elementwise(bounds, inst, orig, x, operands, singular: tuple, steps: bool, rounds: bool) -> bool:
    """`x`'s bound, rounding-decided marks and samples (calibrated) into `bounds` (an ErrorBounds) in one pass,
    where `inst` is an elementwise op on float64 (the shadow's values) of which at most one operand (in one or more
    places) has a bound or samples, the others exact: `singular`, the places where an operand's interval holding
    0 decides the element; `steps`, its ends giving different values do; `rounds`, the op rounds to its type.
    False (nothing done) otherwise (two operands with errors: their corners, `_second_order`; samples not kept in
    bfloat16). The samples are read and written as their bfloat16 bits (no float32 copies)."""
    shape = np.shape(x)
    if not _f64(x) or not all(_f64(o) and np.shape(o) == shape for o in operands):
        return False
    with_errors = [o for o in operands if bounds._stored_samples(o) is not None or np.any(_or_zero(bounds, o))]
    if any(o is not with_errors[0] for o in with_errors):
        return False
    a = with_errors[0] if with_errors else operands[0]
    places = [k for k, o in enumerate(operands) if o is a]
    fixed = [None if o is a else _flat(o) for o in operands]
    kernel = bounds._kernel(inst)

    def evaluate(rows, lo, hi):  # (the fixed operands' elements broadcast along the rows)
        return kernel(*(rows if f is None else f[lo:hi] for f in fixed))

    bits = int(orig.attr("mantissa_bits")) if inst.opcode == "reduce-precision" else 0
    rule = rounding_rule(orig.shape.element_type, inst.opcode, bits)
    if rule is None:  # (not a float type: the separate rules')
        return False
    e = bounds._stored_bound(a)
    moving = e is not None and bool(np.any(e))
    at_zero = bool(set(places) & set(singular))
    perturbed = bounds._stored_samples(a)
    if perturbed is not None and perturbed.dtype != SAMPLE_STORAGE:
        return False
    sampled = rounds or perturbed is not None
    samples = np.empty((SAMPLES, *shape) if sampled else (SAMPLES, 0), np.uint16)  # (bfloat16 bits)
    bound = np.empty(shape, np.float32 if getattr(bounds.current, "narrow", False) else np.float64)
    decided = np.zeros(shape if moving and (at_zero or steps) else 0, bool)
    key = bounds.draw_key() if rounds else np.uint64(0)
    any_own, *stats = unary_pass(
        evaluate,
        (at_zero, steps, rounds),
        _flat(x),
        _flat(a),
        _flat(np.broadcast_to(e, shape)) if moving else _NO_BOUND,
        _NO_BITS if perturbed is None else _flat(perturbed.view(np.uint16), SAMPLES),
        rule,
        (key, float(SIGMAS)),
        bound.reshape(-1),
        samples.reshape(SAMPLES, -1),
        decided.reshape(-1),
        CALIBRATION_BLOCK,
    )
    own = decided if decided.size else None
    made = samples.view(SAMPLE_STORAGE) if sampled else None
    store_pass(bounds, x, operands, bound, own, made, stats, key if rounds and not any_own else None)
    return True


def fused_select(bounds, x, operands) -> bool:
    """A select's bound, rounding-decided marks and samples (calibrated) into `bounds` in one pass
    (kernels/bound_generic.select_pass: `_select`'s and `_sample`'s rules, the same bits), where its branches are
    float64 (the shadow's values) and its predicate a bool array of their shape; False (nothing done) otherwise.
    The branches' samples are read and written as their bfloat16 bits (no float32 copies)."""
    p, t, f = operands
    shape = np.shape(x)
    if not (_f64(x) and _f64(t) and _f64(f) and isinstance(p, np.ndarray) and p.dtype == np.bool_):
        return False
    if not np.shape(p) == np.shape(t) == np.shape(f) == shape:
        return False
    stored = [bounds._stored_samples(o) for o in (t, f)]
    if any(q is not None and q.dtype != SAMPLE_STORAGE for q in stored):
        return False
    et, ef = (_NO_BOUND if e is None else _flat(np.broadcast_to(e, shape)) for e in map(bounds._stored_bound, (t, f)))
    marks = [bounds._decided_or_none(o) for o in (t, f, p)]
    decisions = bounds._samples_or_none(p)  # (the predicate's perturbed decisions: bool)
    sampled = decisions is not None or any(q is not None for q in stored)
    dt, df = (_NO_BITS if q is None else _flat(q.view(np.uint16), SAMPLES) for q in stored)
    bound = np.empty(shape, np.float32 if getattr(bounds.current, "narrow", False) else np.float64)
    decided = np.empty(shape, bool)
    samples = np.empty((SAMPLES, *shape) if sampled else (SAMPLES, 0), np.uint16)  # (bfloat16 bits)
    stats = select_pass(
        _flat(p),
        _flat(t),
        _flat(f),
        _flat(x),
        et,
        ef,
        tuple(_NO_MARKS if m is None else _flat(np.broadcast_to(m, shape)) for m in marks),
        _NO_DECISIONS if decisions is None else _flat(decisions, SAMPLES),
        dt,
        df,
        bound.reshape(-1),
        decided.reshape(-1),
        samples.reshape(SAMPLES, -1),
        CALIBRATION_BLOCK,
    )
    made = samples.view(SAMPLE_STORAGE) if sampled else None
    if made is not None:
        bound = bounds._calibrate(bound, made, stats=stats, in_place=True)  # (the pass's own array)
    bounds._put(x, bound, decided, made)
    return True


def summed_terms(bounds, inst, a, init) -> tuple | None:
    """What an add reduce's bound rule reads of its terms, per element of its result (kernels/bound_generic.term_sums,
    one pass over them in float64; their rows BOUNDS_SQUARED...: (5, *result's shape)), and the samples' deviations
    summed ((SAMPLES, *result's shape), float32; zeros where the terms have none): the rule's sums in term order
    rather than the shadow's reduce kernel's (a float64 rounding apart), the samples' in float64 rounded once
    rather than in float32, read from their bfloat16 bits. None where the terms are not float32 / float64, their samples
    not kept in bfloat16, or the init value has samples."""
    dims = [int(d) for d in inst.attr("dimensions", ())]
    if not (isinstance(a, np.ndarray) and a.dtype.type in (np.float32, np.float64)) or not dims or a.size == 0:
        return None
    if bounds._samples_or_none(init) is not None:
        return None
    kept = [d for d in range(a.ndim) if d not in dims]
    trailing = sorted(dims) == list(range(len(kept), a.ndim))
    columns = not trailing and sorted(dims) == list(range(len(dims)))  # (reduced dims leading: terms along rows)
    count = int(np.prod([a.shape[d] for d in dims], dtype=np.int64))
    result = tuple(a.shape[d] for d in kept)
    laid = (count, a.size // count) if columns else (a.size // count, count)

    def terms(v, lead=()):  # (*lead, outputs, terms) or (*lead, terms, outputs), C-ordered, read-only
        n = len(lead)
        if not (trailing or columns):
            v = np.transpose(v, (*range(n), *(n + d for d in kept + dims)))
        out = np.ascontiguousarray(np.reshape(v, (*lead, *laid))).view()
        out.flags.writeable = False
        return out

    e, d = bounds._stored_bound(a), bounds._stored_samples(a)
    if d is not None and d.dtype != SAMPLE_STORAGE:
        return None
    sums = np.empty((5, a.size // count))
    deviations = np.empty((SAMPLES, a.size // count if d is not None else 0), np.float32)
    term_sums(
        terms(a),
        _NO_TERM_BOUNDS if e is None else terms(np.broadcast_to(e, a.shape)),
        _NO_SAMPLES if d is None else terms(d.view(np.uint16), (SAMPLES,)),  # (their bfloat16 bits)
        columns,
        sums,
        deviations,
    )
    if d is None:
        deviations = np.zeros((SAMPLES, a.size // count), np.float32)
    return sums.reshape(5, *result), deviations.reshape(SAMPLES, *result)


def moved_samples(bounds, inst, value, operands, held) -> bool:
    """A move's samples (one of BIT_MOVES; `held`: its operands' stored samples, None where none) into `bounds`: its
    kernel on their bfloat16 bits, a sample at a time (zeros where a float operand has none), the bits `_sample`'s
    decode, float32 move and encode give (both casts exact; a NaN is stored canonical, and stays so) with neither
    pass (a move is not calibrated: its bound and marks are kept). False (nothing done) where the value is not
    one float array with an entry or a stored sample is not bfloat16."""
    if inst.opcode not in BIT_MOVES or not isinstance(value, np.ndarray) or value.dtype not in _FLOATS:
        return False
    if bounds._entry(value) is None or any(h is not None and h.dtype != SAMPLE_STORAGE for h in held):
        return False
    exact = [
        np.zeros(np.shape(o), np.uint16) if h is None and getattr(o, "dtype", None) in _FLOATS else o
        for o, h in zip(operands, held)
    ]
    kernel = bounds._kernel(inst)
    out = np.empty((SAMPLES, *value.shape), np.uint16)
    for k in range(SAMPLES):
        out[k] = kernel(*(e if h is None else h[k].view(np.uint16) for e, h in zip(exact, held)))
    bounds._put(value, bounds._stored_bound(value), bounds._decided_or_none(value), out.view(SAMPLE_STORAGE))
    return True


def store_summed(bounds, x, own, ceiling, deviations, floor=None) -> None:
    """An add reduce's samples (`deviations`, its terms' summed by `summed_terms`: (SAMPLES, *x's shape), float32)
    into `bounds` as `_sample` finishes any value's: each plus a draw of the reduce's own error `own` (SIGMAS sigmas),
    then x's bound calibrated by them up to `ceiling` (the same draws, the same bits); with none of `_sample`'s
    dispatch (a reduce's samples are made: no kernel to run, 87 calls on the GPT step). `floor`: see with_floor."""
    if has_error(own):
        spread = np.asarray(own, np.float64)
        flat = spread.reshape(-1) if spread.shape == np.shape(x) else np.ravel(np.broadcast_to(spread, np.shape(x)))
        add_noise(deviations.reshape(SAMPLES, -1), bounds.draw_key(), flat, SIGMAS)
    bound = bounds._calibrate(bounds._stored_bound(x), deviations, ceiling)
    bound = with_floor(bound, deviations, floor)
    bounds._put(x, bound, bounds._decided_or_none(x), deviations)


def with_floor(bound, deviations, floor):
    """A sum's calibrated `bound` where its own error in its known order is `floor` (tools/bound_shared.
    repeated_rounding): its root-sum-square with |floor| (a candidate whose terms differ a little from the exact
    ones repeats the same roundings, or nearly: a stagnating sum stagnates, equal residues stay equal; its terms'
    own errors add to that, as the bound has them; where the residues are random |floor| is about one sigma, a
    bound of SIGMAS of them grows 3%), and `floor` added to every sample (`deviations`, in place, after the
    calibration, which reads the random part): a deviation all of them share, which what follows the sum carries.
    None: `bound` as it is."""
    if floor is None:
        return bound
    deviations += np.asarray(floor, np.float32).reshape(deviations.shape[1:])
    return np.hypot(bound, floor).astype(np.asarray(bound).dtype, copy=False)


def sum_terms(bounds, inst, a, init) -> tuple:
    """An add reduce's or reduce-window's terms as its bound rule (tools/bounds.py `_reduce`) reads them: (the bound
    before the accumulation, squared; the values squared, summed; a function giving the terms' bounds added, what
    they make at most; the samples' deviations summed, None where `_sample` sums them). A reduce's terms' errors
    are independent, or a part they all share (at most their least bound) plus the rest independent; a window's
    terms' bounds are added. A real reduce's in one compiled pass (`summed_terms`), the others' by the
    instruction's kernel on the bounds."""
    init_bound = bounds.of(init)
    summed = summed_terms(bounds, inst, a, init) if inst.opcode == "reduce" else None
    if summed is not None:
        sums, deviations = summed
        count = float(np.prod([a.shape[int(d)] for d in inst.attr("dimensions", ())]))
        independent = np.sqrt(sums[BOUNDS_SQUARED] + np.square(init_bound))
        rest = np.sqrt(sums[REST_SQUARED] + np.square(init_bound))
        shared = sums[LEAST] * count + init_bound  # (the least bound in every term)
        return (
            np.square(np.maximum(independent, shared + rest)),
            sums[VALUES_SQUARED],
            lambda: sums[BOUNDS] + init_bound,
            deviations,
        )
    terms = np.broadcast_to(bounds.of(a), a.shape)

    def kernel(*args):  # (a complex reduce's makes complex values of real terms: their real parts, the sums)
        return np.real(bounds._kernel(inst)(*args))

    linear = lambda: np.asarray(kernel(terms, init_bound), np.float64)  # noqa: E731
    # (a complex sum's: its parts' squares, |a|^2; its accumulation is the parts' as the real rule has them)
    squares = np.asarray(kernel(squared_magnitude(a), np.zeros_like(np.real(init))), np.float64)
    if inst.opcode != "reduce":
        return np.square(linear()), squares, linear, None
    least = least_along(terms, inst.attr("dimensions", ()))
    independent = np.sqrt(np.asarray(kernel(np.square(terms), np.square(init_bound)), np.float64))
    rest = np.sqrt(np.asarray(kernel(np.square(terms - least), np.square(init_bound)), np.float64))
    shared = np.asarray(kernel(least, init_bound), np.float64)
    return np.square(np.maximum(independent, shared + rest)), squares, linear, None
