"""The index meaning of the structural ops, once: which dims of gather, scatter, dot and reduce play which role,
and the formulas giving the operand position an output (or update, or window) element reads or writes -- read
by both tiers, as `kernels/semantics.py` is for the elementwise ops' scalars.

Each op has a geometry decoded from its attributes and static shapes (`Gather`, `Scatter`, `dot_free_dims`,
`reduce_dims`) and formulas over index values, written once against an index arithmetic `ar` with two
interpreters:

* `NUMPY`: index values are int64 arrays (or ints) that broadcast -- the numpy tier (`ops/`) evaluates a
  formula on every position at once (a gather's output index is one `arange` per output dim, each along its
  own axis);
* `SourceIndex`: index values are integer literals, names and `codegen.Ix` expressions -- the generators
  (`kernels/program.py`, `kernels/fusion.py`) evaluate a formula on their loop variables and emit the result;
  literals fold, and `bind` lets a generator name a subexpression that is used more than once.

A formula's conditions (is a scatter window in bounds, does a window position hold an element) are a list,
each a bool array (numpy) or a comparison (source: True / False when it folds); a condition that cannot fail
for the positions a formula is told about is left out.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from ..ir.attributes import DotDims, WindowDim, gather_dims, scatter_dims
from .codegen import Ix, index_operand, need

# An unsigned 64-bit start index saturates here on its way to int64 (every larger one is out of bounds anyway).
U64_INDEX_LIMIT = 2**62


# -- the two interpreters ---------------------------------------------------------------------------------
class _NumpyIndex:
    """Index values are int64 numpy arrays (broadcasting) or ints."""

    add, sub, mul, floordiv, mod = operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod
    ge, le, lt, eq = operator.ge, operator.le, operator.lt, operator.eq

    @staticmethod
    def clamp(x, lo, hi):
        if isinstance(x, int):
            return min(max(x, lo), hi)
        return np.minimum(np.maximum(x, lo), hi)

    @staticmethod
    def as_index(v, u64: bool):
        """A start-index component loaded from the indices array, as int64 (u64 saturated first); one element
        as a Python int (numpy scalar arithmetic costs a microsecond an operation)."""
        if isinstance(v, (int, np.generic)):
            return min(int(v), U64_INDEX_LIMIT) if u64 else int(v)
        if u64:
            return np.minimum(v, np.uint64(U64_INDEX_LIMIT)).astype(np.int64)
        return v.astype(np.int64, copy=False)

    @staticmethod
    def bind(x):
        return x


NUMPY = _NumpyIndex()


class SourceIndex:
    """Index values are int literals, names (source text) and Ix expressions; results fold when they hold no
    name. `name(e)`, when given, turns an expression a formula uses more than once (an Ix, or call text such as
    `np.int64(...)`) into a name -- the generator's way to compute it once."""

    def __init__(self, name=None):
        self._name = name

    @staticmethod
    def _ints(*xs):
        return all(isinstance(x, int) for x in xs)

    def add(self, a, b):
        a, b = index_operand(a), index_operand(b)
        if b == 0:
            return a
        if a == 0:
            return b
        return a + b if self._ints(a, b) else Ix("+", a, b)

    def sub(self, a, b):
        a, b = index_operand(a), index_operand(b)
        if b == 0:
            return a
        return a - b if self._ints(a, b) else Ix("-", a, b)

    def mul(self, a, b):
        a, b = index_operand(a), index_operand(b)
        if a == 0 or b == 0:
            return 0
        if b == 1:
            return a
        return a * b if self._ints(a, b) else Ix("*", a, b)

    def floordiv(self, a, b):
        a, b = index_operand(a), index_operand(b)
        if b == 1:
            return a
        return a // b if self._ints(a, b) else Ix("//", a, b)

    def mod(self, a, b):
        a, b = index_operand(a), index_operand(b)
        return a % b if self._ints(a, b) else Ix("%", a, b)

    def _compare(self, op, fold, a, b):
        a, b = index_operand(a), index_operand(b)
        return fold(a, b) if self._ints(a, b) else Ix(op, a, b, paren=False)

    def ge(self, a, b):
        return self._compare(">=", operator.ge, a, b)

    def le(self, a, b):
        return self._compare("<=", operator.le, a, b)

    def eq(self, a, b):
        return self._compare("==", operator.eq, a, b)

    def lt(self, a, b):
        return self._compare("<", operator.lt, a, b)

    def clamp(self, x, lo, hi):
        x = index_operand(x)
        return min(max(x, lo), hi) if isinstance(x, int) else f"min(max({x}, {lo}), {hi})"

    @staticmethod
    def as_index(v, u64: bool):
        return f"np.int64(min({v}, np.uint64({U64_INDEX_LIMIT})))" if u64 else f"np.int64({v})"

    def bind(self, x):
        x = index_operand(x)
        if self._name is None or isinstance(x, int) or (isinstance(x, str) and x.isidentifier()):
            return x
        return self._name(x)


# -- movement: the operand index an output element reads --------------------------------------------------
def broadcast_source(dimensions, index) -> list:
    """Operand dim i is output dim dimensions[i]."""
    return [index[d] for d in dimensions]


def transpose_source(permutation, index) -> list:
    """Output dim i is operand dim permutation[i]."""
    src = [0] * len(permutation)
    for i, p in enumerate(permutation):
        src[p] = index[i]
    return src


def slice_source(ar, slices, index) -> list:
    """Output element c along a dim sliced by (start, stride) is operand element c * stride + start."""
    return [ar.add(ar.mul(c, stride), start) for c, (start, stride) in zip(index, slices)]


def reverse_source(ar, dims, reversed_dims, index) -> list:
    """Along a reversed dim of n elements, output element c is operand element n - 1 - c."""
    return [ar.sub(n - 1, c) if d in reversed_dims else c for d, (c, n) in enumerate(zip(index, dims))]


def offset_source(ar, starts, index) -> list:
    """A slice starting at `starts` (dynamic-slice's clamped starts): output element c is c + start."""
    return [ar.add(c, s) for c, s in zip(index, starts)]


def reshape_source(ar, in_dims, out_dims, index) -> list:
    """The index into a row-major array of `in_dims` holding the same elements as `out_dims` at `index`: dims
    are grouped by equal running products; a group of one dim each side passes its component through, others
    are linearized on the output side and split on the input side (each step bound: it is used again)."""
    in_dims, out_dims = list(in_dims), list(out_dims)
    result = [0] * len(in_dims)
    i = j = 0
    while i < len(in_dims) or j < len(out_dims):
        gi, gj = [], []
        pi = pj = 1
        if i < len(in_dims):
            gi.append(i)
            pi *= in_dims[i]
            i += 1
        if j < len(out_dims):
            gj.append(j)
            pj *= out_dims[j]
            j += 1
        while pi != pj:
            if pi < pj:
                need(i < len(in_dims), "reshape grouping")
                gi.append(i)
                pi *= in_dims[i]
                i += 1
            else:
                need(j < len(out_dims), "reshape grouping")
                gj.append(j)
                pj *= out_dims[j]
                j += 1
        # trailing size-1 dims join the group
        while i < len(in_dims) and in_dims[i] == 1 and (j >= len(out_dims) or out_dims[j] != 1):
            gi.append(i)
            i += 1
        while j < len(out_dims) and out_dims[j] == 1 and (i >= len(in_dims) or in_dims[i] != 1):
            gj.append(j)
            j += 1
        gi = [d for d in gi if in_dims[d] != 1]
        gj = [d for d in gj if out_dims[d] != 1]
        if not gi:
            continue
        if len(gi) == 1 and len(gj) == 1:
            result[gi[0]] = index[gj[0]]
            continue
        lin = index[gj[0]]
        for d in gj[1:]:
            lin = ar.bind(ar.add(ar.mul(lin, out_dims[d]), index[d]))
        stride = 1
        for d in reversed(gi):
            q = ar.bind(ar.floordiv(lin, stride))
            result[d] = ar.bind(ar.mod(q, in_dims[d])) if d != gi[0] else q
            stride *= in_dims[d]
    return result


def physical_order(shape) -> list:
    """A shape's dims from major to minor (its layout; row-major without one)."""
    return list(reversed(shape.minor_to_major))


def bitcast_source(ar, src, dst, index) -> list:
    """A bitcast between layouts of the same element type: the output element at `index` is the one at the
    same physical position, a reshape between the two physical (major-to-minor) orders."""
    src_order, dst_order = physical_order(src), physical_order(dst)
    physical = reshape_source(
        ar, [src.dims[d] for d in src_order], [dst.dims[d] for d in dst_order], [index[d] for d in dst_order]
    )
    return transpose_source(src_order, physical)


def concatenate_parts(ar, sizes, dim: int, index) -> list:
    """(operand k, conditions, operand index) per operand of a concatenate along `dim` with these sizes: the
    output element at `index` is operand k's at `index - offset` along `dim` where the conditions hold (they
    hold for one operand; conditions that fold are True / False)."""
    parts, off, c = [], 0, index[dim]
    for k, n in enumerate(sizes):
        conds = ([ar.ge(c, off)] if k > 0 else []) + ([ar.lt(c, off + n)] if k < len(sizes) - 1 else [])
        src = list(index)
        src[dim] = ar.sub(c, off)
        parts.append((k, [x for x in conds if x is not True], src))
        off += n
    return parts


# -- dynamic-slice and dynamic-update-slice ----------------------------------------------------------------
def clamped_start(ar, start, u64: bool, n: int, size: int):
    """The start of a dynamic slice of `size` along a dim of `n` (a loaded start index, saturated if u64), moved
    so the slice fits: clamped to [0, n - size] (XLA)."""
    return ar.clamp(ar.as_index(start, u64), 0, n - size)


# -- gather and scatter -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IndexVectors:
    """Where a start-indices array holds its index vectors: along `vector_dim`, one per position of the other
    dims (`batch_axes`, in order). `dims` are the array's, with a trailing 1 when index_vector_dim is its rank
    (XLA: then every index is a vector of one component)."""

    dims: tuple[int, ...]
    vector_dim: int
    batch_axes: tuple[int, ...]
    u64: bool  # the indices are u64 (saturated before they become int64)

    @classmethod
    def of(cls, shape, index_vector_dim: int) -> IndexVectors:
        dims = tuple(shape.dims) + ((1,) if index_vector_dim == shape.rank else ())
        return cls(
            dims,
            index_vector_dim,
            tuple(d for d in range(len(dims)) if d != index_vector_dim),
            shape.element_type.name == "u64",
        )

    def position(self, batch_index, k: int) -> list:
        """The position (in `dims`) of component k of the index vector at `batch_index`: the batch axes are
        all the others, in order."""
        position = list(batch_index)
        position.insert(self.vector_dim, k)
        return position


@dataclass(frozen=True)
class StartIndices:
    """What gather and scatter share: where an index vector's components and the batch position put a slice's
    (a window's) start in the operand -- component k at operand dim `index_map[k]`, the batch position's own
    coordinate at an operand batching dim (`batching`: pairs of an operand dim and the position of its
    indices batching dim among the batch axes), 0 elsewhere."""

    operand_dims: tuple[int, ...]
    vectors: IndexVectors
    index_map: tuple[int, ...]
    batching: tuple[tuple[int, int], ...]

    @staticmethod
    def pairs(vectors: IndexVectors, operand_batching, indices_batching) -> tuple:
        """`batching` from the dimension numbers' operand and indices batching dims."""
        return tuple((od, vectors.batch_axes.index(idd)) for od, idd in zip(operand_batching, indices_batching))

    def components(self, ar, load, batch_index) -> list:
        """The index vector's components at `batch_index`, as int64 index values: `load(position)` reads the
        indices array; each component is bound (named) once."""
        return [
            ar.bind(ar.as_index(load(self.vectors.position(batch_index, k)), self.vectors.u64))
            for k in range(len(self.index_map))
        ]

    def placed(self, components, batch_index) -> list:
        """The operand start index of the index vector of these components at `batch_index`."""
        starts = [0] * len(self.operand_dims)
        for d, c in zip(self.index_map, components):
            starts[d] = c
        for d, pos in self.batching:
            starts[d] = batch_index[pos]
        return starts


@dataclass(frozen=True)
class Gather(StartIndices):
    """A gather's geometry: output dim `offset_dims[j]` walks operand dim `offset_src[j]` within the slice, the
    other output dims (`batch_dims`, in order) are the batch position of an index vector (XLA's
    GatherDimensionNumbers, batching dims included)."""

    operand_dims: tuple[int, ...]
    vectors: IndexVectors
    index_map: tuple[int, ...]
    batching: tuple[tuple[int, int], ...]
    slice_sizes: tuple[int, ...]
    offset_dims: tuple[int, ...]
    offset_src: tuple[int, ...]
    batch_dims: tuple[int, ...]

    @classmethod
    def of(cls, inst) -> Gather:
        gd = gather_dims(inst)
        operand_dims = tuple(inst.operands[0].shape.dims)
        dropped = set(gd.collapsed_slice_dims) | set(gd.operand_batching_dims)
        vectors = IndexVectors.of(inst.operands[1].shape, gd.index_vector_dim)
        return cls(
            operand_dims,
            vectors,
            tuple(gd.start_index_map),
            cls.pairs(vectors, gd.operand_batching_dims, gd.start_indices_batching_dims),
            tuple(gd.slice_sizes),
            tuple(gd.offset_dims),
            tuple(d for d in range(len(operand_dims)) if d not in dropped),
            tuple(d for d in range(inst.shape.rank) if d not in gd.offset_dims),
        )

    def starts(self, ar, load, batch_index) -> list:
        """The slice's start in the operand for the batch position `batch_index`: the index vector's start,
        clamped to [0, n - slice size] per dim (XLA)."""
        starts = self.placed(self.components(ar, load, batch_index), batch_index)
        return [ar.bind(ar.clamp(s, 0, max(n - w, 0))) for s, n, w in zip(starts, self.operand_dims, self.slice_sizes)]

    def source_index(self, ar, starts, offset_index) -> list:
        """The operand index of the slice element at `offset_index` (one component per offset dim)."""
        src = list(starts)
        for d, c in zip(self.offset_src, offset_index):
            src[d] = ar.add(starts[d], c)
        return src


@dataclass(frozen=True)
class Scatter(StartIndices):
    """A scatter's geometry: update dim `window_dims[j]` walks operand dim `window_src[j]` within the window
    (whose full extent per operand dim is `window`, 1 where no update dim walks it), the other update dims
    (`scatter_dims`, in order) are the batch position of an index vector (XLA's ScatterDimensionNumbers,
    batching dims included)."""

    window_dims: tuple[int, ...]
    window_src: tuple[int, ...]
    scatter_dims: tuple[int, ...]
    window: tuple[int, ...]

    @classmethod
    def of(cls, inst) -> Scatter:
        sd = scatter_dims(inst)
        n = (len(inst.operands) - 1) // 2
        operand_dims = tuple(inst.operands[0].shape.dims)
        update_dims = inst.operands[n + 1].shape.dims
        dropped = set(sd.inserted_window_dims) | set(sd.input_batching_dims)
        window_src = tuple(d for d in range(len(operand_dims)) if d not in dropped)
        window = [1] * len(operand_dims)
        for d, ud in zip(window_src, sd.update_window_dims):
            window[d] = update_dims[ud]
        vectors = IndexVectors.of(inst.operands[n].shape, sd.index_vector_dim)
        return cls(
            operand_dims,
            vectors,
            tuple(sd.scatter_dims_to_operand_dims),
            cls.pairs(vectors, sd.input_batching_dims, sd.scatter_indices_batching_dims),
            tuple(sd.update_window_dims),
            window_src,
            tuple(d for d in range(len(update_dims)) if d not in sd.update_window_dims),
            tuple(window),
        )

    def starts(self, ar, load, update_index) -> list:
        """The window's start in the operand for the update element at `update_index` (its scatter dims' part
        picks the index vector)."""
        batch_index = [update_index[d] for d in self.scatter_dims]
        return self.placed(self.components(ar, load, batch_index), batch_index)

    def window_fits(self, ar, starts) -> list:
        """The conditions for the whole window at `starts` to lie inside the operand; a window that does not is
        skipped entirely (XLA)."""
        conds = []
        for s, w, n in zip(starts, self.window, self.operand_dims):
            low, high = ar.ge(s, 0), ar.le(ar.add(s, w), n)
            if low is not True:
                conds.append(low)
            if high is not True:
                conds.append(high)
        return conds

    def operand_index(self, ar, starts, update_index) -> list:
        """The operand index the update element at `update_index` combines into."""
        dst = list(starts)
        for d, ud in zip(self.window_src, self.window_dims):
            dst[d] = ar.add(starts[d], update_index[ud])
        return dst


# -- windows ------------------------------------------------------------------------------------------------
def window_position(ar, w: WindowDim, out, k):
    """The position, in the padded and base-dilated operand, of element k of output element `out`'s window
    along one dim: out * stride + k * window_dilation."""
    return ar.add(ar.mul(out, w.stride), ar.mul(k, w.window_dilation))


def window_span(w: WindowDim, out_n: int) -> int:
    """The last position a window of output dim size `out_n` reaches (window_position's maximum)."""
    return (out_n - 1) * w.stride + (w.size - 1) * w.window_dilation


def dilated_element(ar, n: int, low: int, base: int, p, p_last: int):
    """(operand index, conditions): what position p holds along a dim of n elements padded by `low` in front
    (negative: cropped) and base-dilated by `base` (base - 1 holes between elements; pad's interior + 1): the
    element (p - low) / base when the conditions hold, else padding or a hole. For 0 <= p <= p_last."""
    q = ar.bind(ar.sub(p, low))
    conds = []
    if low > 0:
        conds.append(ar.ge(q, 0))
    if p_last - low > (n - 1) * base:
        conds.append(ar.le(q, (n - 1) * base))
    if base > 1:
        conds.append(ar.eq(ar.mod(q, base), 0))
        q = ar.bind(ar.floordiv(q, base))
    return q, [c for c in conds if c is not True]


# -- dot and reduce -----------------------------------------------------------------------------------------
def dot_free_dims(d: DotDims, lhs_rank: int, rhs_rank: int) -> tuple[list[int], list[int]]:
    """The lhs and rhs dims that are neither batch nor contracting. A dot's result dims are its batch dims,
    then the lhs free dims, then the rhs free dims, each in order (XLA's DotGeneral)."""
    return (
        [k for k in range(lhs_rank) if k not in d.lhs_batch and k not in d.lhs_contracting],
        [k for k in range(rhs_rank) if k not in d.rhs_batch and k not in d.rhs_contracting],
    )


def reduce_dims(rank: int, dimensions) -> tuple[list[int], list[int]]:
    """(kept dims, reduced dims): the result's dims are the kept ones in order; the reduced ones, sorted, are
    the row-major order a fold takes the elements in."""
    reduced = sorted(dimensions)
    return [d for d in range(rank) if d not in reduced], reduced
