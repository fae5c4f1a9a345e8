"""Top-k and sorting calls: XLA's TopK (CPU and GPU), cub's radix sort, TPU's PartialReduce."""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ..common import called, contig, total_order_key
from ..indexing import sort_permutation
from ..registry import op
from .registry import backend_config, custom_call, field, target_of


def top_k(x: np.ndarray, k: int, largest: bool = True):
    key = total_order_key(x) if x.dtype.kind != "b" else x.astype(np.int8)
    order = np.argsort(~key if largest else key, axis=-1, kind="stable")[..., :k]
    vals = np.take_along_axis(x, order, axis=-1)
    return contig(vals), contig(order.astype(np.int32))


@custom_call("TopK", "__gpu$TopK", operands=1, returns="tuple")
def topk(inst, ctx):
    """k largest (or smallest with largest=false) along the last dim: (values, s32 indices), sorted, ties by
    the lower index, NaN the largest. `__gpu$TopK` (XLA-GPU's top-k kernel) has the same meaning; its kernel
    leaves the order of equal values unspecified."""
    if not inst.shape.is_tuple or len(inst.shape.tuple_shapes) != 2:
        raise UnsupportedError(f"{inst.opcode} must return (values, indices)", inst)
    vshape, ishape = inst.shape.tuple_shapes
    x = inst.operands[0].shape
    if (
        vshape.is_tuple
        or ishape.is_tuple
        or x.is_tuple
        or vshape.rank == 0
        or vshape.rank != x.rank
        or ishape.dims != vshape.dims
        or not ishape.element_type.is_integer
    ):
        raise UnsupportedError(
            f"{inst.opcode} of {x.to_text(False)} must return (values, integer indices) of one "
            f"shape and the operand's rank, got {inst.shape.to_text(False)}",
            inst,
        )
    k = vshape.dims[-1]
    idt = ishape.dtype
    largest = inst.attr("largest", True)

    def kernel(x):
        v, i = top_k(x, k, largest)
        return v.astype(vshape.dtype, copy=False), i.astype(idt, copy=False)

    return kernel


op("topk", kernel="numpy", notes="the topk opcode: k largest (or smallest) along the last dim, stable")(topk)


@custom_call("__cub$DeviceRadixSort", "__cub$DeviceRadixSortUnassignedScratchSize")
def cub_radix_sort(inst, ctx):
    """XLA-GPU's sort by cub::DeviceRadixSort (SortRewriter): keys, or (keys, values), sorted along the last
    dimension by the keys' radix order (integers by value; floats by their bits' total order: -NaN < -inf <
    ... < -0 < +0 < ... < +inf < NaN), ascending or `descending` (backend_config), stable either way; the
    values follow their keys. The last result is cub's u8 scratch (zeros)."""
    leaves = inst.shape.tuple_shapes if inst.shape.is_tuple else ()
    n = len(inst.operands)
    if n not in (1, 2) or len(leaves) != n + 1:
        raise UnsupportedError(
            f"{target_of(inst)} must take keys (and values) and return them with a scratch buffer", inst
        )
    descending = bool(field(backend_config(inst), "descending", False))
    scratch = leaves[-1]

    def kernel(keys, *values):
        key = total_order_key(keys)
        order = np.argsort(~key if descending else key, axis=-1, kind="stable")
        out = [contig(np.take_along_axis(a, order, axis=-1)) for a in (keys, *values)]
        return (*out, np.zeros(scratch.dims, scratch.dtype))

    return kernel


@custom_call("PartialReduce", operands=range(2, 1 << 31))
def partial_reduce(inst, ctx):
    """TPU's first stage of approximate top-k (jax.lax.approx_max_k): operands (values..., init values...) and a
    comparator; the `reduction_dim` of size N is cut into L = N / 2^log2_reduction bins, element i in bin
    i mod L, and each bin keeps its first element in the comparator's order (ties: the lower index); the
    result is the L winners. Which elements share a bin is the TPU's choice; hloexec's strided bins are one
    valid choice, so only the exact top-k the caller sorts out of them is defined."""
    cfg = backend_config(inst)
    if field(cfg, "to_apply_type", "comparator") != "comparator":
        raise UnsupportedError(f"PartialReduce with to_apply_type={field(cfg, 'to_apply_type')!r}", inst)
    dim = int(field(cfg, "reduction_dim", -1))
    log2 = int(field(cfg, "log2_reduction", 0))
    n = len(inst.operands) // 2
    leaves = inst.shape.tuple_shapes if inst.shape.is_tuple else (inst.shape,)
    if n == 0 or len(inst.operands) != 2 * n or len(leaves) != n:
        raise UnsupportedError("PartialReduce takes N operands, N init values and returns N results", inst)
    rank = inst.operands[0].shape.rank
    if rank == 0 or any(o.shape.rank != rank for o in inst.operands[:n]) or any(l.rank != rank for l in leaves):
        raise UnsupportedError("PartialReduce's operands and results must have one rank, at least 1", inst)
    dim = dim % rank
    size = inst.operands[0].shape.dims[dim]
    bins = leaves[0].dims[dim]
    if bins * (1 << log2) != size:
        raise UnsupportedError(f"PartialReduce result dim {bins} is not {size} / 2^{log2}", inst)
    permutation = sort_permutation(called(inst, "called_computations", "to_apply"), ctx)

    def kernel(*xs):
        # [..., N, ...] -> [..., 2^r, L, ...]: element i = (i // L, i % L) so a bin is a column over axis `dim`
        split = [x.reshape(x.shape[:dim] + (size // bins, bins) + x.shape[dim + 1 :]) for x in xs[:n]]
        perm = permutation(split, dim)
        first = np.take(perm, [0], axis=dim)
        return tuple(contig(np.take_along_axis(s, first, axis=dim).squeeze(dim)) for s in split)

    return kernel
