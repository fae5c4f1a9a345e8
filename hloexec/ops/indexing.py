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
* sort: `dimensions={d}`, several operands, comparator on 2N scalars. Fast path when the comparator is
  one LT/GT compare of parameters 0 and 1: stable numpy argsort (TOTALORDER: -NaN < -inf < ... < -0 <
  +0 < ... < inf < NaN via an integer key; default FLOAT compare: -0 == +0, NaN sorts last ascending /
  last descending -- XLA leaves NaN placement of a non-total compare unspecified). Any other comparator:
  Python's stable sort with functools.cmp_to_key per row (slow). is_stable=false sorts stably too.
"""
from __future__ import annotations

import functools

import numpy as np

from ..errors import UnsupportedError
from ..ir.attributes import gather_dims, scatter_dims
from .common import as_tuple, binary_kind, called, contig, ints, scalar, str_attr, ufunc_for
from .registry import op


def _full_starts(indices, ivd, index_map, op_batch, idx_batch, operand_rank):
    """(batch_shape, starts[B, operand_rank] int64): the full start index of every index vector,
    batching dims filled with the iota of their indices dim."""
    idx = np.asarray(indices)
    if ivd == idx.ndim:
        idx = idx[..., None]
    batch_axes = [d for d in range(idx.ndim) if d != ivd]
    batch_shape = tuple(idx.shape[d] for d in batch_axes)
    vec = np.moveaxis(idx, ivd, -1).reshape(-1, idx.shape[ivd])
    if vec.dtype.kind == "u" and vec.dtype.itemsize == 8:
        vec = np.minimum(vec, np.uint64(2 ** 62)).astype(np.int64)
    else:
        vec = vec.astype(np.int64)
    B = vec.shape[0]
    starts = np.zeros((B, operand_rank), np.int64)
    for k, d in enumerate(index_map):
        starts[:, d] = vec[:, k]
    if op_batch:
        grids = np.indices(batch_shape).reshape(len(batch_shape), -1) if batch_shape else np.zeros((0, 1), np.int64)
        for od, idd in zip(op_batch, idx_batch):
            pos = batch_axes.index(idd)   # position of that indices dim among the batch dims
            starts[:, od] = grids[pos]
    return batch_shape, starts


@op("gather", kernel="numpy",
    notes="Full GatherDimensionNumbers incl. batching dims; start indices clamped per XLA; one numpy "
          "advanced-indexing gather.")
def prepare_gather(inst, ctx):
    gd = gather_dims(inst)
    oshape = inst.operands[0].shape
    rank = oshape.rank
    slice_sizes = tuple(gd.slice_sizes)
    dropped = set(gd.collapsed_slice_dims) | set(gd.operand_batching_dims)
    offset_src = [d for d in range(rank) if d not in dropped]
    if len(offset_src) != len(gd.offset_dims):
        raise UnsupportedError("gather: offset_dims do not match the uncollapsed slice dims", inst)
    out_rank = inst.shape.rank
    out_dtype = inst.shape.dtype

    def kernel(operand, indices):
        batch_shape, starts = _full_starts(indices, gd.index_vector_dim, gd.start_index_map,
                                           gd.operand_batching_dims, gd.start_indices_batching_dims, rank)
        hi = np.array([operand.shape[d] - slice_sizes[d] for d in range(rank)], np.int64)
        starts = np.clip(starts, 0, np.maximum(hi, 0))
        B = starts.shape[0]
        # advanced index arrays of shape (B, *kept slice sizes)
        kept = [slice_sizes[d] for d in offset_src]
        nk = len(kept)
        idx = []
        for d in range(rank):
            shp = [B] + [1] * nk
            s = starts[:, d].reshape(shp)
            if d in offset_src:
                j = offset_src.index(d)
                r = np.arange(slice_sizes[d], dtype=np.int64).reshape([1] + [slice_sizes[d] if i == j else 1
                                                                             for i in range(nk)])
                s = s + r
            idx.append(s)
        g = operand[tuple(idx)] if rank else np.broadcast_to(operand, [B] + kept)
        g = g.reshape(tuple(batch_shape) + tuple(kept))
        nb = len(batch_shape)
        src = [None] * out_rank
        for j, od in enumerate(gd.offset_dims):
            src[od] = nb + j
        it = iter(range(nb))
        for i in range(out_rank):
            if src[i] is None:
                src[i] = next(it)
        return contig(g.transpose(src), dtype=out_dtype)
    return kernel


@op("scatter", kernel="numpy",
    notes="Full ScatterDimensionNumbers incl. batching dims; variadic; out-of-bounds update windows "
          "skipped (XLA). add/mul/max/min/and/or/xor/replace vectorized (ufunc.at); other update "
          "computations per element (slow).")
def prepare_scatter(inst, ctx):
    n = (len(inst.operands) - 1) // 2
    sd = scatter_dims(inst)
    rank = inst.operands[0].shape.rank
    comp = called(inst, "to_apply")
    kind = binary_kind(comp) if n == 1 else None
    fn = None if kind is not None else ctx.computation(comp)
    tuple_out = inst.shape.is_tuple
    dropped = set(sd.inserted_window_dims) | set(sd.input_batching_dims)
    win_src = [d for d in range(rank) if d not in dropped]   # operand dims fed by update window dims
    if len(win_src) != len(sd.update_window_dims):
        raise UnsupportedError("scatter: update_window_dims do not match the operand's window dims", inst)

    def kernel(*vals):
        operands, indices, updates = vals[:n], vals[n], vals[n + 1:]
        oshape = operands[0].shape
        upd_shape = updates[0].shape
        scatter_axes = [d for d in range(len(upd_shape)) if d not in sd.update_window_dims]
        batch_shape, starts = _full_starts(indices, sd.index_vector_dim, sd.scatter_dims_to_operand_dims,
                                           sd.input_batching_dims, sd.scatter_indices_batching_dims, rank)
        B = starts.shape[0]
        wsizes = [upd_shape[d] for d in sd.update_window_dims]
        full_w = [1] * rank
        for d, w in zip(win_src, wsizes):
            full_w[d] = w
        ok = np.all((starts >= 0) & (starts + np.array(full_w, np.int64) <= np.array(oshape, np.int64)), axis=1)
        # updates as (B, window...) in row-major order of updates' scatter dims, then window dims
        perm = scatter_axes + list(sd.update_window_dims)
        W = int(np.prod(wsizes, dtype=np.int64))
        ups = [contig(u.transpose(perm)).reshape(B, W) for u in updates]
        # operand flat index for each (b, w)
        wgrid = np.indices(wsizes).reshape(len(wsizes), W) if wsizes else np.zeros((0, 1), np.int64)
        full = np.repeat(starts[:, :, None], W, axis=2)           # (B, rank, W)
        for j, d in enumerate(win_src):
            full[:, d, :] += wgrid[j][None, :]
        ostrides = np.array([int(np.prod(oshape[d + 1:], dtype=np.int64)) for d in range(rank)], np.int64)
        flat_idx = np.einsum("brw,r->bw", full, ostrides) if rank else np.zeros((B, W), np.int64)
        # row-major order over the updates array = order of (b, w) only if window dims follow scatter dims;
        # order by the updates' own linear index to match XLA's row-major iteration.
        upd_lin = np.arange(int(np.prod(upd_shape, dtype=np.int64)), dtype=np.int64).reshape(upd_shape)
        order = np.argsort(upd_lin.transpose(perm).reshape(B * W), kind="stable")
        fi = flat_idx.reshape(-1)[order]
        keep = np.repeat(ok, W)[order]
        fi = fi[keep]
        uvals = [u.reshape(-1)[order][keep] for u in ups]
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


# -- sort --------------------------------------------------------------------------------------
def total_order_key(x: np.ndarray) -> np.ndarray:
    """An integer key whose order is XLA's total order (floats: -NaN < -inf < ... < -0 < +0 < ... < NaN)."""
    dt = x.dtype
    if dt == np.bool_:
        return x.astype(np.int8)
    if dt.kind in "iu":
        return x
    if dt.kind == "c":
        raise TypeError("complex sort key")
    bits = dt.itemsize * 8
    it = np.dtype(f"i{dt.itemsize}")
    b = contig(x).view(it)
    mask = np.array(np.iinfo(it).max, it)
    return b ^ ((b >> np.array(bits - 1, it)) & mask)


def _sort_fast_kind(comp):
    """('LT'|'GT', total) when comp is compare(p0, p1, direction=LT|GT[, type=...])."""
    params, root = comp.parameters, comp.root
    if root.opcode != "compare" or len(root.operands) != 2 or len(params) < 2:
        return None
    if root.operands[0] is not params[0] or root.operands[1] is not params[1]:
        if root.operands[0] is params[1] and root.operands[1] is params[0]:
            d = str_attr(root, "direction")
            flip = {"LT": "GT", "GT": "LT"}.get(d)
            if flip is None:
                return None
            return flip, (str_attr(root, "type") or "").upper() == "TOTALORDER"
        return None
    d = str_attr(root, "direction")
    if d not in ("LT", "GT"):
        return None
    return d, (str_attr(root, "type") or "").upper() == "TOTALORDER"


def sort_permutation(key: np.ndarray, axis: int, descending: bool, total: bool) -> np.ndarray:
    if key.dtype.kind == "f" or key.dtype.kind == "V" or (key.dtype.kind not in "iub"):
        if total:
            k = total_order_key(key)
            return np.argsort(~k if descending else k, axis=axis, kind="stable")
        k = key.astype(np.float64)
        if descending:
            with np.errstate(invalid="ignore"):
                k = -k
        k = np.where(k == 0, 0.0, k)  # -0 == +0 under a FLOAT compare
        return np.argsort(k, axis=axis, kind="stable")
    k = total_order_key(key)
    return np.argsort(~k if descending else k, axis=axis, kind="stable")


@op("sort", kernel="numpy",
    notes="Comparator = one LT/GT compare of operand 0: stable argsort (TOTALORDER via integer keys). "
          "Other comparators: Python stable sort with cmp_to_key per row (slow). Always stable.")
def prepare_sort(inst, ctx):
    dims = ints(inst.attr("dimensions"))
    axis = dims[0] if dims else 0
    comp = called(inst, "to_apply", "comparator")
    fast = _sort_fast_kind(comp)
    n = len(inst.operands)
    tuple_out = inst.shape.is_tuple
    fn = None if fast is not None else ctx.computation(comp)

    def kernel(*xs):
        if fast is not None:
            direction, total = fast
            perm = sort_permutation(xs[0], axis, direction == "GT", total)
        else:
            moved = [np.moveaxis(x, axis, -1) for x in xs]
            shp = moved[0].shape
            L = shp[-1]
            rows = [m.reshape(-1, L) for m in moved]
            perm_rows = np.empty((rows[0].shape[0], L), np.int64)
            for r in range(rows[0].shape[0]):
                row = [rw[r] for rw in rows]

                def less(i, j, row=row):
                    args = []
                    for v in row:
                        args += [scalar(v[i]), scalar(v[j])]
                    return bool(np.asarray(fn(*args)))

                def cmp(i, j, less=less):
                    if less(i, j):
                        return -1
                    if less(j, i):
                        return 1
                    return 0
                perm_rows[r] = sorted(range(L), key=functools.cmp_to_key(cmp))
            perm = np.moveaxis(perm_rows.reshape(shp), -1, axis)
        outs = [contig(np.take_along_axis(x, perm, axis=axis)) for x in xs]
        return tuple(outs) if tuple_out or n > 1 else outs[0]
    return kernel
