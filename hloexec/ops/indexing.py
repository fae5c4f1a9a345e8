"""Indexing: gather, scatter, sort.

* gather: general dimension numbers incl. operand_batching_dims / start_indices_batching_dims;
  index_vector_dim == rank(start_indices) means a trailing size-1 index vector. Start indices are
  clamped to [0, operand_dim - slice_size] per dimension (XLA). One numpy advanced-indexing gather.
* scatter: general dimension numbers incl. input/scatter_indices batching dims; variadic. An update
  window whose start is out of bounds (start < 0 or start + window > dim in any operand dim) is skipped
  entirely (XLA). Updates apply in row-major order of the updates array. Update computations that are
  one add/mul/max/min/and/or/xor of their parameters, or that return parameter 1 (replace), run
  vectorized (ufunc.at / fancy assignment: f16/bf16 round per combine, as XLA); any other (and
  variadic) computation runs per element through the computation (slow).
* sort: `dimensions={d}`, several operands, comparator on 2N scalars. Fast path when the comparator
  orders by keys: its root is compare(f(p2k), f(p2k+1)), direction LT/GT (either operand order), f one
  elementwise expression of parameter 2k and constants (plain compares of the operands, and jax's, which
  canonicalize NaN and -0 before a TOTALORDER compare), or combines several such compares
  lexicographically (or(lt0, and(eq0, rest)) as jax emits for num_keys > 1, or select(eq0, rest, lt0); eq0 of
  lt0's type, or TOTALORDER beside a FLOAT lt0 as XLA's TopK decomposition writes it: they part on -0/+0 and NaN
  only, where that comparator is no strict weak order and XLA leaves the order unspecified). XLA:CPU's optimized
  modules of jax's sorts compare each key's total order by hand, `select(b < 0, b xor MAX, b)` of its bits b
  (`total_order_of`): read as that float's TOTALORDER compare (the same integer `total_order_key` makes).
  Each key's f runs once on the whole operand through the registered kernels, then a stable numpy
  argsort/lexsort of an ordering array (TOTALORDER: -NaN < -inf < ... < -0 < +0 < ... < NaN via an
  integer key; default FLOAT compare: -0 == +0, NaN sorts last ascending and descending -- XLA leaves NaN
  placement of a non-total compare unspecified). XLA:CPU runs the comparator in std::stable_sort, so ties
  keep their order, as here. Any other comparator: Python's stable sort with functools.cmp_to_key per row
  (slow). is_stable=false sorts stably too (a valid result).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedError
from ..ir.attributes import gather_dims, scatter_dims
from ..ir.module import Instruction
from ..ir.dtypes import element_type_of
from ..kernels import elementwise as ew
from ..kernels.index_maps import NUMPY, Gather, Scatter
from .common import (
    SUB_BYTE_CONTAINER,
    as_signed,
    as_tuple,
    as_unsigned,
    binary_kind,
    called,
    contig,
    ints,
    invalid,
    scalar,
    total_order_key,
    ufunc_for,
)
from .registry import lookup, op


def _axis_aranges(dims) -> list[np.ndarray]:
    """One int64 arange per dim of `dims`, each along its own axis: the index of every element at once, as
    broadcasting arrays (the NUMPY interpreter's index values)."""
    return [
        np.arange(n, dtype=np.int64).reshape([n if a == d else 1 for a in range(len(dims))]) for d, n in enumerate(dims)
    ]


def _loader(indices, vectors):
    """`load(position)` for the index maps' formulas: the indices array read at broadcasting positions."""
    held = indices.reshape(vectors.dims)  # a trailing 1 when index_vector_dim is the rank
    return lambda position: held[tuple(position)]


def _check_index_dims(inst, index_vector_dim: int, operand_batching, indices_batching, windows=()):
    """What the index maps' geometry (Gather.of, Scatter.of) takes for granted, as XLA's verifier checks it: the
    index vector dim at most the indices' rank, batching dims paired with dims of the indices other than
    it, `windows` (scatter's update_window_dims) dims of the updates."""
    n = (len(inst.operands) - 1) // 2 if inst.opcode == "scatter" else 1
    indices_rank = inst.operands[n].shape.rank
    update_rank = inst.operands[-1].shape.rank
    if (
        not 0 <= index_vector_dim <= indices_rank
        or len(operand_batching) != len(indices_batching)
        or any(not 0 <= d < indices_rank or d == index_vector_dim for d in indices_batching)
        or any(not 0 <= d < update_rank for d in windows)
    ):
        raise invalid(
            inst,
            f"index_vector_dim={index_vector_dim}, batching dims {list(operand_batching)} / "
            f"{list(indices_batching)}, window dims {list(windows)} of indices "
            f"{inst.operands[n].shape.to_text(False)}",
        )


@op(
    "gather",
    kernel="numpy",
    notes="Full GatherDimensionNumbers incl. batching dims; start indices clamped per XLA; one numpy "
    "advanced-indexing gather.",
)
def prepare_gather(inst, ctx):
    gd = gather_dims(inst)
    _check_index_dims(inst, gd.index_vector_dim, gd.operand_batching_dims, gd.start_indices_batching_dims)
    geometry = Gather.of(inst)
    oshape = inst.operands[0].shape
    rank = oshape.rank
    if len(geometry.offset_src) != len(gd.offset_dims):
        raise UnsupportedError("gather: offset_dims do not match the uncollapsed slice dims", inst)
    out_rank = inst.shape.rank
    idims = inst.operands[1].shape.dims
    vector = idims[gd.index_vector_dim] if gd.index_vector_dim < len(idims) else 1
    batch_rank = len(idims) - (gd.index_vector_dim < len(idims))
    if (
        len(gd.slice_sizes) != rank
        or gd.index_vector_dim > len(idims)
        or len(gd.start_index_map) != vector
        or out_rank != batch_rank + len(gd.offset_dims)
        or any(not 0 <= d < out_rank for d in gd.offset_dims)
    ):
        raise invalid(
            inst,
            f"slice_sizes, offset_dims and start_index_map of {oshape.to_text(False)} indexed by "
            f"{inst.operands[1].shape.to_text(False)} into {inst.shape.to_text(False)}",
        )
    out_dtype = inst.shape.dtype
    out_dims = tuple(inst.shape.dims)
    out_index = _axis_aranges(out_dims)
    batch_index = [out_index[d] for d in geometry.batch_dims]
    offset_index = [out_index[d] for d in geometry.offset_dims]

    def kernel(operand, indices):
        starts = geometry.starts(NUMPY, _loader(indices, geometry.vectors), batch_index)
        got = operand[tuple(geometry.source_index(NUMPY, starts, offset_index))]
        # an output dim no index depends on (no index vector component, a size-1 operand) broadcasts
        return contig(got if got.shape == out_dims else np.broadcast_to(got, out_dims), dtype=out_dtype)

    return kernel


@op(
    "scatter",
    kernel="numpy",
    notes="Full ScatterDimensionNumbers incl. batching dims; variadic; out-of-bounds update windows "
    "skipped (XLA). add/mul/max/min/and/or/xor/replace vectorized (ufunc.at); other update "
    "computations per element (slow).",
)
def prepare_scatter(inst, ctx):
    n = (len(inst.operands) - 1) // 2
    sd = scatter_dims(inst)
    _check_index_dims(
        inst, sd.index_vector_dim, sd.input_batching_dims, sd.scatter_indices_batching_dims, sd.update_window_dims
    )
    geometry = Scatter.of(inst)
    comp = called(inst, "to_apply")
    kind = binary_kind(comp) if n == 1 else None
    fn = None if kind is not None else ctx.computation(comp)
    tuple_out = inst.shape.is_tuple
    if len(geometry.window_src) != len(sd.update_window_dims):
        raise UnsupportedError("scatter: update_window_dims do not match the operand's window dims", inst)
    # One index vector and a simple combiner (jax's x.at[i, j].set(v)): one window, written by numpy
    # slicing -- the general path's index arithmetic costs ~30 us even for one element.
    idims = inst.operands[n].shape.dims
    if (
        kind is not None
        and not sd.input_batching_dims
        and math.prod(idims) == geometry.vectors.dims[geometry.vectors.vector_dim]
    ):
        return _one_window_scatter(kind, geometry)
    oshape = geometry.operand_dims
    targets = scatter_targets(inst)

    def kernel(*vals):
        operands, indices, updates = vals[:n], vals[n], vals[n + 1 :]
        fi, keep = targets(indices)
        uvals = [u.reshape(-1)[keep] for u in updates]
        outs = [np.array(o, copy=True).reshape(-1) for o in operands]
        if kind is not None:
            if kind == "replace":
                outs[0][fi] = uvals[0]
            else:
                ufunc_for(kind, outs[0].dtype).at(outs[0], fi, uvals[0])
        else:
            for t in range(len(fi)):
                i = fi[t]
                r = fn(*[scalar(o[i]) for o in outs], *[scalar(u[t]) for u in uvals])
                for o, v in zip(outs, as_tuple(r) if tuple_out else (r,)):
                    o[i] = scalar(v)
        outs = [o.reshape(oshape) for o in outs]
        return tuple(outs) if tuple_out else outs[0]

    return kernel


def scatter_targets(inst):
    """A function of a scatter's indices: (every applied update element's flat position in the operand, in the
    updates' own row-major order -- XLA's order of application --; whether each update element is applied, flat:
    an update window out of bounds is skipped)."""
    geometry = Scatter.of(inst)
    oshape = geometry.operand_dims
    upd_dims = tuple(inst.operands[-1].shape.dims)
    update_index = _axis_aranges(upd_dims)
    strides = [int(np.prod(oshape[d + 1 :], dtype=np.int64)) for d in range(len(oshape))]

    def targets(indices):
        starts = geometry.starts(NUMPY, _loader(indices, geometry.vectors), update_index)
        dst = geometry.operand_index(NUMPY, starts, update_index)
        flat = np.zeros((), np.int64)
        for c, stride in zip(dst, strides):
            flat = flat + c * stride
        keep = np.ones((), bool)
        for c in geometry.window_fits(NUMPY, starts):
            keep = keep & c
        keep = np.broadcast_to(keep, upd_dims).reshape(-1)
        return np.broadcast_to(flat, upd_dims).reshape(-1)[keep], keep

    return targets


def _one_window_scatter(kind: str, geometry: Scatter):
    window = geometry.window

    def kernel(operand, indices, update):
        out = operand.copy()
        # the one index vector's components as Python ints (exact, u64 too: no saturation needed), no batching
        starts = geometry.placed(indices.reshape(-1).tolist(), ())
        if all(geometry.window_fits(NUMPY, starts)):  # else skipped
            region = out[tuple(slice(s, s + w) for s, w in zip(starts, window))]
            u = update.reshape(window)
            if kind == "replace":
                region[...] = u
            else:
                ufunc_for(kind, out.dtype)(region, u, out=region)
        return out

    return kernel


# -- sort --------------------------------------------------------------------------------------
# Opcodes whose registered kernels are elementwise numpy closures over values of any shape: run on whole
# operands (0-d constants broadcast) they compute what a comparator computes element by element. Not clamp
# (its kernel does not broadcast a 0-d bound against an array); bitcast-convert only between types of one
# width (checked in _expression).
ANY_SHAPE_ELEMENTWISE = ew.ELEMENTWISE_OPS - {"clamp", "bitcast-convert"}


@dataclass(frozen=True)
class _SortKey:
    """One key of a comparator: `root`, computed from parameter 2 * `operand` (`parameter`) and constants
    by the elementwise instructions `expression` (dependencies first)."""

    operand: int
    parameter: Instruction
    expression: tuple[Instruction, ...]
    root: Instruction
    compare_type: str  # TOTALORDER | FLOAT | SIGNED | UNSIGNED, as the compare kernel reads it
    descending: bool


def _expression(root):
    """The instructions `root` is computed from, dependencies first, when they are constants, parameters
    and ANY_SHAPE_ELEMENTWISE (same-width bitcast-convert too) on arrays; else None."""
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        inst, expanded = stack.pop()
        if expanded:
            order.append(inst)
            continue
        if id(inst) in seen:
            continue
        seen.add(id(inst))
        op_ = inst.opcode
        if inst.shape.is_tuple or not (
            op_ in ("parameter", "constant")
            or op_ in ANY_SHAPE_ELEMENTWISE
            or (op_ == "bitcast-convert" and inst.operands[0].shape.element_type.bits == inst.shape.element_type.bits)
        ):
            return None
        stack.append((inst, True))
        stack.extend((o, False) for o in reversed(inst.operands))
    return order


def _mirrors(a, b, pa, pb, memo: dict) -> bool:
    """Whether `b` computes from parameter `pb` what `a` computes from parameter `pa` (same opcodes,
    shapes, compare attributes and constant values)."""
    pair = (id(a), id(b))  # memo: shared operands are walked once
    if pair not in memo:
        if a is pa or b is pb:
            same = a is pa and b is pb
        elif a is b:
            same = True
        elif a.opcode != b.opcode or a.shape != b.shape or len(a.operands) != len(b.operands):
            same = False
        elif a.opcode == "parameter":
            same = False
        elif a.opcode == "constant":
            same = np.asarray(a.literal).tobytes() == np.asarray(b.literal).tobytes()
        else:
            same = (a.attr("direction"), a.attr("type")) == (b.attr("direction"), b.attr("type")) and all(
                _mirrors(x, y, pa, pb, memo) for x, y in zip(a.operands, b.operands)
            )
        memo[pair] = same
    return memo[pair]


def _compare_type(cmp) -> str | None:
    """The comparison `cmp` makes (its type= or the default for its operands), None for complex."""
    kind = cmp.operands[0].shape.element_type.kind
    ctype = cmp.attr("type") or {"float": "FLOAT", "sint": "SIGNED"}.get(kind, "UNSIGNED")
    valid = ("TOTALORDER", "FLOAT") if kind == "float" else ("SIGNED", "UNSIGNED")
    return ctype if kind != "complex" and ctype in valid else None


def _is_constant(inst, value: int) -> bool:
    return inst.opcode == "constant" and bool(np.all(np.asarray(inst.literal) == value))


def total_order_of(inst) -> Instruction | None:
    """The float `x` when `inst` is its total order by hand, as XLA:CPU's optimized comparators of jax's sorts
    have it: `select(b < 0, b xor MAX, b)`, `b` the bits of `x` (a bitcast to the signed integer of its width,
    MAX that integer's largest value, SIGNED compares): negative floats' magnitude bits flipped, the integer
    `total_order_key` makes, so its signed order is x's TOTALORDER (-NaN < -inf < ... < -0 < +0 < ... < NaN);
    else None."""
    if inst.opcode != "select" or len(inst.operands) != 3 or inst.shape.is_tuple:
        return None
    negative, flipped, bits = inst.operands
    if bits.opcode not in ("bitcast", "bitcast-convert") or bits.operands[0].shape.is_tuple:
        return None
    x = bits.operands[0]
    itype, ftype = bits.shape.element_type, x.shape.element_type
    if itype.kind != "sint" or ftype.kind != "float" or itype.bits != ftype.bits or itype.bits % 8:
        return None
    largest = (1 << (itype.bits - 1)) - 1
    if negative.opcode != "compare" or _compare_type(negative) != "SIGNED":
        return None
    direction = negative.attr("direction")
    if direction not in ("LT", "GT"):
        return None
    left, right = negative.operands if direction == "LT" else negative.operands[::-1]  # (b < 0 or 0 > b)
    if left is not bits or not _is_constant(right, 0):
        return None
    if flipped.opcode != "xor" or not any(
        p is bits and _is_constant(q, largest) for p, q in (flipped.operands, flipped.operands[::-1])
    ):
        return None
    return x


def _compared_key(cmp, directions) -> _SortKey | None:
    """The key f(p2k) when `cmp` is compare(f(p2k), f(p2k+1)) or compare(f(p2k+1), f(p2k)), f elementwise
    over constants, with a direction in `directions` (read with p2k on the left); else None. A SIGNED compare
    of two floats' total orders by hand (`total_order_of`) is read as their TOTALORDER compare."""
    if cmp.opcode != "compare" or len(cmp.operands) != 2 or cmp.attr("direction") not in directions:
        return None
    ctype = _compare_type(cmp)
    a, b = cmp.operands
    floats = total_order_of(a), total_order_of(b)
    if ctype == "SIGNED" and floats[0] is not None and floats[1] is not None:
        (a, b), ctype = floats, "TOTALORDER"
    ea, eb = _expression(a), _expression(b)
    if ctype is None or ea is None or eb is None:
        return None
    pa = [i for i in ea if i.opcode == "parameter"]
    pb = [i for i in eb if i.opcode == "parameter"]
    if len(pa) != 1 or len(pb) != 1:
        return None
    (pa,), (pb,) = pa, pb
    na, nb = pa.parameter_number, pb.parameter_number
    direction = cmp.attr("direction")
    if na > nb:
        a, b, pa, pb, ea, na, nb = b, a, pb, pa, eb, nb, na
        direction = {"LT": "GT", "GT": "LT"}.get(direction, direction)
    if na % 2 or nb != na + 1 or not _mirrors(a, b, pa, pb, {}):
        return None
    return _SortKey(na // 2, pa, tuple(i for i in ea if i is not pa), a, ctype, direction == "GT")


def _ties(eq, key: _SortKey) -> bool:
    """Whether `eq` is compare(f(p2k), f(p2k+1), EQ) for `key`'s f and compare type: true exactly when
    neither element is less by that key."""
    other = _compared_key(eq, ("EQ",))
    if other is None:
        return False
    # (a TOTALORDER EQ beside a FLOAT key, XLA's TopK decomposition's: they part on -0/+0 and NaN only, where the
    # comparator is no strict weak order and XLA leaves the order unspecified)
    kinds = (other.compare_type, key.compare_type)
    return (
        other.operand == key.operand
        and (kinds[0] == kinds[1] or kinds == ("TOTALORDER", "FLOAT"))
        and _mirrors(other.root, key.root, key.parameter, key.parameter, {})
    )


def sort_keys(less) -> list[_SortKey] | None:
    """The keys, most significant first, when the comparator root `less` is one LT/GT compare of a key
    (`_compared_key`) or compares lexicographically: or(lt0, and(eq0, rest)) (jax's form for
    num_keys > 1, either operand order) or select(eq0, rest, lt0); else None."""
    key = _compared_key(less, ("LT", "GT"))
    if key is not None:
        return [key]
    if less.opcode == "or" and len(less.operands) == 2:
        ors = [(x, y) for x, y in (less.operands, less.operands[::-1]) if y.opcode == "and"]
        candidates = [(lt, *pair) for lt, tie in ors for pair in (tie.operands, tie.operands[::-1])]
    elif less.opcode == "select":
        candidates = [(less.operands[2], less.operands[0], less.operands[1])]
    else:
        return None
    for lt, eq, rest in candidates:
        first = _compared_key(lt, ("LT", "GT"))
        if first is not None and _ties(eq, first):
            rest_keys = sort_keys(rest)
            if rest_keys is not None:
                return [first, *rest_keys]
    return None


def _ordering(key: np.ndarray, compare_type: str, descending: bool) -> np.ndarray:
    """An array whose ascending stable argsort orders `key` as compare(LT, or GT when `descending`) of
    `compare_type` does. TOTALORDER: -NaN < -inf < ... < -0 < +0 < ... < NaN via an integer key. FLOAT:
    -0 == +0, NaN last either way (the compare is then no strict weak order: XLA leaves it unspecified)."""
    if compare_type == "FLOAT":
        f = key.astype(np.float64)
        if descending:
            with np.errstate(invalid="ignore"):
                f = -f
        return np.where(f == 0, 0.0, f)
    if compare_type == "TOTALORDER":
        k = total_order_key(key)
    elif key.dtype == np.bool_:
        k = key.astype(np.int8)
    else:
        bits = element_type_of(key.dtype).bits
        key = key.astype(SUB_BYTE_CONTAINER.get(key.dtype, key.dtype), copy=False)  # s4 in its byte
        k = (as_signed if compare_type == "SIGNED" else as_unsigned)(key, bits)
    return ~k if descending else k


def _keys_permutation(keys, steps, xs, axis: int) -> np.ndarray:
    """The stable sorting permutation along `axis` by `keys` (most significant first): each key's
    expression runs once on its whole operand through the prepared kernels `steps`."""
    orderings = []
    for key, key_steps in zip(keys, steps):
        values = {key.parameter: xs[key.operand]}
        for inst, kernel in key_steps:
            values[inst] = kernel(*[values[o] for o in inst.operands])
        value = np.broadcast_to(values[key.root], xs[0].shape)
        orderings.append(_ordering(value, key.compare_type, key.descending))
    if len(orderings) == 1:
        return np.argsort(orderings[0], axis=axis, kind="stable")
    return np.lexsort(orderings[::-1], axis=axis)  # stable; its last key is the primary one


def _comparator_permutation(less, xs, axis: int) -> np.ndarray:
    """The stable sorting permutation along `axis` by calling the comparator `less` per comparison (slow)."""
    moved = [np.moveaxis(x, axis, -1) for x in xs]
    shp = moved[0].shape
    L = shp[-1]
    rows = [m.reshape(-1, L) for m in moved]
    perm_rows = np.empty((rows[0].shape[0], L), np.int64)
    for r in range(rows[0].shape[0]):
        row = [rw[r] for rw in rows]

        def lt(i, j, row=row):
            args = []
            for v in row:
                args += [scalar(v[i]), scalar(v[j])]
            return bool(np.asarray(less(*args)))

        def cmp(i, j, lt=lt):
            if lt(i, j):
                return -1
            if lt(j, i):
                return 1
            return 0

        perm_rows[r] = sorted(range(L), key=functools.cmp_to_key(cmp))
    return np.moveaxis(perm_rows.reshape(shp), -1, axis)


def sort_permutation(comparator, ctx):
    """`permutation(xs, axis)`: the stable permutation sorting the operands `xs` along `axis` by the comparator
    computation (keys on whole arrays when it orders by elementwise functions, else one call per comparison)."""
    keys = sort_keys(comparator.root)
    if keys is not None:
        steps = [[(i, lookup(i).prepare(i, ctx)) for i in key.expression] for key in keys]
        return lambda xs, axis: _keys_permutation(keys, steps, xs, axis)
    less = ctx.computation(comparator)
    return lambda xs, axis: _comparator_permutation(less, xs, axis)


@op(
    "sort",
    kernel="numpy",
    notes="Comparators ordering by elementwise functions of the operands (plain LT/GT compares, jax's "
    "NaN/-0 canonicalizing TOTALORDER compare, XLA:CPU's total order by hand of its bits, lexicographic "
    "num_keys > 1): keys computed on whole "
    "arrays, stable numpy argsort/lexsort. Other comparators: Python stable sort with cmp_to_key per "
    "row (slow). Always stable.",
)
def prepare_sort(inst, ctx):
    dims = ints(inst.attr("dimensions"))
    axis = dims[0] if dims else 0
    comp = called(inst, "to_apply", "comparator")
    n = len(inst.operands)
    shapes = [o.shape for o in inst.operands]
    types = [p.shape.element_type for p in comp.parameters]
    if (
        any(s.is_tuple or s.dims != shapes[0].dims for s in shapes)
        or not 0 <= axis < max(shapes[0].rank, 1)
        or types != [s.element_type for s in shapes for _ in (0, 1)]
    ):
        raise invalid(
            inst,
            f"operands {[s.to_text(False) for s in shapes]} along dimension {axis} with a "
            f"comparator of {[t.name for t in types]}",
        )
    permutation = sort_permutation(comp, ctx)
    tuple_out = inst.shape.is_tuple

    def kernel(*xs):
        perm = permutation(xs, axis)
        outs = [contig(np.take_along_axis(x, perm, axis=axis)) for x in xs]
        return tuple(outs) if tuple_out or n > 1 else outs[0]

    return kernel
