"""Integers that rounding decides (tools/bounds.py): a sort's integer results (argsort's indices) where its keys
may swap within their bounds, an argmax's or a top-k's indices where keys within rounding of the extreme compete
(tools/bound_sorts.py makes the marks), and what integer ops make of them, up to the gather or dynamic-slice they
index.

A marked integer (or pred) value keeps, per element, the values it may take where the keys lie anywhere within their
bounds (the exact run's, the shadow's own, and any device's whose keys are within them):
`alternatives` (m, *shape); `origin` (int64, shape), the choice an element's alternatives follow: alternative k of
two elements of one origin is one choice (jax's `select(i < 0, i + n, i)` takes `i + n` and `i` from the same
`i`, not any pair of them); `lost`, the elements whose values were not followed. A sort makes them from its
first key's clusters (tools/bound_sorts.py: an element of a cluster may hold any of the cluster's values), each
element its own origin (two elements of a cluster are two choices: the pairs a permutation allows and more).

What follows them (`follow`, run after the bounds' rules for every instruction with a marked operand):
- an elementwise op: its kernel per alternative, the alternatives of operands of one origin taken together, an
  element where two operands of different origins both vary lost; a pred's varying elements are also
  rounding-decided (a select on it may take either branch: the bounds' select rule);
- a moving op (reshape, broadcast, slice, concatenate, pad, a gather or dynamic-slice of the marked value...): its
  kernel per alternative, and on the origins and the lost marks;
- a reduce: an element all of whose terms are fixed is fixed, the others lost;
- a float gather or dynamic-slice whose indices vary: the gathered value may be the operand at any of the
  alternatives: its bound reaches the farthest of their intervals, `max_k |g_k - x| + e_k` (g_k, e_k the operand
  and its bound gathered by alternative k);
- anything else (an integer op of another kind, a scatter or dynamic-update-slice by marked indices, a float made
  from a varying integer, indices whose components vary by different choices): its integer results lost, its float
  results' elements infinite and the instruction named (`unbounded`), never 0.
An element of a cluster larger than CHOICES (or past CHOICE_ELEMENTS per value) is lost where the sort makes it."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import numpy as np

from ..ir import opcodes
from .bound_samples import SAMPLES
from .bound_store import float_leaf, leaves as _leaves

CHOICES = 64  # the most alternatives an element keeps: an element of a larger cluster is lost
CHOICE_ELEMENTS = 1 << 24  # the most elements of a value's alternatives (m x its size) kept
# ops whose leaves are their called computations' (observed there) or their operands' own arrays
_OBSERVED_INSIDE = frozenset({"call", "fusion", "while", "conditional", "tuple", "get-tuple-element", "async-done"})
GATHERS = {"gather": slice(1, 2), "dynamic-slice": slice(1, None)}  # a gathering op's index operands
_INDEXED = {**GATHERS, "dynamic-update-slice": slice(2, None)}  # a moving op's index operands
MOVING = opcodes.MOVEMENT | opcodes.PASS_THROUGH | {"gather", "dynamic-update-slice"}


class Choices:
    """id(integer value) -> (weakref, alternatives, origin, lost) for the marked values alive in the run."""

    def __init__(self) -> None:
        self.store: dict[int, tuple] = {}
        self.lock = threading.Lock()
        self.origins = 0  # origins handed out (`fresh`)

    def put(self, leaf, alternatives, origin, lost) -> None:
        """Marks `leaf` (an ndarray); nothing where no element varies and none is lost."""
        varying = (alternatives != alternatives[:1]).any(0) if len(alternatives) > 1 else np.zeros(leaf.shape, bool)
        if not varying.any() and not lost.any():
            return
        key, store = id(leaf), self.store
        ref: Callable[[], object]  # the value while it lives
        if isinstance(leaf, np.ndarray):
            ref = weakref.ref(leaf, lambda _r: store.pop(key, None))
        else:  # (a numpy scalar, a kernel's 0-d result, cannot be referred to weakly: kept, as BoundStore keeps it)
            ref = lambda: leaf  # noqa: E731
        with self.lock:
            store[key] = (ref, alternatives, origin, lost, varying)

    def of(self, leaf):
        """(alternatives, origin, lost, varying) of a marked value, else None."""
        entry = self.store.get(id(leaf)) if isinstance(leaf, (np.ndarray, np.generic)) else None
        return entry[1:] if entry is not None and entry[0]() is leaf else None

    def fresh(self, shape) -> np.ndarray:
        """A new origin per element of `shape`."""
        with self.lock:
            start, self.origins = self.origins, self.origins + int(np.prod(shape, dtype=np.int64))
        return np.arange(start, self.origins, dtype=np.int64).reshape(shape)

    def marked(self, operands) -> bool:
        return bool(self.store) and any(self.of(leaf) is not None for leaf in _leaves(operands))


def from_clusters(choices: Choices, leaf, axis: int, starts, lengths) -> None:
    """Marks `leaf`, an integer result of a sort along `axis` whose first key splits into clusters (`starts`,
    `lengths`, over its elements with `axis` last, flattened: tools/bound_sorts.clusters): an element may hold any
    of its cluster's values."""
    if lengths.max() < 2:
        return
    flat = np.ascontiguousarray(np.moveaxis(leaf, axis, -1)).reshape(-1)
    length = np.repeat(lengths, lengths)
    start = np.repeat(starts, lengths)
    m = int(min(CHOICES, lengths.max(), max(2, CHOICE_ELEMENTS // flat.size)))
    alternatives = np.stack([flat[start + np.minimum(k, length - 1)] for k in range(m)])
    moved = np.moveaxis(leaf, axis, -1).shape
    alternatives = np.moveaxis(alternatives.reshape(m, *moved), -1, axis + 1)
    lost = np.moveaxis((length > m).reshape(moved), -1, axis)
    choices.put(leaf, alternatives, choices.fresh(leaf.shape), lost)


def from_selection(choices: Choices, leaf, values, keys, key_bounds, low, high, dims: tuple) -> None:
    """Marks `leaf`, the integer result of a reduce over `dims` that selects `values` where `keys` are extreme (an
    argmax's, argmin's index; the extreme lies in [`low`, `high`]): an element may hold the value at any position
    whose key's interval reaches that range (the exact extreme's key is one of them, and a device's)."""
    kept = [d for d in range(np.ndim(keys)) if d not in dims]
    shape = (*(np.shape(keys)[d] for d in kept), -1)
    keys, key_bounds, values = (
        np.transpose(np.broadcast_to(a, np.shape(keys)), (*kept, *dims)).reshape(shape)
        for a in (keys, key_bounds, values)
    )
    low, high = (np.asarray(a, np.float64)[..., None] for a in (low, high))
    from_reach(choices, leaf, values, (keys - key_bounds <= high) & (keys + key_bounds >= low))


def from_reach(choices: Choices, leaf, values, reach) -> None:
    """Marks `leaf`: its element may hold `values[..., i]` where `reach[..., i]` (both `leaf`'s shape plus the
    candidates' axis)."""
    count = reach.sum(-1)
    if count.max(initial=0) < 2:
        return
    m = int(min(CHOICES, count.max(), max(2, CHOICE_ELEMENTS // max(leaf.size, 1))))
    first = np.argsort(~reach, axis=-1, kind="stable")[..., :m]  # (the positions that reach it, in order)
    values = np.broadcast_to(values, reach.shape)
    picked = np.moveaxis(np.take_along_axis(values, first, -1), -1, 0).reshape(m, *leaf.shape)
    beyond = np.arange(m).reshape(m, *[1] * leaf.ndim) >= count.reshape(leaf.shape)
    alternatives = np.where(beyond, leaf, picked)
    # (lost too where its own value is not among them: the init's, a NaN's)
    lost = (count.reshape(leaf.shape) > m) | ~(alternatives == leaf).any(0)
    choices.put(leaf, alternatives, choices.fresh(leaf.shape), lost)


def follow(bounds, inst, value, operands) -> None:
    """What `inst` makes of its marked operands (module docstring): marks on its integer results, bounds widened or
    made infinite on its float results. `bounds`: the ErrorBounds observing the run."""
    choices = bounds.choices
    if inst.opcode in _OBSERVED_INSIDE:  # (a branch or trip count rounding decides: followed as the shadow's)
        return
    leaves = _leaves(value)
    indexed = _INDEXED.get(inst.opcode)
    marked_indices = indexed is not None and any(choices.of(o) is not None for o in operands[indexed])
    data = range(len(operands)) if indexed is None else set(range(len(operands))) - set(range(len(operands))[indexed])
    marked_data = any(choices.of(operands[k]) is not None for k in data)
    for leaf in leaves:
        if not isinstance(leaf, (np.ndarray, np.generic)) or choices.of(leaf) is not None:
            continue
        if float_leaf(leaf):
            if inst.opcode == "select" and not any(choices.of(o) is not None for o in operands[1:]):
                continue  # (its pred's varying elements are rounding-decided: the select rule took either branch)
            if inst.opcode in GATHERS and marked_indices and not marked_data:
                _gathered(bounds, inst, leaf, operands, indexed)
            else:
                _unfollowed(bounds, inst, leaf, operands)
            continue
        if len(leaves) != 1 or marked_indices:
            alternatives, origin, lost = None, None, np.ones(leaf.shape, bool)
        elif inst.opcode in opcodes.ELEMENTWISE:
            alternatives, origin, lost = _elementwise(bounds, inst, leaf, operands)
        elif inst.opcode in MOVING:
            alternatives, origin, lost = _moved(bounds, inst, operands)
        elif inst.opcode == "reduce" and len(operands) == 2 and choices.of(operands[1]) is None:
            alternatives, origin, lost = None, None, _reduced_varying(inst, choices.of(operands[0]), leaf.shape)
        else:
            alternatives, origin, lost = None, None, np.ones(leaf.shape, bool)
        if alternatives is None:  # (nothing followed: the value itself, lost where marked)
            alternatives, origin = np.asarray(leaf)[None], np.full(leaf.shape, -1, np.int64)
        choices.put(leaf, alternatives, origin, lost)
        if leaf.dtype == bool and (entry := choices.of(leaf)) is not None:  # (a select on it may take either branch)
            decided = entry[2] | entry[3]
            old = bounds._decided_or_none(leaf)
            bounds._put(leaf, None, decided if old is None else decided | old)


def _per_alternative(kernel, operands, entries) -> np.ndarray:
    """The kernel on alternative k of the marked operands (the others as they are), stacked over k."""
    each = _alternatives(kernel, operands, entries)
    first = np.asarray(next(each))
    made = np.empty((_count(entries), *first.shape), first.dtype)
    made[0] = first
    for k, value in enumerate(each, start=1):
        made[k] = value
    return made


def _alternatives(kernel, operands, entries):
    """The kernel on alternative k of the marked operands (the others as they are), for each k in turn."""
    for k in range(_count(entries)):
        yield kernel(*[o if e is None else e[0][min(k, len(e[0]) - 1)] for o, e in zip(operands, entries)])


def _count(entries) -> int:
    return max(len(e[0]) for e in entries if e is not None)


def _elementwise(bounds, inst, leaf, operands) -> tuple:
    entries = [bounds.choices.of(o) for o in operands]
    shape = leaf.shape
    seen = np.zeros(shape, bool)
    origin = np.full(shape, -1, np.int64)
    lost = np.zeros(shape, bool)
    for e in entries:
        if e is None:
            continue
        o, gone, varying = (np.broadcast_to(a, shape) for a in e[1:])
        lost |= gone | (varying & seen & (o != origin))  # (two choices at once: not followed)
        origin = np.where(varying & ~seen, o, origin)
        seen |= varying
    return _per_alternative(bounds._kernel(inst), operands, entries), origin, lost


def _moved(bounds, inst, operands) -> tuple:
    """A moving op's alternatives, origins and lost marks: its kernel on each (its index operands as they are)."""
    kernel = bounds._kernel(inst)
    entries = [bounds.choices.of(o) for o in operands]
    indexed = _INDEXED.get(inst.opcode, slice(0, 0))
    data = [k not in range(len(operands))[indexed] for k in range(len(operands))]

    def substituted(pick):
        return np.asarray(kernel(*[pick(o, e) if d else o for o, e, d in zip(operands, entries, data)]))

    origin = substituted(lambda o, e: np.full(np.shape(o), -1, np.int64) if e is None else e[1])
    lost = substituted(lambda o, e: np.zeros(np.shape(o), bool) if e is None else e[2])
    return _per_alternative(kernel, operands, entries), origin, lost


def _reduced_varying(inst, entry, shape) -> np.ndarray:
    """A reduce's lost elements: those with a varying or lost term."""
    dims = tuple(int(d) for d in inst.attr("dimensions", ()))
    return np.asarray(np.any(entry[2] | entry[3], axis=dims)).reshape(shape)


def _gathered(bounds, inst, x, operands, indexed) -> None:
    """A float gather's or dynamic-slice's bound where its indices vary: the farthest of the intervals of the
    operand's elements the alternatives pick (module docstring); infinite where they are not followed."""
    entries = [None] * len(operands)
    for k in range(len(operands))[indexed]:
        entries[k] = bounds.choices.of(operands[k])
    if any(e is not None and e[2].any() for e in entries) or not _one_choice(inst, entries):
        _unfollowed(bounds, inst, x, operands)
        return
    kernel, x64 = bounds._kernel(inst), np.asarray(x, np.float64)
    # the samples swap too (else the calibration of what is made from x cuts its bound to the moved samples', which
    # see no swap: 1e5x short where every element may swap): each a random alternative, the first the farthest
    pick = bounds.rng.integers(0, _count(entries), (SAMPLES, *np.shape(x)))
    widest, samples = np.zeros(np.shape(x)), np.zeros((SAMPLES, *np.shape(x)), np.float32)
    spreads = _alternatives(kernel, [bounds.of(operands[0]), *operands[1:]], entries)
    for k, (picked, spread) in enumerate(zip(_alternatives(kernel, operands, entries), spreads)):
        swap = picked - x64
        reach = np.abs(swap) + spread
        farther = ~(reach <= widest)  # (NaN: farther)
        widest = np.where(farther, reach, widest)
        samples[0] = np.where(farther, swap, samples[0])
        samples[1:] = np.where(pick[1:] == k, swap, samples[1:])
    bound = np.maximum(bounds.of(x), np.where(np.isnan(widest), np.inf, widest))
    if (moved := bounds._samples_or_none(x)) is not None:
        samples += moved
    bounds._put(x, bound, bounds._decided_or_none(x), samples)


def _one_choice(inst, entries) -> bool:
    """Whether each gathered element's index components vary by one choice at most (alternative k of each taken
    together is then one of the index vectors the exact run may use)."""
    marked = [e for e in entries if e is not None]
    if inst.opcode == "dynamic-slice":  # (scalar starts)
        return len({int(e[1]) for e in marked if e[3].any()}) <= 1
    ((_, origin, _, varying),) = marked
    axis = int(inst.attr("index_vector_dim", np.ndim(origin)))
    if axis == np.ndim(origin):
        return True
    high = np.max(np.where(varying, origin, -1), axis=axis)
    low = np.min(np.where(varying, origin, np.iinfo(np.int64).max), axis=axis)
    return bool(np.all((high == -1) | (high == low)))


def _unfollowed(bounds, inst, x, operands) -> None:
    """`x`'s elements made from varying or lost marked operands (all of them but an elementwise op's own): an
    infinite bound, NaN samples (nothing after them calibrated), `inst` named in `unbounded`."""
    where = np.ones(x.shape, bool)
    if inst.opcode in opcodes.ELEMENTWISE:
        where = np.zeros(x.shape, bool)
        for o in operands:
            if (e := bounds.choices.of(o)) is not None:
                where |= np.broadcast_to(e[2] | e[3], x.shape)
    if not where.any():
        return
    bounds.unbounded.setdefault(inst.name, f"{inst.opcode} by an integer rounding decides, not followed")
    bound = np.where(where, np.inf, bounds.of(x))
    samples = bounds._samples_or_none(x)
    if samples is not None:
        samples = np.full(samples.shape, np.nan, np.float32)
    bounds._put(x, bound, bounds._decided_or_none(x), samples)
