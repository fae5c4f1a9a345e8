"""A dot's error shared by all its terms (tools/bounds.py): computed from its operand's sums, without a dot."""

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
