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
- an HLO sort: its operands' largest bound, for every float result (its comparator may order by anything);
- a variadic reduce that selects (an argmax / argmin: the reducer keeps, for each float result, one of its two
  values, chosen by comparisons of those two values alone, the exact ones such as indices aside): the row's max
  or min as its reducer orders, by the reduce at its operand's interval ends; where the value does not lie
  between them (a selection that is not monotone), no rule.
Their samples are the op's kernel on the perturbed operands (the samples re-sort); the custom-calls' bounds are
not calibrated by them (their rules are tight already; a payload's: the samples rarely swap what rounding may
swap)."""

from __future__ import annotations

import numpy as np

from ..ops.custom_call.registry import backend_config, field, target_of
from .bound_store import float_leaf as _float

TOP_K_TARGETS = frozenset({"TopK", "__gpu$TopK"})
RADIX_SORT_TARGETS = frozenset({"__cub$DeviceRadixSort", "__cub$DeviceRadixSortUnassignedScratchSize"})
# the targets bounded by their interval ends and clusters: bounds as tight as their rules allow, not calibrated
EXACTLY_BOUNDED = TOP_K_TARGETS | RADIX_SORT_TARGETS


def bounded_exactly(inst) -> bool:
    """Whether `inst` is a top-k or radix sort custom-call (its bounds are not calibrated: module docstring)."""
    return inst.opcode == "custom-call" and target_of(inst) in EXACTLY_BOUNDED


def selects(inst) -> bool:
    """Whether `inst` selects and orders its operands' elements: a sort, a top-k or radix sort custom-call."""
    return inst.opcode == "sort" or bounded_exactly(inst)


# the ops a selecting reducer's predicate may combine comparisons with
_LOGIC = frozenset({"and", "or", "not", "xor", "compare", "parameter", "constant"})


def _chooses(reducer, k: int, n: int) -> bool:
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
    if reducer is None or n < 2 or not all(_chooses(reducer, k, n) for k in floats):
        return False
    kernel = bounds._kernel(inst)
    moved = {}
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
    for k, bound in moved.items():
        bounds._put(leaves[k], np.where(np.isnan(bound), np.inf, bound))
    return True


def sorted_bounds(bounds, inst, value, operands) -> None:
    """Puts the bounds of `value`'s float leaves (`inst` one that `selects`) into `bounds` (an ErrorBounds)."""
    leaves = list(value) if isinstance(value, tuple) else [value]
    if inst.opcode == "sort":
        worst = max((float(np.max(bounds.of(o), initial=0.0)) for o in operands if _float(o)), default=0.0)
        for v in leaves:
            if _float(v):
                bounds._put(v, np.full(v.shape, worst))
        return
    kernel = bounds._kernel(inst)
    keys, payloads = operands[0], operands[1:]
    e = bounds.of(keys)
    ends = [kernel(keys + e, *payloads)[0], kernel(keys - e, *payloads)[0]] if _float(keys) else []
    if ends:
        moved = np.maximum(np.abs(ends[0] - leaves[0]), np.abs(leaves[0] - ends[1]))
        bounds._put(leaves[0], np.where(np.isnan(moved), np.inf, moved))
    for k, payload in enumerate(payloads, start=1):
        if _float(payload):
            rode = kernel(keys, e, bounds.of(payload))  # (the keys' and the payload's bounds, moved as it was)
            descending = bool(field(backend_config(inst), "descending", False))
            bounds._put(leaves[k], _payload_bound(leaves[0], rode[1], leaves[k], rode[2], descending))


def _payload_bound(keys, key_bounds, payload, payload_bounds, descending: bool) -> np.ndarray:
    """The bound of a payload sorted by `keys` along the last dim (all four in the output's order): its own bound
    where its key's rank is decided, else the farthest of its cluster's payload intervals (module docstring)."""
    if not key_bounds.any() or keys.size == 0:  # (exact keys: the order is the exact one, ties kept by index)
        return payload_bounds
    lo, hi = keys - key_bounds, keys + key_bounds
    if descending:  # (mirrored: ascending)
        lo, hi = -hi, -lo
    below = np.maximum.accumulate(hi, axis=-1)[..., :-1]  # the highest reach of the keys before each position
    above = np.flip(np.minimum.accumulate(np.flip(lo, -1), axis=-1), -1)[..., 1:]  # the lowest from it on
    edge = np.ones(keys.shape, bool)  # a cluster starts here (every row's first element)
    edge[..., 1:] = below < above
    starts = np.flatnonzero(edge.reshape(-1))
    lengths = np.diff(np.append(starts, edge.size))
    top = np.repeat(np.maximum.reduceat((payload + payload_bounds).reshape(-1), starts), lengths)
    bottom = np.repeat(np.minimum.reduceat((payload - payload_bounds).reshape(-1), starts), lengths)
    bound = np.maximum(top.reshape(keys.shape) - payload, payload - bottom.reshape(keys.shape))
    return np.where(np.isnan(bound), np.inf, np.maximum(bound, payload_bounds))
