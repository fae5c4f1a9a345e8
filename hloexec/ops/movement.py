"""Data-movement HLO ops: broadcast, reshape, transpose, copy, bitcast, slice, dynamic-slice,
dynamic-update-slice, pad, concatenate, reverse, iota, constant, tuple, get-tuple-element.

Values are logical row-major arrays, so layouts matter only to `bitcast`, which reinterprets the
physical element order (and refuses tiled layouts where tiling would change the meaning).
Ops marked notes="view" may return a view of an operand (values are immutable in the executor);
every other op returns a fresh C-contiguous array.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from ..ir.shape import Shape
from ..kernels.index_maps import NUMPY, clamped_start
from .common import dilated_layout, invalid
from .registry import ALL, op


def _fresh(result: np.ndarray, *operands) -> np.ndarray:
    """`result` as a C-contiguous array that aliases no operand."""
    if not result.flags.c_contiguous:
        return np.array(result, order="C")
    for x in operands:
        if isinstance(x, np.ndarray) and np.may_share_memory(result, x):
            return result.copy()
    return result


def _dims(inst, key="dimensions") -> tuple[int, ...]:
    d = inst.attr(key)
    if d is None:
        raise UnsupportedError(f"{inst.opcode} without {key}=", inst)
    return tuple(int(v) for v in d)


# -- broadcast / reshape / transpose / copy / bitcast -------------------------------------------------
@op("broadcast", dtypes=ALL, notes="dimensions[i] = the output dimension of operand dimension i")
def _prepare_broadcast(inst, ctx):
    out_dims = inst.shape.dims
    dmap = _dims(inst)
    rank = inst.operands[0].shape.rank
    if len(dmap) != rank:
        raise UnsupportedError(f"broadcast dimensions {dmap} do not match operand rank {rank}", inst)
    if len(set(dmap)) != rank or any(
        not 0 <= d < len(out_dims) or out_dims[d] != n for d, n in zip(dmap, inst.operands[0].shape.dims)
    ):
        raise invalid(
            inst,
            f"dimensions={{{','.join(map(str, dmap))}}} map {inst.operands[0].shape.to_text(False)} "
            f"onto {inst.shape.to_text(False)}",
        )
    order = sorted(range(rank), key=lambda i: dmap[i])  # operand dims in output order
    view_shape = [1] * len(out_dims)
    for i in range(rank):
        view_shape[dmap[i]] = inst.operands[0].shape.dims[i]
    needs_transpose = order != list(range(rank))
    dtype = inst.shape.dtype

    def kernel(x):
        if needs_transpose:
            x = x.transpose(order)
        out = np.empty(out_dims, dtype)
        out[...] = x.reshape(view_shape)
        return out

    return kernel


@op("reshape", dtypes=ALL, kernel="numpy", notes="view")
def _prepare_reshape(inst, ctx):
    dims = inst.shape.dims
    if inst.shape.size != inst.operands[0].shape.size:
        raise UnsupportedError(f"reshape of {inst.operands[0].shape.size} elements into {dims}", inst)
    return lambda x: x.reshape(dims)


def transpose_is_view(inst) -> bool:
    """Whether a transpose runs as a strided view of its operand, not a copy: a 2-D one read only by dots, which
    take any strides (BLAS's transposed flag; a low-precision operand is widened in slices of its own layout).
    XLA's layout assignment makes such transposes free (gemma3's [262144,1152] bf16 embedding read as
    {0,1} for the logits): copied, it was 60% of the module's warm run (bench/README.md, "gemma3 1B: the
    embedding read through a view")."""
    return (
        inst.opcode == "transpose"
        and inst.shape.rank == 2
        and _dims(inst) == (1, 0)
        and bool(inst.users)
        and all(u.opcode == "dot" for u in inst.users)
        and inst is not inst.computation.root
    )


@op("transpose", dtypes=ALL, notes="output dim i = operand dim dimensions[i]")
def _prepare_transpose(inst, ctx):
    perm = _dims(inst)
    if sorted(perm) != list(range(inst.operands[0].shape.rank)):
        raise UnsupportedError(f"transpose dimensions {perm} are not a permutation", inst)
    if perm == tuple(range(len(perm))):
        return lambda x: x.copy()
    if transpose_is_view(inst):
        return lambda x: x.T
    rank = len(perm)
    split = perm[0]
    if perm == tuple(range(split, rank)) + tuple(range(split)):  # [A..., B...] -> [B..., A...]: a 2-D transpose
        return lambda x: _swap_halves(x, split)
    return lambda x: np.array(x.transpose(perm), order="C")


PANEL_ROWS = 64  # rows of the source a 2-D transpose copies at a time: 8x numpy's whole-array strided copy


def _swap_halves(x: np.ndarray, split: int) -> np.ndarray:
    """x with dims [:split] and [split:] swapped, as a 2-D [A, B] -> [B, A] transpose copied in panels of
    PANEL_ROWS source rows (a whole-array strided copy misses the cache on every element once the rows are
    long: the 600 MB bf16 embedding of gemma3 took 1.6 s, 0.2 s in panels)."""
    rows = int(np.prod(x.shape[:split], dtype=np.int64))
    cols = int(np.prod(x.shape[split:], dtype=np.int64))
    flat = x.reshape(rows, cols)
    if x.dtype.itemsize in (1, 2, 4, 8) and x.dtype.kind not in "biufc":
        flat = flat.view(f"u{x.dtype.itemsize}")  # ml_dtypes (bf16, fp8) copy through numpy's integer loops
    out = np.empty((cols, rows), flat.dtype)
    for r in range(0, rows, PANEL_ROWS):
        out[:, r : r + PANEL_ROWS] = flat[r : r + PANEL_ROWS].T
    return out.view(x.dtype).reshape(x.shape[split:] + x.shape[:split])


@op("copy", dtypes=ALL, notes="view; logical identity (only the layout may change)")
def _prepare_copy(inst, ctx):
    return lambda x: x


def _physical_order(shape: Shape, inst) -> tuple[int, ...]:
    """Dimensions from major to minor; UnsupportedError naming `inst` where the written layout is no order of the
    shape's dimensions (XLA's verifier refuses it: {5,0} or {1,1} on a rank-2 shape)."""
    written = shape.layout.minor_to_major if shape.layout is not None else ()
    if written and sorted(written) != list(range(shape.rank)):
        raise UnsupportedError(
            f"layout {{{','.join(map(str, written))}}} of {shape.to_text(layout=False)} is not an "
            f"order of its {shape.rank} dimensions",
            inst,
        )
    return tuple(reversed(shape.minor_to_major))


def _is_tiled(shape: Shape) -> bool:
    return shape.layout is not None and bool(shape.layout.tiles)


@op("bitcast", dtypes=ALL, notes="view when layouts are default; reinterprets the physical (layout) order")
def _prepare_bitcast(inst, ctx):
    src, dst = inst.operands[0].shape, inst.shape
    if src.is_tuple or dst.is_tuple:
        if src.same_dims_and_type(dst):
            return lambda x: x
        raise UnsupportedError("bitcast between different tuple shapes", inst)
    src_bytes = src.size * src.element_type.bits
    dst_bytes = dst.size * dst.element_type.bits
    if src_bytes != dst_bytes:
        raise UnsupportedError(f"bitcast {src.to_text()} -> {dst.to_text()} changes the byte size", inst)
    if _is_tiled(src) or _is_tiled(dst):
        return _tiled_bitcast(inst, src, dst)
    if (src.element_type.bits % 8 or dst.element_type.bits % 8) and src.element_type is not dst.element_type:
        raise UnsupportedError("bitcast changing a sub-byte element type", inst)
    src_major = _physical_order(src, inst)
    dst_major = _physical_order(dst, inst)
    src_identity = src_major == tuple(range(src.rank))
    dst_identity = dst_major == tuple(range(dst.rank))
    phys_dims = tuple(dst.dims[d] for d in dst_major)
    back = tuple(int(i) for i in np.argsort(dst_major))  # physical axes -> logical order
    dst_dtype = dst.dtype
    retype = src.element_type is not dst.element_type

    def kernel(x):
        p = x if src_identity else np.array(x.transpose(src_major), order="C")
        if retype:
            p = p.reshape(-1).view(dst_dtype)
        p = p.reshape(phys_dims)
        return p if dst_identity else np.array(p.transpose(back), order="C")

    return kernel


def _tiled_offsets(shape: Shape, inst) -> tuple[np.ndarray, int]:
    """Each element's offset in the tiled buffer (logical index order), and the buffer's padded size.

    XLA tiling: the dims in physical (major-to-minor) order; each tile T(t0..tk-1) splits the k most
    minor dims d into (ceil(d/t), t) pairs, outer parts first, the shape first padded with leading 1s
    when the tile has more dims; later tiles apply to the result's minor dims (so to the tile).
    """
    order = _physical_order(shape, inst)
    sizes = [shape.dims[d] for d in order]
    coords = [c.ravel() for c in np.indices(sizes, dtype=np.int64)] if sizes else []
    n = int(np.prod(sizes, dtype=np.int64))
    for tile in shape.layout.tiles if shape.layout is not None else ():
        if any(t <= 0 for t in tile):
            raise UnsupportedError(f"bitcast with a combined-dimension tile in {shape.to_text()}", inst)
        k = len(tile)
        while len(sizes) < k:
            sizes.insert(0, 1)
            coords.insert(0, np.zeros(n, np.int64))
        outer_sizes = [-(-s // t) for s, t in zip(sizes[-k:], tile)]
        outer = [c // t for c, t in zip(coords[-k:], tile)]
        inner = [c % t for c, t in zip(coords[-k:], tile)]
        sizes = sizes[:-k] + outer_sizes + list(tile)
        coords = coords[:-k] + outer + inner
    flat = np.ravel_multi_index(coords, sizes) if coords else np.zeros(n, np.int64)
    logical = np.asarray(flat).reshape([shape.dims[d] for d in order])
    back = tuple(int(i) for i in np.argsort(order))
    return np.ascontiguousarray(logical.transpose(back)).reshape(-1), int(np.prod(sizes, dtype=np.int64))


def _tiled_bitcast(inst, src: Shape, dst: Shape):
    """A bitcast where a tiled layout is involved: element k of the result is the element stored at the
    buffer offset where the result's layout puts k. Refused where it would read tile padding."""
    if src.element_type is not dst.element_type:
        raise UnsupportedError("bitcast changing the element type of a tiled layout", inst)
    src_offsets, src_buffer = _tiled_offsets(src, inst) if _is_tiled(src) else _untiled_offsets(src, inst)
    dst_offsets, _ = _tiled_offsets(dst, inst) if _is_tiled(dst) else _untiled_offsets(dst, inst)
    holder = np.full(max(src_buffer, int(dst_offsets.max(initial=-1)) + 1), -1, np.int64)
    holder[src_offsets] = np.arange(src.size, dtype=np.int64)
    take = holder[dst_offsets]
    if (take < 0).any():
        raise UnsupportedError(
            "bitcast between tiled layouts that reads tile padding (the tiling changes the element order)", inst
        )
    if np.array_equal(take, np.arange(dst.size)):
        return (lambda x: x) if src.dims == dst.dims else (lambda x: x.reshape(dst.dims))
    dims = dst.dims
    return lambda x: x.reshape(-1)[take].reshape(dims)


def _untiled_offsets(shape: Shape, inst) -> tuple[np.ndarray, int]:
    order = _physical_order(shape, inst)
    flat = np.arange(shape.size, dtype=np.int64).reshape([shape.dims[d] for d in order])
    back = tuple(int(i) for i in np.argsort(order))
    return np.ascontiguousarray(flat.transpose(back)).reshape(-1), shape.size


# -- dynamic dimension sizes -----------------------------------------------------------------------
@op("get-dimension-size", dtypes=ALL, notes="the dimension's size: values are static arrays, so the bound")
def _prepare_get_dimension_size(inst, ctx):
    dims, operand = _dims(inst), inst.operands[0].shape
    if len(dims) != 1 or not 0 <= dims[0] < operand.rank:
        raise invalid(inst, f"dimensions={{{','.join(map(str, dims))}}} of {operand.to_text(False)}")
    size = np.asarray(operand.dims[dims[0]], dtype=inst.shape.dtype)
    return lambda x: size.copy()


@op(
    "set-dimension-size",
    dtypes=ALL,
    notes="view; the operand unchanged: values are static arrays of the bound shape (past the size: padding)",
)
def _prepare_set_dimension_size(inst, ctx):
    return lambda x, size: x


# -- slicing ---------------------------------------------------------------------------------------------
@op("slice", dtypes=ALL, notes="slice={[start:limit:stride], ...}")
def _prepare_slice(inst, ctx):
    spec = inst.attr("slice")
    if spec is None or len(spec) != inst.operands[0].shape.rank:
        raise UnsupportedError("slice without a start:limit:stride for every dimension", inst)
    index = tuple(slice(d.start, d.limit, d.stride) for d in spec)
    return lambda x: np.array(x[index], order="C")


def _clamped_starts(starts, dims, sizes):
    # Python ints: any integer type, unsigned included, without overflow
    return [clamped_start(NUMPY, int(s), False, d, n) for s, d, n in zip(starts, dims, sizes)]


@op(
    "dynamic-slice",
    dtypes=ALL,
    notes="start indices (scalar operands, any integer type) are clamped to [0, dim - size]",
)
def _prepare_dynamic_slice(inst, ctx):
    sizes = _dims(inst, "dynamic_slice_sizes")
    dims = inst.operands[0].shape.dims
    if len(sizes) != len(dims) or len(inst.operands) != 1 + len(dims):
        raise UnsupportedError("dynamic-slice needs one scalar start index per dimension", inst)

    def kernel(x, *starts):
        st = _clamped_starts(starts, dims, sizes)
        return np.array(x[tuple(slice(s, s + n) for s, n in zip(st, sizes))], order="C")

    return kernel


@op("dynamic-update-slice", dtypes=ALL, notes="start indices clamped to [0, dim - update dim]; returns a new array")
def _prepare_dynamic_update_slice(inst, ctx):
    dims = inst.operands[0].shape.dims
    upd = inst.operands[1].shape.dims
    if len(inst.operands) != 2 + len(dims):
        raise UnsupportedError("dynamic-update-slice needs one scalar start index per dimension", inst)

    def kernel(x, u, *starts):
        st = _clamped_starts(starts, dims, upd)
        out = x.copy()
        out[tuple(slice(s, s + n) for s, n in zip(st, upd))] = u
        return out

    return kernel


# -- pad / concatenate / reverse -------------------------------------------------------------------------
def _pad_out_dim(d, p):
    return p.low + p.high + d + max(d - 1, 0) * p.interior


@op("pad", dtypes=ALL, notes="negative low/high crop; interior inserts between elements")
def _prepare_pad(inst, ctx):
    padding = inst.attr("padding")
    in_dims = inst.operands[0].shape.dims
    if padding is None or len(padding) != len(in_dims):
        raise UnsupportedError("pad without low_high_interior for every dimension", inst)
    out_dims = tuple(_pad_out_dim(d, p) for d, p in zip(in_dims, padding))
    if any(d < 0 for d in out_dims) or any(p.interior < 0 for p in padding):
        raise UnsupportedError(f"pad to negative size {out_dims}", inst)
    if out_dims != tuple(inst.shape.dims) or inst.operands[1].shape.rank != 0:
        raise invalid(
            inst,
            f"{inst.operands[0].shape.to_text(False)} padded by "
            f"{inst.operands[1].shape.to_text(False)} (a scalar is needed) makes {list(out_dims)}, "
            f"not {inst.shape.to_text(False)}",
        )
    layout = [dilated_layout(d, p.low, p.high, p.interior + 1) for d, p in zip(in_dims, padding)]
    dst, src = tuple(at for _, at, _ in layout), tuple(element for _, _, element in layout)
    dtype = inst.shape.dtype

    def kernel(x, pad_value):
        out = np.full(out_dims, pad_value, dtype)
        out[dst] = x[src]
        return out

    return kernel


@op("concatenate", dtypes=ALL, notes="dimensions={d}")
def _prepare_concatenate(inst, ctx):
    dims = _dims(inst)
    if len(dims) != 1:
        raise UnsupportedError(f"concatenate along {dims}: exactly one dimension expected", inst)
    axis = dims[0]
    return lambda *xs: np.concatenate(xs, axis=axis) if len(xs) > 1 else xs[0].copy()


@op("reverse", dtypes=ALL, notes="dimensions={...} to flip")
def _prepare_reverse(inst, ctx):
    dims = _dims(inst)
    if not dims:
        return lambda x: x.copy()
    return lambda x: _fresh(np.flip(x, dims), x)


# -- iota / constant -------------------------------------------------------------------------------------
@op("iota", dtypes=ALL, notes="iota_dimension; values converted from the index like convert")
def _prepare_iota(inst, ctx):
    dims = inst.shape.dims
    axis = inst.attr("iota_dimension")
    if axis is None or not 0 <= int(axis) < len(dims):
        raise UnsupportedError(f"iota_dimension {axis!r} out of range for {inst.shape.to_text()}", inst)
    axis = int(axis)
    dtype = inst.shape.dtype
    view = [1] * len(dims)
    view[axis] = dims[axis]
    ramp = np.arange(dims[axis], dtype=np.int64)
    if inst.shape.element_type.kind == "float":
        ramp = ramp.astype(np.float32 if dtype.itemsize <= 4 else np.float64)
    ramp = ramp.astype(dtype).reshape(view)

    def kernel():
        out = np.empty(dims, dtype)
        out[...] = ramp
        return out

    return kernel


@op("constant", dtypes=ALL, notes="view: the literal decoded once, returned read-only")
def _prepare_constant(inst, ctx):
    value = inst.literal
    if isinstance(value, tuple):
        return lambda: value
    arr = np.array(value, dtype=inst.shape.dtype, order="C")
    if arr.shape != inst.shape.dims:
        arr = arr.reshape(inst.shape.dims)
    arr.flags.writeable = False
    return lambda: arr


# -- tuples ----------------------------------------------------------------------------------------------
@op("tuple", dtypes=ALL, notes="view")
def _prepare_tuple(inst, ctx):
    return lambda *xs: tuple(xs)


@op("get-tuple-element", dtypes=ALL, notes="view")
def _prepare_gte(inst, ctx):
    index = inst.attr("index")
    if index is None:
        raise UnsupportedError("get-tuple-element without index=", inst)
    index = int(index)
    n = len(inst.operands[0].shape.tuple_shapes)
    if not 0 <= index < n:
        raise UnsupportedError(f"get-tuple-element index {index} out of range for {n} elements", inst)
    return lambda t: t[index]


OPCODES = (
    "broadcast",
    "reshape",
    "transpose",
    "copy",
    "bitcast",
    "slice",
    "dynamic-slice",
    "dynamic-update-slice",
    "pad",
    "concatenate",
    "reverse",
    "iota",
    "constant",
    "tuple",
    "get-tuple-element",
)
