"""What the sum and dot rules of tools/bounds.py share: the error all terms may share (a dot's computed from its
operands' sums and least bounds along the contraction, without a dot) and the partial sums of XLA:CPU's tree
order."""

from __future__ import annotations

import numpy as np

from ..kernels.bound_generic import chained_sums

PER_STEP_ROUNDINGS = {"float16": 0, "bfloat16": 1, "float32": 2}  # (per_step_sums' `rounding`: the type's)


def along_contraction(x: np.ndarray, inst, side: str, reduce) -> np.ndarray:
    """`reduce` (np.sum, np.min) of the dot's `side` ("lhs" / "rhs") operand `x` along the contraction, laid out
    (B, F): its batch dims in the dot's batch order, then its free dims in order -- the dot's output (batch, lhs
    free, rhs free) element (b, m, n) reads row b of the lhs's and of the rhs's. The shared part of a dot's bound
    (tools/bound_dots.py): every term shares the other operand's least bound along the contraction, so
    |dot(values, least)| is |values summed along it| times that least, an outer product per batch."""
    batch, contracting = list(inst.attr(f"{side}_batch_dims", ())), tuple(inst.attr(f"{side}_contracting_dims", ()))
    reduced = reduce(x, axis=contracting) if contracting else np.asarray(x)
    reduced = np.abs(reduced) if np.iscomplexobj(reduced) else reduced  # (read as magnitudes)
    kept = [d for d in range(np.ndim(x)) if d not in contracting]
    order = [kept.index(d) for d in batch] + [k for k, d in enumerate(kept) if d not in batch]
    count = int(np.prod([np.shape(x)[d] for d in batch], dtype=np.int64))
    return np.ascontiguousarray(np.transpose(reduced, order), np.float64).reshape(count, -1)


def least_along(bound: np.ndarray, dims) -> np.ndarray:
    """`bound`'s smallest value along `dims`, broadcast back: the most an error every term there shares can be."""
    return np.broadcast_to(np.min(bound, axis=tuple(dims), keepdims=True), bound.shape) if dims else bound


def _tree_windows(a: np.ndarray, dims: tuple, width: int) -> tuple:
    """`a`'s reduce over `dims` as XLA's TreeReductionRewriter splits it (xla/hlo/transforms/simplifiers/
    tree_reduction_rewriter.cc): a reduce-window of min(n, width) along each reduced dim (stride the window, padding
    "same": the low side the smaller half). Returns the windows' terms, laid out (kept dims..., windows' grid...,
    each window's terms in row-major order), and the number of kept dims."""
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
    grid = terms.shape[: len(kept) + len(outer)]
    return terms.reshape(*grid, int(np.prod([split[k] for k in inner]))), len(kept)


def tree_order_steps(a: np.ndarray, dims: tuple, width: int) -> np.ndarray | None:
    """sum_k s_k^2 over the partial sums s_k of `a`'s sum over `dims` in the order XLA's TreeReductionRewriter
    gives it (_tree_windows: each window summed in row-major order, then a reduce of the windows' sums in row-major
    order). The partial sums are the exact terms' (`a`: the shadow's), so the sum's rounding error has exactly the
    variance u^2/3 of that (each step's rounding independent). None where no reduced dim is longer than `width`
    (the rewrite leaves the reduce)."""
    if all(a.shape[d] <= width for d in dims):
        return None
    windows, kept = _tree_windows(a, dims, width)
    terms = windows.reshape(*windows.shape[:kept], -1, windows.shape[-1])
    in_windows = np.cumsum(terms, axis=-1)
    over_windows = np.cumsum(in_windows[..., -1], axis=-1)
    return np.sum(np.square(in_windows), axis=(-2, -1)) + np.sum(np.square(over_windows), axis=-1)


def _chained(terms: np.ndarray, init, dtype, lanes=(1,)) -> np.ndarray:
    """Each row of `terms` (rows, n: values of `dtype`, held in float32 where the kernel sums them) summed from
    `init` in each order of `lanes` (chains added pairwise), every step rounded to `dtype`
    (kernels/bound_generic.chained_sums; numpy's accumulate, one chain, for the other types): (rows, len(lanes))
    float64."""
    start = np.broadcast_to(np.asarray(init).astype(dtype), len(terms))  # (one init, or one a row)
    rounding = PER_STEP_ROUNDINGS.get(np.dtype(dtype).name)
    if rounding is None:
        terms = np.array(terms, dtype)
        terms[:, 0] += start  # (the first step: init + the first term, rounded)
        return np.asarray(np.add.accumulate(terms, axis=-1, out=terms)[:, -1:], np.float64)
    summed = np.empty((len(terms), len(lanes)))
    held = np.ascontiguousarray(terms, np.float32)
    chained_sums(held, np.ascontiguousarray(start, np.float32), rounding, np.array(lanes, np.int64), summed)
    return summed


def _rows(a: np.ndarray, dims: tuple, dtype) -> tuple:
    """`a`'s terms of its sum over `dims` as the program holds them (rounded to `dtype`; float32 where the kernel
    sums them), one row per element of the sum in row-major order, and the sum's shape."""
    kept = [d for d in range(a.ndim) if d not in dims]
    rows = [a.shape[d] for d in kept]
    terms = np.transpose(a, kept + sorted(dims)).astype(dtype, order="C")
    if np.dtype(dtype).name in PER_STEP_ROUNDINGS:
        terms = terms.astype(np.float32, copy=False)
    return np.ascontiguousarray(terms).reshape(int(np.prod(rows)), -1), rows


def repeated_rounding(a: np.ndarray, dims: tuple, init, dtype, exact) -> np.ndarray:
    """The error of `a`'s sum over `dims` (plus `init`) with its terms as the program holds them (`a`, the shadow's
    exact terms, rounded to `dtype`) summed in row-major order, every step rounded to `dtype`, less the exact sum
    `exact`: deterministic, and where the steps' roundings repeat (one residue added in one binade, or a partial sum
    stagnating as every term rounds away) far past what independent roundings allow (4,096 f16 copies of 0.1: 256,
    not 409.5). One compiled pass over the terms (kernels/bound_generic.chained_sums) for f16, bf16 and f32; numpy's
    accumulate (every step rounded to the array's type) for the others."""
    terms, rows = _rows(a, dims, dtype)
    return _chained(terms, init, dtype)[:, 0].reshape(rows) - np.asarray(exact, np.float64)


def tree_order_rounding(a: np.ndarray, dims: tuple, init, dtype, exact, width: int) -> np.ndarray:
    """repeated_rounding in XLA:CPU's order of a long 16-bit sum: TreeReductionRewriter run to its fixpoint (the
    reduce of the windows' sums rewritten again while a reduced dim is longer than `width`: 65,536 terms are
    windows of 32, of 32 again, then a reduce of 64), every window and the last reduce summed from `init` in
    row-major order, every step rounded to `dtype`. XLA:CPU's f16 and bf16 sums are that order emulated, bit for
    bit (tests/test_repeated_roundings.py)."""
    held = np.asarray(a).astype(dtype)
    while any(held.shape[d] > width for d in dims):
        windows, kept = _tree_windows(held, dims, width)
        grid = windows.shape[:-1]
        held = _chained(windows.reshape(-1, windows.shape[-1]), init, dtype)[:, 0].astype(dtype).reshape(grid)
        dims = tuple(range(kept, len(grid)))
    return repeated_rounding(held, dims, init, dtype, exact)


# Representatives of the orders a device may sum in where its profile says no order (reductions = "accumulate":
# "any order"): the terms in this many chains (every lanes-th term in order, the chains added pairwise) -- 1:
# row-major (a loop, numpy along an outer axis); 16: vector lanes (hloexec's compiled sums, YNNPACK with
# AVX-512); 256: threads' chains and a tree across them (a GPU block's, a TPU vector register's lanes).
REPRESENTATIVE_LANES = (1, 16, 256)
MAX_CONSTANTS = 1024  # a dot's floor where one side's lines are constant: at most this many (batch, value) pairs


def any_order_rounding(a: np.ndarray, dims: tuple, init, dtype, accumulation, exact, allowed) -> np.ndarray | None:
    """A floor where the device's order is not known: the largest (by magnitude, per element) of the errors of
    `a`'s sum over `dims` in the REPRESENTATIVE_LANES orders, its terms as the program holds them (rounded to
    `dtype`), every step rounded to `accumulation` (the accumulator's type: f32 for a 16-bit sum the device
    accumulates in f32), less `exact`; kept where it exceeds `allowed` (what the rule allows the accumulation),
    0 elsewhere, None where it is nowhere. Repeated roundings show first in the longest chain (row-major order:
    the most steps in each binade); the other orders are summed only where its error reaches half of `allowed`
    (the check: one pass, ~1 ns a term)."""
    terms, rows = _rows(a, dims, dtype)
    worst = _any_order(terms, init, accumulation, np.ravel(np.broadcast_to(np.asarray(exact, np.float64), rows)),
                       np.ravel(np.broadcast_to(np.asarray(allowed, np.float64), rows)))  # fmt: skip
    return worst.reshape(rows) if np.any(worst) else None


def _any_order(terms, init, accumulation, exact, allowed) -> np.ndarray:
    """any_order_rounding of the rows of `terms` (rows, n; `init`: one, or one a row; `exact`, `allowed`: (rows,)):
    (rows,), 0 where the largest error is within `allowed`."""
    worst = _chained(terms, init, accumulation)[:, 0] - exact
    repeats = np.flatnonzero(np.abs(worst) > allowed / 2)
    if repeats.size:
        start = np.broadcast_to(init, len(terms))[repeats]
        others = _chained(terms[repeats], start, accumulation, REPRESENTATIVE_LANES[1:]) - exact[repeats, None]
        others = np.take_along_axis(others, np.argmax(np.abs(others), axis=1)[:, None], axis=1)[:, 0]
        worst[repeats] = np.where(np.abs(others) > np.abs(worst[repeats]), others, worst[repeats])
    return np.where(np.abs(worst) > allowed, worst, 0.0)


def scattered_rounding(target, positions, updates, dtype, exact, allowed, known: bool) -> np.ndarray | None:
    """A scatter-add's floor: each element of `target` with two or more updates (`updates`, at flat `positions`,
    in their order of application), both as the program holds them (the shadow's, rounded to `dtype`), summed
    from the target's value in that order (`known`: a loop's) or the largest of REPRESENTATIVE_LANES' orders,
    every step rounded to `dtype`, less `exact`; kept where it exceeds `allowed` (target-shaped), 0 elsewhere,
    None where it is nowhere. The rows, of unequal lengths, are summed in buckets of lengths within 2x of each
    other, padded with zeros (an exact step)."""
    counts = np.bincount(positions, minlength=np.size(target))
    many = np.flatnonzero(counts >= 2)
    if many.size == 0:
        return None
    order = np.argsort(positions, kind="stable")  # (each element's updates, in their order)
    values = np.ravel(updates)[order]
    first = np.cumsum(counts) - counts
    exact, allowed, start = (np.ravel(np.broadcast_to(v, np.shape(target))) for v in (exact, allowed, target))
    floor = np.zeros(np.size(target))
    width = 2
    while many.size:
        rows, many = many[counts[many] <= width], many[counts[many] > width]
        at = np.arange(width)
        taken = first[rows, None] + at
        terms = np.where(at < counts[rows, None], values[np.minimum(taken, values.size - 1)], 0.0)
        terms = terms.astype(dtype).astype(np.float32 if np.dtype(dtype).name in PER_STEP_ROUNDINGS else dtype)
        if known:
            floor[rows] = _chained(terms, start[rows], dtype)[:, 0] - exact[rows]
            floor[rows] = np.where(np.abs(floor[rows]) > allowed[rows], floor[rows], 0.0)
        else:
            floor[rows] = _any_order(terms, start[rows], dtype, exact[rows], allowed[rows])
        width *= 2
    return floor.reshape(np.shape(target)) if np.any(floor) else None


def _constant_lines(x: np.ndarray, inst, side: str) -> np.ndarray | None:
    """The dot's `side` operand's lines along the contraction (along_contraction's layout, (B, F)): each one's
    value where it is constant and not 0, NaN elsewhere; None where none is (looked for first at each line's two
    ends: one look a line, no pass over the operand, where no line's ends are equal)."""
    contracting = tuple(inst.attr(f"{side}_contracting_dims", ()))
    ends = [x, x]
    for d in contracting:
        ends = [np.take(ends[0], [0], axis=d), np.take(ends[1], [-1], axis=d)]
    if not contracting or not np.any(ends[0] == ends[1]):
        return None
    least, most = along_contraction(x, inst, side, np.min), along_contraction(x, inst, side, np.max)
    constant = (least == most) & (least != 0)  # (zeros: exact products, an exact sum)
    return np.where(constant, least, np.nan) if np.any(constant) else None


def _line_dims(shape: tuple, inst, side: str) -> tuple[list, list, list]:
    """The dot's `side` operand's (batch, free, contracting) dims, in along_contraction's order."""
    batch, contracting = list(inst.attr(f"{side}_batch_dims", ())), list(inst.attr(f"{side}_contracting_dims", ()))
    return batch, [d for d in range(len(shape)) if d not in batch and d not in contracting], contracting


def _lines_shape(shape: tuple, inst, side: str) -> tuple[int, int, int]:
    """_lines' shape (B, F, K) for an operand of `shape`."""
    batch, free, contracting = (
        int(np.prod([shape[d] for d in dims], dtype=np.int64)) for dims in _line_dims(shape, inst, side)
    )
    return batch, free, contracting


def _lines(x: np.ndarray, inst, side: str) -> np.ndarray:
    """The dot's `side` operand's lines along the contraction, (B, F, K): along_contraction's layout, each line its
    terms in row-major order of the contracting dims."""
    batch, free, contracting = _line_dims(np.shape(x), inst, side)
    return np.transpose(x, batch + free + contracting).reshape(_lines_shape(np.shape(x), inst, side))


def _both_constant(lines, types, accumulation, exact, count: int, coefficient, budget: int) -> np.ndarray:
    """dot_rounding's floor (B, M, N) where both lines are constant (`lines`: each side's values, NaN where not):
    K copies of each distinct product summed in every order; 0 elsewhere (or where the sums would pass `budget`)."""
    with np.errstate(invalid="ignore"):
        held = [np.asarray(v.astype(t), np.float64) for v, t in zip(lines, types)]
        products = held[0][:, :, None] * held[1][:, None, :]  # (the output's layout: batch, lhs free, rhs free)
    floor = np.zeros(products.shape)
    both = ~np.isnan(products)
    p = np.asarray(products[both].astype(accumulation), np.float64)
    values, which = np.unique(p, return_inverse=True)
    if not values.size or values.size * count > budget:
        return floor
    sums = _chained(np.repeat(values[:, None], count, axis=1), 0.0, accumulation, REPRESENTATIVE_LANES)
    x = exact[both]
    errors = sums[which] - x[:, None]
    worst = np.take_along_axis(errors, np.argmax(np.abs(errors), axis=1)[:, None], axis=1)[:, 0]
    allowed = np.sqrt(coefficient * (count * np.square(p) + np.square(x)))
    floor[both] = np.where(np.abs(worst) > allowed, worst, 0.0)
    return floor


def _one_constant(constant, other, other_constant, types, accumulation, exact, coefficient, budget) -> np.ndarray:
    """dot_rounding's floor (B, P, Q) where one side's line is constant (`constant`, (B, P): c, NaN where not) and
    the other's (`other`, (B, Q, K)) is not (`other_constant`, (B, Q): NaN): per batch and distinct c, the products
    c x each other line summed (_any_order: row-major first, the other orders where it reaches half the
    allowance); 0 elsewhere, or everywhere where there are more than MAX_CONSTANTS groups or their rows would pass
    `budget` steps. `exact`: (B, P, Q)."""
    floor = np.zeros(exact.shape)
    at = np.flatnonzero(~np.isnan(constant))
    batch, place = np.divmod(at, constant.shape[1])
    keys = np.column_stack([batch, constant.ravel()[at]])
    groups, first, which = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    if len(groups) > MAX_CONSTANTS:
        return floor
    varied = [np.flatnonzero(np.isnan(other_constant[int(b)])) for b in groups[:, 0]]
    if not sum(v.size for v in varied) or sum(v.size for v in varied) * other.shape[2] > budget:
        return floor
    terms, exacts = [], []  # (a group's first element's exact values stand for the group's: equal lines' dots)
    for (b, c), q, p in zip(groups, varied, place[first]):
        c = np.asarray(np.asarray(c).astype(types[0]), np.float64)
        terms.append((c * np.asarray(other[int(b), q].astype(types[1]), np.float64)).astype(accumulation))
        exacts.append(exact[int(b), p, q])
    summed, exact_sums = np.concatenate(terms), np.concatenate(exacts)
    squares = np.sum(np.square(summed, dtype=np.float64), axis=1)
    found = _any_order(summed, 0.0, accumulation, exact_sums, np.sqrt(coefficient * (squares + np.square(exact_sums))))
    rows = np.cumsum([0] + [v.size for v in varied])
    for g, q in enumerate(varied):
        members = place[np.ravel(which) == g]
        floor[int(groups[g, 0]), members[:, None], q[None, :]] = found[rows[g] : rows[g + 1]]
    return floor


def dot_rounding(inst, a, b, types, accumulation, exact, coefficient, budget: int) -> np.ndarray | None:
    """A dot's floor where an output element's products repeat: one side's line along the contraction constant (a
    matrix of ones, a mean's weights, a broadcast), its products that constant times the other line's terms -- all
    one value where that line is constant too. Its products (the operands as the program holds them, rounded to
    `types`, their product to `accumulation`: a loop's terms without an FMA) summed in REPRESENTATIVE_LANES'
    orders, every step rounded to `accumulation`, less `exact` (the shadow's dot), the largest by magnitude; kept
    where it exceeds the accumulation's own bound, `coefficient` (the products' squares + x^2) squared (the dot
    rule's). One sum per distinct product where both lines are constant, one per distinct constant and other line
    where one is; none where they would take more than `budget` steps an order. None where no element keeps one
    (no constant line: one look at each line's ends, no pass over the operands)."""
    lhs, rhs = _constant_lines(a, inst, "lhs"), _constant_lines(b, inst, "rhs")
    if lhs is None and rhs is None:
        return None
    count = int(np.prod([np.shape(a)[d] for d in inst.attr("lhs_contracting_dims", ())], dtype=np.int64))
    lines = [np.full(_lines_shape(np.shape(o), inst, s)[:2], np.nan) if c is None else c
             for o, s, c in ((a, "lhs", lhs), (b, "rhs", rhs))]  # fmt: skip
    x = np.asarray(exact, np.float64).reshape(lines[0].shape[0], lines[0].shape[1], lines[1].shape[1])
    floor = _both_constant(lines, types, accumulation, x, count, coefficient, budget)
    if lhs is not None:
        floor += _one_constant(lhs, _lines(b, inst, "rhs"), lines[1], types, accumulation, x, coefficient, budget)
    if rhs is not None:
        swapped = np.swapaxes(x, 1, 2)
        found = _one_constant(rhs, _lines(a, inst, "lhs"), lines[0], types[::-1], accumulation, swapped,
                              coefficient, budget)  # fmt: skip
        floor += np.swapaxes(found, 1, 2)
    return floor.reshape(np.shape(exact)) if np.any(floor) else None
