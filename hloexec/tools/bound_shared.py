"""What the sum and dot rules of tools/bounds.py share: the error all terms may share (a dot's computed from its
operand's sums, without a dot) and the partial sums of XLA:CPU's tree order."""

from __future__ import annotations

import numpy as np


def times_least(inst, values: np.ndarray, bound: np.ndarray, side: str) -> np.ndarray:
    """|dot(values, least)| (`values`: the dot's `side` ("lhs" / "rhs") operand; least: the other operand's
    `bound` at its smallest along the contraction, broadcast back), without the dot: every term shares that
    least, so the dot is `values` summed along the contraction times it, an outer product per batch (in the dot's
    output order: batch, lhs free, rhs free)."""
    other = "rhs" if side == "lhs" else "lhs"
    labels: dict[str, list] = {}  # einsum's: the i-th batch dim of either side is i; free dims count on from there
    free = iter(range(len(inst.attr("lhs_batch_dims", ())), 52))
    for name, rank in ((side, values.ndim), (other, bound.ndim)):
        batch, contracting = list(inst.attr(f"{name}_batch_dims", ())), inst.attr(f"{name}_contracting_dims", ())
        labels[name] = [batch.index(d) if d in batch else next(free) for d in range(rank) if d not in contracting]
    summed = np.sum(values, axis=tuple(inst.attr(f"{side}_contracting_dims", ())))
    contracting = tuple(inst.attr(f"{other}_contracting_dims", ()))
    least = np.min(bound, axis=contracting) if contracting else bound
    batch = list(range(len(inst.attr("lhs_batch_dims", ()))))
    out = batch + [k for k in labels["lhs"] if k not in batch] + [k for k in labels["rhs"] if k not in batch]
    return np.abs(np.einsum(summed, labels[side], least, labels[other], out))


def least_along(bound: np.ndarray, dims) -> np.ndarray:
    """`bound`'s smallest value along `dims`, broadcast back: the most an error every term there shares can be."""
    return np.broadcast_to(np.min(bound, axis=tuple(dims), keepdims=True), bound.shape) if dims else bound


def tree_order_steps(a: np.ndarray, dims: tuple, width: int) -> np.ndarray | None:
    """sum_k s_k^2 over the partial sums s_k of `a`'s sum over `dims` in the order XLA's TreeReductionRewriter
    gives it (xla/hlo/transforms/simplifiers/tree_reduction_rewriter.cc): a reduce-window of min(n, width) along
    each reduced dim (stride the window, padding "same": the low side the smaller half), each window summed in
    row-major order, then a reduce of the windows' sums in row-major order. The partial sums are the exact terms'
    (`a`: the shadow's), so the sum's rounding error has exactly the variance u^2/3 of that (each step's rounding
    independent). None where no reduced dim is longer than `width` (the rewrite leaves the reduce)."""
    if all(a.shape[d] <= width for d in dims):
        return None
    pads, split, outer, inner = [], [], [], []
    for d, n in enumerate(a.shape):
        if d not in dims:
            pads.append((0, 0))
            split.append(n)
            continue
        w = min(n, width)
        padding = -(-n // w) * w - n
        pads.append((padding // 2, padding - padding // 2))
        split += [-(-n // w), w]
        outer.append(len(split) - 2)
        inner.append(len(split) - 1)
    kept = [k for k in range(len(split)) if k not in outer and k not in inner]
    terms = np.transpose(np.pad(a, pads).reshape(split), kept + outer + inner)
    terms = terms.reshape(*terms.shape[: len(kept)], -1, int(np.prod([split[k] for k in inner])))
    in_windows = np.cumsum(terms, axis=-1)
    over_windows = np.cumsum(in_windows[..., -1], axis=-1)
    return np.sum(np.square(in_windows), axis=(-2, -1)) + np.sum(np.square(over_windows), axis=-1)
