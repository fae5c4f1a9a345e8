"""The error bounds of ops that select and order their operand's elements (tools/bounds.py): sort, XLA's TopK
custom-call, cub's radix sort (XLA-GPU's sort) and the payloads sorted with their keys.

- sorted keys (TopK's values, a radix sort's keys): every order statistic is nondecreasing in every element, so
  with the exact operand within [a - e, a + e] the exact j-th key lies between the j-th keys of a - e and a + e:
  the op's own kernel at its operand's interval ends bounds it (exact, as an elementwise op's `_moved_by`);
- a payload sorted by its keys (a radix sort's values) is not 1-Lipschitz in the keys' errors: an error that
  swaps two keys lands another payload element there. In the output's order, the keys split into clusters
  where no key's interval reaches past the cluster's edge (the keys below all lie below the keys above, whatever
  their errors): the exact permutation keeps each cluster's elements within it. A key alone in its cluster has its
  rank decided, so its payload's bound is the payload's own (moved); in a larger cluster the payload may be any
  of the cluster's: its bound reaches the farthest of their intervals;
- an HLO sort whose comparator orders by keys (ops/indexing.sort_keys: a LT/GT compare of an elementwise function
  of one operand, jax's NaN/-0 canonicalizing TOTALORDER compare among them, or such compares combined
  lexicographically, jax's argsort's value-then-index): its first key as a radix sort's keys, by its interval
  ends, and every other float result (payloads, later keys) as a payload by the first key's clusters (keys
  within rounding of each other may swap, exact ties too where the sort need not be stable). Both need the first
  key's function to order the values strictly (checked on its values and interval ends: NaN/-0 canonicalizing,
  negation pass; floor(x) fails). Exact keys in a stable sort make the exact order: every result keeps its
  operand's bound, moved. Any other comparator: no rule (the old one, the operands' largest bound, passed a
  payload's swap beyond it and flagged a correct one where keys within rounding swapped);
- a variadic reduce that selects (an argmax / argmin: the reducer keeps, for each float result, one of its two
  values, chosen by comparisons of those two values alone, the exact ones such as indices aside): the row's max
  or min as its reducer orders, by the reduce at its operand's interval ends; where the value does not lie
  between them (a selection that is not monotone), no rule.
Their integer results that rounding decides (an HLO or radix sort's indices where its keys' clusters hold several
keys, an argmax's where other keys reach the extreme's interval, a top-k's where other keys reach the j-th
value's) are marked with the values they may take (tools/bound_indices.py: what a gather by them picks).
Their samples are the op's kernel on the perturbed operands (the samples re-sort), a payload's plus a swap within
its cluster (`_swaps`: the re-sort rarely swaps what rounding may swap, and the calibration of what is made from
the payload cut its bounds to samples that saw none); their own bounds are not calibrated by them (their rules
are tight already)."""

from __future__ import annotations

import numpy as np

from ..ops.common import ints
from ..ops.custom_call.registry import backend_config, field, target_of
from ..ops.indexing import sort_keys, sort_permutation
from .bound_indices import CHOICE_ELEMENTS, from_clusters, from_reach, from_selection
from .bound_samples import SAMPLES
from .bound_store import float_leaf as _float

TOP_K_TARGETS = frozenset({"TopK", "__gpu$TopK"})
RADIX_SORT_TARGETS = frozenset({"__cub$DeviceRadixSort", "__cub$DeviceRadixSortUnassignedScratchSize"})
# the targets bounded by their interval ends and clusters: bounds as tight as their rules allow, not calibrated
EXACTLY_BOUNDED = TOP_K_TARGETS | RADIX_SORT_TARGETS


def selects(inst) -> bool:
    """Whether `inst` selects and orders its operands' elements: a sort, a top-k or radix sort custom-call (their
    bounds are not calibrated: module docstring)."""
    return inst.opcode == "sort" or (inst.opcode == "custom-call" and target_of(inst) in EXACTLY_BOUNDED)


# the ops a selecting reducer's predicate may combine comparisons with
_LOGIC = frozenset({"and", "or", "not", "xor", "compare", "parameter", "constant"})


def chooses(reducer, k: int, n: int) -> bool:
    """Whether `reducer` (of a reduce of n inputs) makes its k-th result by keeping its k-th accumulator or its k-th
    value, chosen by comparisons among those two and the integer (exact) parameters only."""
    root = reducer.root
    if root.opcode != "tuple" or len(root.operands) != n:
        return False
    out = root.operands[k]
    mine = {k, k + n}
    branches = out.operands[1:] if out.opcode == "select" else out.operands
    if out.opcode not in ("select", "maximum", "minimum") or {_param(b) for b in branches} != mine:
        return False
    seen, todo = set(), list(out.operands[:1]) if out.opcode == "select" else []
    while todo:
        inst = todo.pop()
        if id(inst) in seen:
            continue
        seen.add(id(inst))
        if inst.opcode not in _LOGIC or (inst.opcode == "compare" and any(_param(o) is None for o in inst.operands)):
            return False
        if inst.opcode == "parameter" and inst.shape.element_type.kind == "float" and _param(inst) not in mine:
            return False
        todo.extend(inst.operands)
    return True


def _param(inst) -> int | None:
    return inst.parameter_number if inst.opcode == "parameter" else None


def selecting_reduce(bounds, inst, value, operands) -> bool:
    """Puts the bounds of a selecting variadic reduce's float results (module docstring) into `bounds`; False
    (nothing done) where it is not one or a selection is not monotone."""
    n = len(operands) // 2
    reducer = inst.called.get("to_apply")
    leaves = list(value) if isinstance(value, tuple) else [value]
    floats = [k for k in range(n) if _float(leaves[k])]
    if reducer is None or n < 2 or not all(chooses(reducer, k, n) for k in floats):
        return False
    kernel = bounds._kernel(inst)
    moved, ends_of = {}, {}
    for k in floats:
        ends = []
        for sign in (1, -1):
            args = list(operands)
            args[k], args[k + n] = (operands[j] + sign * bounds.of(operands[j]) for j in (k, k + n))
            ends.append(kernel(*args)[k])
        high, low = ends  # (a max or min is nondecreasing in every value: checked)
        if not np.all((low <= leaves[k]) & (leaves[k] <= high) | np.isnan(leaves[k])):
            return False
        moved[k] = np.maximum(high - leaves[k], leaves[k] - low)
        ends_of[k] = (low, high)
    for k, bound in moved.items():
        bounds._put(leaves[k], np.where(np.isnan(bound), np.inf, bound))
    if len(floats) == 1:  # (an argmax's, argmin's index: rounding decides it where keys near the extreme may swap)
        key = floats[0]
        dims = tuple(int(d) for d in inst.attr("dimensions", ()))
        for k in range(n):
            if k != key and isinstance(leaves[k], (np.ndarray, np.generic)):
                from_selection(
                    bounds.choices, leaves[k], operands[k], operands[key], bounds.of(operands[key]), *ends_of[key], dims
                )
    return True


def sorted_bounds(bounds, inst, value, operands) -> list | None:
    """Puts the bounds of `value`'s float leaves (`inst` one that `selects`) into `bounds` (an ErrorBounds); None
    (nothing done) where an HLO sort's comparator is not one its rule knows (module docstring). Returns the payloads'
    swaps (leaf, `_swaps`' samples) for `swapped_samples`, once `bounds` sampled the op."""
    leaves = list(value) if isinstance(value, tuple) else [value]
    if inst.opcode == "sort":
        return _hlo_sort(bounds, inst, leaves, operands)
    kernel = bounds._kernel(inst)
    keys, payloads = operands[0], operands[1:]
    e = bounds.of(keys)
    if _float(keys):
        ends = [kernel(keys + e, *payloads)[0], kernel(keys - e, *payloads)[0]]
        bounds._put(leaves[0], _between(leaves[0], *ends))
        if target_of(inst) in TOP_K_TARGETS and len(leaves) == 2 and isinstance(leaves[1], np.ndarray):
            _top_k_indices(bounds, leaves[1], keys, e, *ends)
    descending = bool(field(backend_config(inst), "descending", False))
    swaps = []
    for k, payload in enumerate(payloads, start=1):
        if _float(payload):
            rode = kernel(keys, e, bounds.of(payload))  # (the keys' and the payload's bounds, moved as it was)
            if not rode[1].any():  # (exact keys: the order is the exact one, ties kept by index: cub is stable)
                bounds._put(leaves[k], rode[2])
                continue
            bound, swap = _payload_bound(leaves[0], rode[1], leaves[k], rode[2], descending, bounds.rng)
            bounds._put(leaves[k], bound)
            swaps += [] if swap is None else [(leaves[k], swap)]
        elif isinstance(leaves[k], np.ndarray) and _float(keys) and leaves[k].ndim:  # (indices: argsort on XLA-GPU)
            moved = np.asarray(kernel(keys, e)[1], np.float64)  # (the keys' bounds, moved as they were)
            if moved.any():  # (exact keys: the exact order, cub is stable)
                sorted_keys = np.asarray(leaves[0], np.float64)
                from_clusters(bounds.choices, leaves[k], leaves[k].ndim - 1, *clusters(sorted_keys, moved, descending))
    return swaps


def swapped_samples(bounds, swaps) -> None:
    """Adds a sort's payloads' `swaps` (sorted_bounds') to the samples bounds gave them (the sort of the perturbed
    operands, which rarely swaps what rounding may swap)."""
    for leaf, swap in swaps or ():
        if (moved := bounds._samples_or_none(leaf)) is not None:
            swap += moved
        bounds._put(leaf, bounds.of(leaf), bounds._decided_or_none(leaf), swap)


def _top_k_indices(bounds, indices, keys, e, high, low) -> None:
    """Marks a top-k's `indices` (along the last dim): the j-th may be any position whose key's interval reaches
    the j-th value's (between the j-th of the keys' interval ends, `high` and `low`): a device's j-th key is its
    j-th value and within its own interval. At most CHOICE_ELEMENTS (positions x outputs) a call; else lost."""
    if indices.size * np.shape(keys)[-1] > CHOICE_ELEMENTS:
        bounds.choices.put(indices, indices[None], np.full(indices.shape, -1, np.int64), np.ones(indices.shape, bool))
        return
    a, e = (np.asarray(x, np.float64)[..., None, :] for x in (keys, e))
    reach = (a - e <= np.asarray(high, np.float64)[..., None]) & (a + e >= np.asarray(low, np.float64)[..., None])
    positions = np.arange(np.shape(keys)[-1], dtype=indices.dtype)
    from_reach(bounds.choices, indices, positions, reach)


def _hlo_sort(bounds, inst, leaves, operands) -> list | None:
    """An HLO sort's bounds (module docstring) and its payloads' swaps (`sorted_bounds`): None where its comparator
    is not a lexicographic LT/GT of keys (`sort_keys`) or its first key does not order the operand's values (nor
    exact keys a stable sort's)."""
    comparator = inst.called.get("to_apply")
    keys = sort_keys(comparator.root) if comparator is not None else None
    if keys is None:
        return None
    dims = ints(inst.attr("dimensions"))
    axis = dims[0] if dims else 0
    permutation = sort_permutation(comparator, bounds.plans.context)
    order = permutation(operands, axis)
    errors = [bounds.of(o) if _float(o) else np.zeros(np.shape(o)) for o in operands]
    moved = [np.take_along_axis(np.asarray(e), order, axis) for e in errors]
    if inst.attr("is_stable", False) and not any(errors[key.operand].any() for key in keys):
        for leaf, bound in zip(leaves, moved):  # (exact keys: the exact order, ties kept by index)
            if _float(leaf):
                bounds._put(leaf, bound)
        return []
    first = keys[0].operand
    descending = _direction(permutation, operands, first, errors[first], axis)
    if descending is None:
        return None
    if _float(operands[first]):
        ends = []
        for sign in (1, -1):
            args = list(operands)
            args[first] = operands[first] + sign * errors[first]
            ends.append(np.take_along_axis(args[first], permutation(args, axis), axis))
        bounds._put(leaves[first], _between(leaves[first], *ends))
    key, key_bounds = (np.moveaxis(np.asarray(x, np.float64), axis, -1) for x in (leaves[first], moved[first]))
    if key.size and not all(_float(leaf) for leaf in leaves):  # (integer results: argsort's indices)
        starts, lengths = clusters(key, key_bounds, descending)
        for leaf in leaves:
            if not _float(leaf) and isinstance(leaf, np.ndarray):
                from_clusters(bounds.choices, leaf, axis, starts, lengths)
    swaps = []
    for k, (leaf, bound) in enumerate(zip(leaves, moved)):
        if k != first and _float(leaf):
            bound, swap = _payload_bound(
                key, key_bounds, np.moveaxis(leaf, axis, -1), np.moveaxis(bound, axis, -1), descending, bounds.rng
            )
            bounds._put(leaf, np.moveaxis(bound, -1, axis))
            swaps += [] if swap is None else [(leaf, np.moveaxis(swap, -1, axis + 1))]
    return swaps


def _direction(permutation, operands, first, error, axis: int) -> bool | None:
    """Whether a sort (its `permutation`) orders operand `first`'s values descending (True) or ascending (False),
    strictly, where the other keys tie: checked on every distinct value of its elements and their interval ends, in
    both orders (a tie in the key's expression keeps the given order: floor(x) fails); None where it does not."""
    key = np.asarray(operands[first])
    if key.ndim == 0:
        return None
    points = key.ravel()
    if key.dtype.kind == "f":
        points = np.concatenate([points, (key - error).ravel(), (key + error).ravel()])
        points = points[~np.isnan(points)]
    points = np.unique(points)
    shape = [1] * key.ndim
    shape[axis] = points.size
    seen = []
    for given in (points, points[::-1]):
        args = [np.zeros(shape, np.asarray(o).dtype) for o in operands]
        args[first] = given.reshape(shape)
        seen.append(given[permutation(args, axis).ravel()])
    for descending, expected in ((False, points), (True, points[::-1])):
        if all(np.array_equal(s, expected) for s in seen):
            return descending
    return None


def _between(value, high, low) -> np.ndarray:
    """The bound of sorted keys `value` whose exact values lie between the same sort of their interval ends."""
    bound = np.maximum(np.abs(high - value), np.abs(value - low))
    return np.where(np.isnan(bound), np.inf, bound)


def _payload_bound(keys, key_bounds, payload, payload_bounds, descending: bool, rng) -> tuple:
    """The bound of a payload sorted by `keys` along the last dim (all four in the output's order): its own bound
    where its key's rank is decided, else the farthest of its cluster's payload intervals (module docstring); and
    its samples' swaps within the clusters (`_swaps`; None where every key's rank is decided)."""
    if keys.size == 0:
        return payload_bounds, None
    starts, lengths = clusters(keys, key_bounds, descending)
    top = np.repeat(np.maximum.reduceat((payload + payload_bounds).reshape(-1), starts), lengths)
    bottom = np.repeat(np.minimum.reduceat((payload - payload_bounds).reshape(-1), starts), lengths)
    bound = np.maximum(top.reshape(keys.shape) - payload, payload - bottom.reshape(keys.shape))
    bound = np.where(np.isnan(bound), np.inf, np.maximum(bound, payload_bounds))
    return bound, _swaps(rng, starts, lengths, payload, payload_bounds)


def _swaps(rng, starts, lengths, payload, payload_bounds) -> np.ndarray | None:
    """SAMPLES deviations of a payload whose keys' `clusters` may swap (along the last dim, in the output's order):
    each element takes another payload of its cluster, the first sample the one its bound reaches (the farthest
    interval), the others a random one. The sort of the perturbed keys rarely swaps them, so the calibration of
    what is made from the payload cut its bounds to samples that see no swap: a LayerNorm of a payload sorted by
    bf16 keys with near-ties flagged XLA:CPU's result ~10x past its bound, a softmax's 4e7x."""
    if lengths.max() < 2:
        return None
    p, e = np.reshape(payload, -1).astype(np.float64), np.reshape(payload_bounds, -1)
    cluster = np.repeat(np.arange(len(starts)), lengths)
    last = starts + lengths - 1
    highest = np.repeat(np.lexsort((p + e, cluster))[last], lengths)  # (the cluster's highest reach: NaN last)
    lowest = np.repeat(np.lexsort((e - p, cluster))[last], lengths)
    up = p[highest] + e[highest] - p >= p - (p[lowest] - e[lowest])
    swap = np.empty((SAMPLES, p.size), np.float32)
    swap[0] = np.where(up, p[highest], p[lowest]) - p
    picks = np.repeat(starts, lengths) + (rng.random((SAMPLES - 1, p.size)) * np.repeat(lengths, lengths)).astype(int)
    swap[1:] = p[picks] - p
    return swap.reshape(SAMPLES, *np.shape(payload))


def clusters(keys, key_bounds, descending: bool) -> tuple:
    """The clusters of sorted `keys` (along the last dim, in the output's order) no key's interval reaches past:
    their starts and lengths over the flattened elements (module docstring)."""
    lo, hi = keys - key_bounds, keys + key_bounds
    if descending:  # (mirrored: ascending)
        lo, hi = -hi, -lo
    below = np.maximum.accumulate(hi, axis=-1)[..., :-1]  # the highest reach of the keys before each position
    above = np.flip(np.minimum.accumulate(np.flip(lo, -1), axis=-1), -1)[..., 1:]  # the lowest from it on
    edge = np.ones(keys.shape, bool)  # a cluster starts here (every row's first element)
    edge[..., 1:] = below < above
    starts = np.flatnonzero(edge.reshape(-1))
    return starts, np.diff(np.append(starts, edge.size))
