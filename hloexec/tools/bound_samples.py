"""The sampled runs that calibrate the error bounds (tools/bounds.py): SAMPLES perturbed runs carried along the
shadow (each instruction's kernel on its operands moved by the samples' deviations, plus a draw of its own error),
a dot's shortcut where its deviations follow from one operand's (the elementwise ops': tools/bound_elementwise.py),
the elements whose roundings are one error
(drawn once), and the calibration of a bound by its samples, per block of CALIBRATION_BLOCK consecutive elements."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ..kernels.bound_products import perturbed_float32
from ..kernels.bound_rules import LONE, block_ratios, participation_ratios, rounding_groups, scale_blocks
from ..ops.contraction import dot_general
from .bound_store import contiguous

SIGMAS = 4.0  # a bound (tools/bounds.py) is this many standard deviations of an element's error; a power of two (the
# compiled passes multiply by its inverse, exactly)
SAMPLES = 4  # perturbed runs carried along (ErrorBounds._sample)
MEASURED_FROM = 64  # a block with this many elements whose samples show is measured as a whole: cut at the margin
# for the draws its tight elements' samples are worth, a sum raised by its samples; fewer (a scalar, a small vector):
# never raised, cut at the margin for their draws less a half and at least small_margin(their count) ...
POOLED_FROM = 8  # ... from this many; fewer: each element by its own four draws' margin, margin(1) (docs/verdicts.md
# "Small values")
SAMPLE_MARGIN = 2.0  # ... to this multiple of the largest ratio its samples show: a lone tight element is cut below
# SIGMAS sigma with probability P(chi2_SAMPLES < SAMPLES / SAMPLE_MARGIN^2), 9.0% here; the same for 3 samples at
# 2.355, for 2 at 3.252 (docs/verdicts.md "Fewer samples": measured, four stay)
CUT_BELOW = 1e-3  # ... or more (margin): where a block's tight elements' samples are few independent draws, it cuts
# their bounds below SIGMAS sigma with at most this probability
INDEPENDENT = 3.5  # participation ratios from this up get SAMPLE_MARGIN (margin's formula: at most 1.94 there)
CALIBRATION_BLOCK = 256  # ... per block of this many consecutive elements
FLUSHED_BELOW = 2.0**-60  # a perturbed operand of a float32 dot of samples: magnitudes below this are 0
_BF16 = np.dtype(ml_dtypes.bfloat16)


def dot_samples(inst, operands, perturbed) -> np.ndarray:
    """A dot's samples' deviations (SAMPLES, *shape) (contiguous, float32) where one operand has samples: the dot is
    linear in it, a sample's deviation is the dot of that operand's deviations with the other operand (none of
    the f64 products whose difference it is), every sample in one product (the samples a leading dim of their
    operand; the result's dims: batch, lhs free, rhs free)."""
    lb, rb, lc, rc = _dims(inst)
    f32 = np.dtype(np.float32)
    if perturbed[0] is not None:
        moved = dot_general(perturbed[0], np.asarray(operands[1], f32), _after(lb), rb, _after(lc), rc, f32)
        at = len(lb)
    else:
        moved = dot_general(np.asarray(operands[0], f32), perturbed[1], lb, _after(rb), lc, _after(rc), f32)
        at = np.ndim(operands[0]) - len(lc)  # batch and lhs free dims come first
    return np.ascontiguousarray(np.moveaxis(moved, at, 0))


def perturbed_product(inst, operands, perturbed) -> np.ndarray:
    """(SAMPLES, *shape) (contiguous, float32): the float32 product (a + da)(b + db) of a dot whose operands both
    have samples (the caller decides float32 suffices, tools/bound_dots.float32_noise), the samples a batch dim
    of both; their deviations float32 or as kept (bfloat16: read by the kernel that builds the perturbed
    operands, no float32 copy first). Less the dot: kernels/bound_products.finish_samples."""
    lb, rb, lc, rc = _dims(inst)
    a, b = (_perturbed_float32(o, p) for o, p in zip(operands, perturbed))
    moved = dot_general(a, b, [0, *_after(lb)], [0, *_after(rb)], _after(lc), _after(rc), np.dtype(np.float32))
    return np.ascontiguousarray(moved)


def _dims(inst) -> list[list[int]]:
    """The dot's lhs and rhs batch dims, then its lhs and rhs contracting dims."""
    return [list(inst.attr(f"{side}_{d}_dims", ())) for d in ("batch", "contracting") for side in ("lhs", "rhs")]


def _after(dims) -> list[int]:
    """An operand's `dims` past a leading samples' dim."""
    return [d + 1 for d in dims]


def _perturbed_float32(value, deviations) -> np.ndarray:
    """(SAMPLES, *shape) float32: `value` moved by each sample's `deviations` (float32 or bfloat16), magnitudes
    below FLUSHED_BELOW 0."""
    out = np.empty(deviations.shape, np.float32)
    flat = np.reshape(deviations, (len(deviations), -1))
    if flat.dtype == _BF16:
        flat = flat.view(np.uint16)  # (its bits: the kernel reads bfloat16 as float32 exactly)
    elif flat.dtype != np.float32:
        flat = flat.astype(np.float32)
    perturbed_float32(np.ravel(value), flat, FLUSHED_BELOW, out.reshape(len(out), -1))
    return out


def calibrate(bound, deviations, ceiling=None, stats=None, in_place: bool = False):
    """`bound` divided by how loose it is, per block of CALIBRATION_BLOCK consecutive elements (a row, a
    few; a smaller value, a scalar: its block): the largest ratio of SIGMAS x the samples' RMS to the bound there,
    times SAMPLE_MARGIN (the samples' RMS of one element can be a third of its sigma; the largest over
    MEASURED_FROM elements cannot, unless few elements are tight) or more (below); kept in blocks where no
    sample moved, and everywhere when a sample is not finite. A block where fewer than MEASURED_FROM elements have a
    bound (a small value) is cut at the margin of its tight elements' draws less a half, and at least at
    `small_margin` of its count of elements whose samples moved: its tightest element is below SIGMAS sigma at most
    at CUT_BELOW where the others are at most LONE x looser, or are by their rule (the lone floors); fewer than
    POOLED_FROM elements: one draw's margin, each element's own four draws below SIGMAS sigma at most at CUT_BELOW
    whatever the others' (docs/verdicts.md "Small values"). With a `ceiling` (a sum's: a function giving the terms'
    bounds added, its own error added): where the block's RMS ratio exceeds 1 (MEASURED_FROM elements or more) the
    bound is multiplied by it, up to the ceiling: a sum's error is near Gaussian, so the block's samples (SAMPLES x
    CALIBRATION_BLOCK draws) measure its sigma within a few percent, and a rule's bound short of SIGMAS of it
    missed something (terms bounded by their largest error, or sharing one: the samples keep the signs); a sum of
    few terms is not Gaussian, but cannot exceed its ceiling (a one-term sum: its term's bound). `stats`:
    block_ratios' result where it was computed already (kernels/bound_rules.elementwise_pass). The margin grows
    where the samples of a block's elements near its largest ratio are few independent draws (`participation`,
    `margin`): where they share one (a broadcast row value's deviation times a factor, the same after any op) or
    one is tight alone, the largest ratio is four draws' measure, below SIGMAS sigma in ~9% of blocks at
    SAMPLE_MARGIN. A block's one or two elements far tighter by their rule than the rest (`_lone_floors`) are never
    cut below what their own samples allow. `in_place`: `bound`
    is the caller's own (a pass's new array): scaled where it is, no new array (without a ceiling, which reads it).
    Complex `deviations` (a complex value's: its bound is on the error's modulus) are read as their moduli, the
    sums of their parts' squares."""
    if bound is None:
        return None
    if stats is None:  # the samples' squares against the bound's, per block, in one pass (block_ratios)
        stats = block_ratios(_squared_parts(deviations), np.reshape(bound, -1), CALIBRATION_BLOCK)
    largest, total, counted, seen, unjudged = stats
    if unjudged or seen == 0:
        return bound
    # (a block whose samples never moved says nothing: a max whose winner is exact in every sample)
    spread = SIGMAS / math.sqrt(len(deviations))  # SIGMAS x the samples' RMS, per sum of squares' root
    enough = counted >= MEASURED_FROM
    factor = np.minimum(1.0, SAMPLE_MARGIN * spread * np.sqrt(largest))
    factor = np.where(largest > 0, factor, 1.0)
    cut = factor < 1
    lone = None
    if cut.any():  # (blocks whose tight elements share their draws: cut by a margin made for their count)
        pooled = enough | (counted >= POOLED_FROM)
        measured = cut & pooled
        draws, lone = (
            participation(bound, deviations, largest, measured) if measured.any() else (np.ones(np.size(largest)), None)
        )
        # (a small value's few directions tell a shared draw from their own less well: a half draw less; fewer than
        # POOLED_FROM elements: each its own four draws)
        draws = np.where(enough, draws, np.where(pooled, draws - 0.5, 1.0))
        worth = margin(draws[cut])
        small = (pooled & ~enough)[cut]  # (and at least the margin its count of elements is worth)
        if small.any():
            moved = _moved(bound, deviations, np.flatnonzero(cut)[small])
            worth[small] = np.maximum(worth[small], _SMALL_MARGINS[np.where(moved >= POOLED_FROM, moved, 1)])
        factor[cut] = np.minimum(1.0, worth * spread * np.sqrt(largest[cut]))
        lone = _lone_floors(bound, lone, spread)
    factor = factor.astype(bound.dtype)
    out = bound if in_place and ceiling is None else None
    whole = (factor == 1).all()
    calibrated = bound if whole else _scaled(bound, factor, out)
    if lone is not None and not whole:  # (a lone element never below its own samples' cut)
        at, floors = lone
        calibrated.flat[at] = np.maximum(calibrated.flat[at], floors)  # (.flat: in place in any layout)
    if ceiling is None:
        return calibrated
    # the block's root mean square of SIGMAS x the samples' RMS over the bound
    short = np.where(enough, spread * np.sqrt(total / np.maximum(counted, 1)), 1.0)
    if not np.any(short > 1):
        return calibrated
    return np.maximum(calibrated, np.minimum(_scaled(bound, short), ceiling()))


def participation(bound, deviations, largest, cut) -> tuple[np.ndarray, tuple | None]:
    """Per block of CALIBRATION_BLOCK, how many independent draws its tight elements' samples are at least worth
    (kernels/bound_rules.participation_ratios; `largest`: the blocks' largest ratios, block_ratios'), computed only
    in the blocks being `cut` (4 in the others: the margin matters only where a block is cut), and its lone
    elements (members, their largest ratio, their P: participation_ratios'; None for complex samples: no floor);
    the samples read as kept (bfloat16: their bits, no float32 copy)."""
    if np.iscomplexobj(deviations):  # (the parts' ratios: each at most the count of real draws its samples are made
        # of; 0, a part no element near the largest ratio shows, says nothing)
        real, imag = (participation(bound, part, largest, cut)[0] for part in (deviations.real, deviations.imag))
        return np.where(real == 0, imag, np.where(imag == 0, real, np.minimum(real, imag))), None
    samples = np.reshape(deviations, (len(deviations), -1))
    if samples.dtype == _BF16:
        samples = samples.view(np.uint16)
    out = np.full(np.size(largest), float(SAMPLES))
    lone = np.full((np.size(largest), 2), -1, np.int64), np.zeros(np.size(largest)), np.zeros(np.size(largest))
    participation_ratios(np.ascontiguousarray(samples), np.ascontiguousarray(bound).reshape(-1), CALIBRATION_BLOCK,
                         largest, cut, out, lone)  # fmt: skip
    return out, lone


def _lone_floors(bound, lone, spread) -> tuple[np.ndarray, np.ndarray] | None:
    """(flat indices, floors) of the cut blocks' lone elements (participation's: the one or two whose rule bound is
    below a third of the block's third smallest): their bounds cut by their own samples alone, as a block of their own
    (the largest of their ratios, the margin of their P: one element's 6.64), read before `bound` is scaled. The
    block's factor comes from its other elements, looser by the rule: where the lone one's four draws happened
    small, it falls out of those near the largest ratio, which are then many independent ones (margin 2), and was
    cut below SIGMAS sigma in 4-9% of such blocks 4-10x tighter (bench/bench_calibration.py; 0.16% at 3.5x, 0 at
    3x: a third, kernels/bound_rules.LONE)."""
    if lone is None:
        return None
    members, ratio, draws = lone
    has = members >= 0
    if not has.any():
        return None
    blocks = has.any(axis=1)  # (the margin only where a block has one: most blocks have none)
    own = np.minimum(1.0, margin(draws[blocks]) * spread * np.sqrt(ratio[blocks]))
    at = members[has]
    return at, np.asarray(np.reshape(bound, -1)[at] * np.broadcast_to(own[:, None], has[blocks].shape)[has[blocks]],
                          bound.dtype)  # fmt: skip


def _moved(bound, deviations, blocks) -> np.ndarray:
    """Per block of CALIBRATION_BLOCK in `blocks` (indices), how many of its elements have a finite positive bound and
    a sample that moved (an element whose samples are all 0 shows nothing of its sigma)."""
    flat = np.reshape(bound, -1)
    at = blocks[:, None] * CALIBRATION_BLOCK + np.arange(CALIBRATION_BLOCK)
    inside = at < flat.size
    at = np.minimum(at, flat.size - 1)
    moved = np.any(np.reshape(deviations, (len(deviations), -1))[:, at] != 0, axis=0)
    return np.count_nonzero(inside & moved & (flat[at] > 0) & (flat[at] < np.inf), axis=1)


def small_margin(count) -> np.ndarray:
    """The margin of a small value's block of `count` elements whose samples moved (fewer than MEASURED_FROM): its
    tightest element is cut below SIGMAS sigma only where its own four draws' RMS is below 1 / M of its sigma and
    every other element's below LONE / M of its own, P(chi2_4 < 4 / M^2) P(chi2_4 < 4 LONE^2 / M^2)^(count - 1)
    (independent draws; the others at most LONE x looser than the tightest: the looseness a block of 256 cut at
    SAMPLE_MARGIN tolerates), so M where that is CUT_BELOW: one draw's 6.64 for one element, 3.84 for 3, 2.89 for
    8, 2.23 for 32, 2.04 for 63 (docs/verdicts.md "Small values"). Bisection on the closed form of chi2_4's CDF."""
    count = np.maximum(np.asarray(count, np.float64), 1)
    low, high = np.full(count.shape, 1.0), np.full(count.shape, 8.0)
    for _ in range(40):
        mid = (low + high) / 2
        above = _chi2_4_below(4 / mid**2) * _chi2_4_below(4 * LONE**2 / mid**2) ** (count - 1) > CUT_BELOW
        low, high = np.where(above, mid, low), np.where(above, high, mid)
    return high


def _chi2_4_below(x) -> np.ndarray:
    """P(chi2_4 < x)."""
    return -np.expm1(-x / 2) - x / 2 * np.exp(-x / 2)


_SMALL_MARGINS = small_margin(np.arange(MEASURED_FROM))  # (by count: computed once)


def _squared_parts(deviations) -> np.ndarray:
    """`deviations` ((SAMPLES, *shape)) as rows whose squares, summed over the rows, are each element's samples' sum
    of squares (block_ratios' reading): the samples themselves, or a complex value's parts (2 x SAMPLES rows of
    float32: |d|^2 = Re^2 + Im^2)."""
    rows = np.reshape(deviations, (len(deviations), -1))
    if not np.iscomplexobj(rows):
        return rows
    return np.ascontiguousarray(np.concatenate([rows.real, rows.imag]), np.float32)


def margin(participation) -> np.ndarray:
    """The margin of blocks whose tight elements' samples have this participation ratio P (`participation`): k
    independent draws give P <= k (P is at most the Gram matrix's rank), and the tightest element is cut below
    SIGMAS sigma only where every draw's RMS is below 1 / margin of its sigma, P(chi2_S < S / margin^2) each
    (docs/verdicts.md "Fewer samples"), so the margin where that to the power P - 1/2 is CUT_BELOW. The half draw:
    where one shared draw carries most of the variance and the rest is each element's own, the blocks whose shared
    draw happened to be small (the ones the margin guards) show their own parts' directions, P 2-3: 0.18% of such
    blocks at P, 0.1% at P - 1/2 (bench/bench_calibration.py). 6.64 up to P = 1.5 (one draw: a broadcast value's, a
    lone tight element's), 3.67 at 2, 2.22 at 3, SAMPLE_MARGIN from 3.4 (independent elements: P 3.85-3.99): the
    quantile is computed only below INDEPENDENT (most cut blocks are above it)."""
    participation = np.asarray(participation, np.float64)
    out = np.full(participation.shape, SAMPLE_MARGIN)
    few = ~(participation >= INDEPENDENT)  # (NaN too: as the formula makes it)
    if few.any():
        below = CUT_BELOW ** (1 / np.clip(participation[few] - 0.5, 1, SAMPLES))
        out[few] = np.maximum(SAMPLE_MARGIN, np.sqrt(SAMPLES / _chi2_4_quantile(below)))
    return out


def _chi2_4_quantile(q) -> np.ndarray:
    """chi2_4's q quantile 2y (SAMPLES = 4: P(chi2_4 < 2y) = 1 - (1 + y) e^-y): Newton's steps on
    log(1 + y) - y = log(1 - q) from y = sqrt(-2 log(1 - q)) (its leading term), within 1e-11 after three for q
    from 1e-9 to 0.999 (scipy's chi2.ppf; not imported here: 0.5 s)."""
    target = np.log1p(-q)
    y = np.sqrt(-2 * target)
    for _ in range(4):
        y = y + (np.log1p(y) - y - target) * (1 + y) / y
    return 2 * y


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
    source, count = broadcast_sources(inst.operands[k], x.shape)
    if count == x.size:
        return None  # (a broadcast that adds no dimension: nothing repeats)
    # the binades of x's ulps; coarse: the other operand's ulp (in its type) at least x's
    info, other_info = ml_dtypes.finfo(orig.shape.element_type.numpy), ml_dtypes.finfo(other_type)
    groups = np.empty(x.shape, np.int64)
    any_coarse = rounding_groups(
        np.ravel(x),
        np.ravel(operands[1 - k]),
        contiguous(np.broadcast_to(source, x.shape)).reshape(-1),  # (x's size in int64: on the cores)
        count,
        int(info.nmant),
        float(info.tiny),
        int(other_info.nmant),
        float(other_info.tiny),
        groups.reshape(-1),
    )
    return groups if any_coarse else None


def broadcast_sources(broadcast, shape: tuple) -> tuple[np.ndarray, int]:
    """(index, count): the element of `broadcast`'s operand (count elements, row-major) behind each element of its
    result of `shape`, as an int64 array broadcastable to `shape`."""
    dims = tuple(broadcast.attr("dimensions", ()))
    kept = [shape[d] for d in dims]
    count = int(np.prod(kept, dtype=np.int64))
    source = np.arange(count).reshape(kept).transpose(np.argsort(dims))
    return source.reshape([shape[d] if d in dims else 1 for d in range(len(shape))]), count


def _scaled(bound: np.ndarray, per_block: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`bound` times a value per block of CALIBRATION_BLOCK consecutive elements (of the value's type), into `out`
    (`bound` itself: its own elements in place; default a new array)."""
    if out is None:
        out = np.empty(np.shape(bound), np.result_type(bound, per_block))
    scale_blocks(np.reshape(bound, -1), per_block, CALIBRATION_BLOCK, out.reshape(-1))
    return out
