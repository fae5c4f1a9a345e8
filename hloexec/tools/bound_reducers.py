"""Computations observed step by step on whole arrays (tools/bounds.py): a map's, and the reducer of a reduce or
reduce-window no other rule knows -- neither one add, multiply, max or min (tools/bound_sums.py) nor a selection
(tools/bound_sorts.py): `lax.cumlogsumexp`'s logaddexp (a `select` guarding infinities), a complex max or min
(real parts, then imaginary ones, compared), a compensated (Kahan) sum, an online softmax's (max, rescaled sum).

Such a reduce is the fold of its reducer over each output's terms, in the HLO's order (hloexec's and XLA:CPU's
loops: row-major over the reduced dims or the window; a window's padding is the init value): the accumulators
start as the init values, and each fold applies the reducer to (accumulators, the j-th terms) on arrays of the
output's shape, every step bounded and sampled by its elementwise rule as a fusion's are (a comparison whose
operands' intervals overlap decides a select either way: a near-tie of a complex max allows either value). The
bound follows the reducer's arithmetic, its roundings in the program's type, not the device's order: XLA may
reassociate a reducer it takes for associative (a scan's two levels); the tests measure XLA:CPU's. The terms'
errors combine as the elementwise rules combine them (independent operands): a compensation term's cancellation
(Kahan's `(t - s) - y`) is not seen, so a compensated sum is bounded as the plain sum it corrects."""

from __future__ import annotations

import numpy as np

from ..exec.plan import schedule
from ..ir.opcodes import reducer_opcode
from ..ops.indexing import ANY_SHAPE_ELEMENTWISE
from ..ops.reduction import window_terms
from .bound_sorts import chooses
from .bound_store import float_leaf as _float
from .bound_sums import rounded_steps

# folds times output elements a reduce may take (each fold observes every step of its reducer): past it, no rule
FOLD_BUDGET = 1 << 24


def elementwise_steps(comp) -> list | None:
    """`comp`'s instructions in order where every one is a parameter, a constant, an elementwise op that takes any
    shape (ops/indexing.ANY_SHAPE_ELEMENTWISE) or its root tuple; else None."""
    steps = schedule(comp) if comp is not None else []
    allowed = ANY_SHAPE_ELEMENTWISE | {"parameter", "constant", "real", "imag", "complex"}
    if not steps or any(s.opcode not in allowed and not (s is comp.root and s.opcode == "tuple") for s in steps):
        return None
    return steps


def observe_steps(bounds, steps, args, shape) -> list:
    """The values of `steps` (elementwise_steps') run on whole arrays `args` (its parameters' values, known to
    `bounds`), each step observed by `bounds` as a fusion's are; returns the root's values (a tuple root's
    operands'). Constants are broadcast to `shape` (exact arrays, as the op broadcasts them)."""
    values = {}
    for step in steps:
        if step.opcode == "parameter":
            values[id(step)] = args[step.parameter_number]
            continue
        if step.opcode == "tuple":
            continue
        operands = [values[id(o)] for o in step.operands]
        made = bounds._kernel(step)(*operands)
        if step.opcode == "constant":
            made = np.broadcast_to(made, shape)
        else:
            bounds(step, made, operands)
        values[id(step)] = made
    root = steps[-1]
    return [values[id(o)] for o in root.operands] if root.opcode == "tuple" else [values[id(root)]]


def _known_elsewhere(inst, orig, n: int) -> bool:
    """Whether another rule bounds reduce `inst` of n inputs: one op (bound_sums.reduce_bounds), one rounded to a
    narrower type (bound_sums.rounded_steps), or a selection (bound_sorts.selecting_reduce)."""
    reducer = inst.called["to_apply"]
    if n == 1:
        return reducer_opcode(reducer) is not None or rounded_steps(orig) is not None
    floats = [k for k, (_, leaf) in enumerate(inst.shape.leaves()) if leaf.element_type.kind == "float"]
    return all(chooses(reducer, k, n) for k in floats)


def folded_reduce(bounds, inst, orig, value, operands) -> bool:
    """Puts the bounds of a reduce or reduce-window whose reducer no other rule knows (module docstring) into
    `bounds`, its reducer folded over the terms; False (nothing done) where another rule knows it, a step is not
    elementwise, an input may be non-finite already, or the folds pass FOLD_BUDGET."""
    n = len(operands) // 2
    reducer = inst.called.get("to_apply")
    steps = elementwise_steps(reducer) if reducer is not None and orig is not None else None
    if steps is None or _known_elsewhere(inst, orig, n):
        return False
    leaves = list(value) if isinstance(value, tuple) else [value]
    shape = np.shape(leaves[0])
    inputs, inits = operands[:n], operands[n:]
    if any(bounds.marks_of(o) is not None for o in operands) or any(np.any(bounds.of(i)) for i in inits):
        return False
    if inst.opcode == "reduce":
        dims = [int(d) for d in inst.attr("dimensions", ())]
        kept = [d for d in range(np.ndim(inputs[0])) if d not in dims]

        def terms(x, fill):  # (output dims..., reduced dims...)
            return np.transpose(x, kept + dims)

    else:
        terms = window_terms(inst)
    folds = int(np.prod(np.shape(terms(inputs[0], inits[0]))[len(shape) :], dtype=np.int64))
    if folds * max(int(np.prod(shape, dtype=np.int64)), 1) > FOLD_BUDGET:
        return False
    views = [_term_views(bounds, terms, x, init) for x, init in zip(inputs, inits)]
    padding = terms(np.zeros(np.shape(inputs[0]), bool), True)  # (a window's: the init value, no term)
    accumulators = [np.broadcast_to(init, shape) for init in inits]  # (exact: checked above)
    for a in accumulators:
        bounds._put(a, None)
    empty = np.ones(shape, bool)  # (no term folded in yet)
    fold_shape = np.shape(padding)[len(shape) :]
    for j in range(folds):
        at = (Ellipsis, *np.unravel_index(j, fold_shape))
        args = [_term(bounds, v, at) for v in views]
        made = observe_steps(bounds, steps, accumulators + args, shape)
        # where the init value is the reducer's identity on these values (as the shadow computes them: the exact
        # ones), a first term is taken as it is and a window's padding leaves the accumulators as they are:
        # logaddexp's -inf, a max's, a sum's 0 (their steps at the identity would give inf - inf bounds)
        first = empty & ~padding[at] & _all_same(made, args)
        kept = padding[at] & _all_same(made, accumulators)
        accumulators = [_merged(bounds, first, kept, m, t, a) for m, t, a in zip(made, args, accumulators)]
        empty &= padding[at]
    for leaf, result in zip(leaves, accumulators):
        if _float(leaf):
            bounds._share(leaf, result)
    return True


def _all_same(made, values) -> np.ndarray:
    """Where every one of `made` equals its one of `values` (NaN as NaN)."""
    same = np.ones(np.shape(made[0]), bool)
    for m, v in zip(made, values):
        same &= (m == v) | ((m != m) & (v != v))
    return same


def _merged(bounds, first, kept, made, term, accumulator):
    """An accumulator after a fold: `term` where `first`, `accumulator` where `kept`, else `made`, each with its
    entry (bound, decided marks, samples) known to `bounds`."""
    if not first.any() and not kept.any():
        return made
    if first.all():
        return term
    if kept.all():
        return accumulator

    def pick(of):
        return np.where(first, of(term), np.where(kept, of(accumulator), of(made)))

    value = pick(lambda v: v)
    if _float(value):
        sampled = [bounds._samples_or_none(v) for v in (term, accumulator, made)]
        samples = None
        if any(s is not None for s in sampled):
            zero = np.zeros((1, *np.shape(value)), next(s for s in sampled if s is not None).dtype)
            t, a, m = (zero if s is None else s for s in sampled)
            samples = np.where(first, t, np.where(kept, a, m))
        bounds._put(value, pick(bounds.of), pick(bounds.decided_of), samples)
    return value


def _term_views(bounds, terms, x, init) -> tuple:
    """(value, bound, decided marks or None, samples or None: one view a sample) of input `x` as `terms` lays it
    out (output dims..., fold dims...), its padding the init value (exact: no bound, no deviation)."""
    entry = bounds._entry(x) if _float(x) else None
    bound = None if entry is None or entry[1] is None else terms(np.broadcast_to(entry[1], np.shape(x)), 0)
    decided = None if entry is None or entry[2] is None else terms(np.broadcast_to(entry[2], np.shape(x)), False)
    samples = None if entry is None or entry[3] is None else [terms(s, 0) for s in entry[3]]
    return terms(x, np.asarray(init).reshape(()).item()), bound, decided, samples


def _term(bounds, views, at):
    """The terms at fold position `at` of _term_views' `views`: a new array known to `bounds` with its entry."""
    value, bound, decided, samples = views
    term = np.ascontiguousarray(value[at])
    if _float(term):
        bounds._put(
            term,
            None if bound is None else np.ascontiguousarray(bound[at]),
            None if decided is None else np.ascontiguousarray(decided[at]),
            None if samples is None else np.stack([s[at] for s in samples]),
        )
    return term
