"""The sampled runs that calibrate the error bounds (tools/bounds.py): SAMPLES perturbed runs carried along the
shadow (each instruction's kernel on its operands moved by the samples' deviations, plus a draw of its own error),
the shortcuts for ops whose deviations follow from their operands', the elements whose roundings are one error
(drawn once), and the calibration of a bound by its samples, per block of CALIBRATION_BLOCK consecutive elements."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .compare import ulp_at

SIGMAS = 4.0  # a bound (tools/bounds.py) is this many standard deviations of an element's error
SAMPLES = 4  # perturbed runs carried along (ErrorBounds._sample)
CALIBRATED_FROM = 64  # a bound is calibrated by its samples where this many elements show them
SAMPLE_MARGIN = 2.0  # ... to this multiple of the largest ratio its samples show
CALIBRATION_BLOCK = 256  # ... per block of this many consecutive elements
NOISE_POOL = 1 << 22  # standard normal draws the samples' own errors are taken from
# elementwise ops linear in their operands: what they do to the operands' deviations (the samples' shortcut)
LINEAR_SAMPLES: dict[str, Callable] = {
    "add": np.add,
    "subtract": np.subtract,
    "negate": np.negative,
    "convert": lambda d: d,
}


def _multiply_deviations(x, a, b, da, db) -> np.ndarray:
    """(a + da)(b + db) - ab, every sample at once in float32: da (b + db) + a db, deviations only (none of the
    f64 products whose difference it is)."""
    a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if da is None and db is None:
        return np.zeros((), np.float32)
    if da is None:
        return a32 * db
    return da * b32 if db is None else da * (b32 + db) + a32 * db


def _divide_deviations(x, a, b, da, db) -> np.ndarray:
    """(a + da) / (b + db) - a / b = (da - x db) / (b + db), every sample at once in float32."""
    b32 = np.asarray(b, np.float32)
    if db is None:
        return np.zeros((), np.float32) if da is None else da / b32
    moved = -np.asarray(x, np.float32) * db
    if da is not None:
        moved += da
    return moved / (b32 + db)


# elementwise ops whose samples' deviations follow from the operands' (see the functions' identities)
BILINEAR_SAMPLES: dict[str, Callable] = {"multiply": _multiply_deviations, "divide": _divide_deviations}


def _per_block(flat: np.ndarray, reduce) -> np.ndarray:
    """`reduce` (a method's name: "max", "sum") of `flat` per block of CALIBRATION_BLOCK consecutive elements (the
    last one shorter when the size is not a multiple): the whole blocks as a view, no padded copy."""
    whole = flat.size // CALIBRATION_BLOCK * CALIBRATION_BLOCK
    blocks = getattr(flat[:whole].reshape(-1, CALIBRATION_BLOCK), reduce)(axis=1)
    return np.append(blocks, getattr(flat[whole:], reduce)()) if whole < flat.size else blocks


def _per_element(per_block: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A value per block of CALIBRATION_BLOCK consecutive elements, repeated to `like`'s shape."""
    return np.repeat(per_block, CALIBRATION_BLOCK)[: np.size(like)].reshape(np.shape(like))


def calibrate(bound, deviations, ceiling=None):
    """`bound` divided by how loose it is, per block of CALIBRATION_BLOCK consecutive elements (a row, a
    few): the largest ratio of SIGMAS x the samples' RMS to the bound there, times SAMPLE_MARGIN (the
    samples' RMS of one element can be a third of its sigma; the largest over CALIBRATED_FROM elements
    cannot, unless few elements are tight); kept in blocks where fewer than CALIBRATED_FROM elements have a
    bound or no sample moved, and everywhere when a sample is not finite. With a `ceiling` (a sum's: a
    function giving the terms' bounds added, its own error added): where the block's RMS ratio exceeds 1 the bound is multiplied
    by it, up to the ceiling: a sum's error is near Gaussian, so the block's samples (SAMPLES x
    CALIBRATION_BLOCK draws) measure its sigma within a few percent, and a rule's bound short of SIGMAS of it
    missed something (terms bounded by their largest error, or sharing one: the samples keep the signs); a
    sum of few terms is not Gaussian, but cannot exceed its ceiling (a one-term sum: its term's bound)."""
    if bound is None:
        return None
    # compared squared (sum of the samples' squares / bound^2; one square root per block), blocks read as a
    # (blocks, CALIBRATION_BLOCK) view of the whole ones plus the tail: no padded copies
    squares = np.einsum("k...,k...->...", deviations, deviations).reshape(-1)
    flat = np.reshape(bound, -1)
    seen = (flat > 0) & (flat < np.inf)
    finite = np.isfinite(squares)
    if not finite.all():
        if np.any(~finite & (flat < np.inf)):
            return bound
        seen &= finite
    if np.count_nonzero(seen) < CALIBRATED_FROM:
        return bound
    ratio = np.divide(squares, np.square(flat, dtype=np.float64), where=seen, out=np.zeros(flat.shape))
    largest, counted = _per_block(ratio, "max"), _per_block(seen, "sum")
    # (a block whose samples never moved says nothing: a max whose winner is exact in every sample)
    spread = SIGMAS / np.sqrt(len(deviations))  # SIGMAS x the samples' RMS, per sum of squares' root
    enough = counted >= CALIBRATED_FROM
    factor = np.minimum(1.0, SAMPLE_MARGIN * spread * np.sqrt(largest))
    factor = np.where(enough & (largest > 0), factor, 1.0).astype(flat.dtype)
    calibrated = bound if np.all(factor == 1) else _per_element(factor, bound) * bound
    if ceiling is None:
        return calibrated
    # the block's root mean square of SIGMAS x the samples' RMS over the bound
    short = np.where(enough, spread * np.sqrt(_per_block(ratio, "sum") / np.maximum(counted, 1)), 1.0)
    if not np.any(short > 1):
        return calibrated
    return np.maximum(calibrated, np.minimum(bound * _per_element(short, bound), ceiling()))


def shared_rounding(inst, orig, x, operands) -> np.ndarray | None:
    """An add or subtract of a broadcast value b (a bias, a row's mean, an epsilon) rounds b's low bits away:
    where the other operand v is on a grid at least as coarse as the result's (its ulp in its type at least
    the result's ulp U), fl(v + b) - (v + b) = fl_U(b) - b, the same error for every element made from one
    element of b in one binade of the result (measured: an f16 LayerNorm's bias add, 287 elements of a column
    of 1,024 off by -0.488 ulp each; the column's sum, db, 2.1x its bound). Returns a group number per element
    (-1: its rounding is its own), or None where no element shares one."""
    if inst.opcode not in ("add", "subtract") or np.size(x) < 2 or len(operands) != 2:
        return None
    spread = [k for k, o in enumerate(inst.operands) if o.opcode == "broadcast"]
    if len(spread) != 1 or orig is None or orig.shape.element_type.numpy is None:
        return None
    k = spread[0]
    other_type = orig.operands[1 - k].shape.element_type.numpy
    if other_type is None:
        return None
    dims = tuple(inst.operands[k].attr("dimensions", ()))
    kept = [x.shape[d] for d in dims]
    count = int(np.prod(kept, dtype=np.int64))
    if count == x.size:
        return None  # (a broadcast that adds no dimension: nothing repeats)
    # the broadcast operand's element behind each element of x
    source = np.arange(count).reshape(kept).transpose(np.argsort(dims))
    source = source.reshape([x.shape[d] if d in dims else 1 for d in range(x.ndim)])
    ulp = ulp_at(x, orig.shape.element_type.numpy)
    binade = np.frexp(ulp)[1]
    binade -= binade.min()
    coarse = ulp_at(operands[1 - k], other_type) >= ulp
    if not coarse.any():
        return None
    groups = np.where(coarse, binade * count + source, -1)
    if (int(binade.max()) + 1) * count > x.size:  # numbered densely (never more draws than elements)
        _, dense = np.unique(groups, return_inverse=True)
        groups = np.where(coarse, dense.reshape(x.shape) - int(not coarse.all()), -1)
    return groups
