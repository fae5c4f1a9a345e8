"""Contractions: dot, convolution, fft, cholesky, triangular-solve.

* dot: general dimension numbers; result dims = batch, lhs free, rhs free (XLA's DotGeneral).
  `preferred_element_type` is just the result type. Operands are converted to a compute type and
  multiplied with numpy matmul (BLAS for f32/f64/c64/c128): f16/bf16/f8 results accumulate in f32 and
  round once; integer results are exact with wrap-around in the result type (operands converted to the
  result type first); pred is OR of ANDs. XLA:CPU uses Eigen for f32, so f32 results differ by reassociation
  only (<= K*eps*sum|a*b|). The run's device profile picks the dot's algorithm (its `algorithm=`, or what its
  operand_precision means on the device: kernels/dot_algorithms.py); an algorithm other than the plain one
  is computed by its recipe (`algorithm_dot`).
* convolution: composed as StableHLO's reference interpreter does: split feature/batch groups, base
  dilation + padding via pad (negative padding crops), window reversal by flipping the kernel, a
  strided (window-stride, window-dilation) view of the padded input, and a tensordot over
  (input feature, window) against the kernel. Same compute types as dot.
* fft: FFT/IFFT/RFFT/IRFFT via numpy.fft (computed in complex128, rounded to c64 for c64).
"""

from __future__ import annotations

import functools
import math
import operator

import numpy as np

from ..errors import UnsupportedError
from ..ir.attributes import DotDims, dot_dims
from ..ir.compiled_for import ynn_computations
from ..ir.dtypes import element_type, element_type_of
from ..kernels import blas
from ..kernels import elementwise as ew
from ..kernels.dot_algorithms import contract, device_algorithm, dot_algorithm_of, fp8_fast_accumulation, triton_split_k
from ..kernels.index_maps import dot_free_dims
from .common import contig, int_attr, ints, invalid, is_low_float, required, str_attr
from .elementwise import convert_kernel, f32_to_low, float_lifted, low_to_f32
from .reduction import pad_dilate, window_out_shape
from .registry import op

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def compute_dtype(out_dtype):
    """The dtype a dot/conv producing `out_dtype` accumulates in (kernels/elementwise.py's `dot_accumulator`)."""
    return element_type(ew.dot_accumulator(element_type_of(out_dtype).name)).numpy


def finish(r, out_dtype):
    out_dtype = np.dtype(out_dtype)
    if out_dtype == np.bool_:
        return contig(r != 0)
    if is_low_float(out_dtype):
        return contig(f32_to_low(np.asarray(r), out_dtype))
    return contig(np.asarray(r).astype(out_dtype, copy=False))


def to_compute(x, cdt):
    if x.dtype == cdt:
        return x
    if x.dtype == np.bool_ or cdt.kind in "iu":
        return x.astype(cdt)  # ints wrap as XLA's convert does for in-range values
    if is_low_float(x.dtype):
        return low_to_f32(x, quiet=False).astype(cdt, copy=False)  # exact; the arithmetic quiets NaNs
    return x.astype(cdt)


# A low-precision operand is converted to f32 this many elements at a time when it is the big one (a
# vocabulary projection's bf16 weights: 302 M elements would become a 1.2 GB f32 copy per call).
CONVERT_CHUNK = 1 << 22


@functools.lru_cache(maxsize=4096)
def _dot_plan(lhs_shape, rhs_shape, lb, rb, lc, rc):
    """(lhs permutation, rhs permutation, [B, M, K], [B, K, N], result shape) of a DotGeneral: worked out once
    per shapes, not per call (a step's small dots spent ~20 us each on it)."""
    lf, rf = dot_free_dims(DotDims(lb, rb, lc, rc), len(lhs_shape), len(rhs_shape))
    B = math.prod(lhs_shape[d] for d in lb)
    M = math.prod(lhs_shape[d] for d in lf)
    N = math.prod(rhs_shape[d] for d in rf)
    K = math.prod(lhs_shape[d] for d in lc)
    out_shape = tuple(lhs_shape[d] for d in lb) + tuple(lhs_shape[d] for d in lf) + tuple(rhs_shape[d] for d in rf)
    return list(lb) + lf + list(lc), list(rb) + list(rc) + rf, (B, M, K), (B, K, N), out_shape


def dot_general(lhs, rhs, lb, rb, lc, rc, out_dtype):
    """XLA DotGeneral on numpy arrays; result dims = batch, lhs free, rhs free."""
    return _planned_dot(lhs.shape, rhs.shape, tuple(lb), tuple(rb), tuple(lc), tuple(rc), np.dtype(out_dtype))(lhs, rhs)


@functools.lru_cache(maxsize=4096)
def _planned_dot(lhs_shape, rhs_shape, lb, rb, lc, rc, out_dtype):
    """kernel(lhs, rhs): the DotGeneral of operands of these shapes with all but the product worked out once per
    shapes (a small dot's ~10 us of dtype checks and planning per call was most of its time)."""
    cdt = compute_dtype(out_dtype)
    lperm, rperm, a_shape, b_shape, out_shape = _dot_plan(lhs_shape, rhs_shape, lb, rb, lc, rc)
    if a_shape[2] == 0:
        return lambda lhs, rhs: finish(np.zeros(out_shape, cdt), out_dtype)
    converts = is_low_float(out_dtype) or out_dtype != cdt

    def kernel(lhs, rhs):
        a = lhs.transpose(lperm).reshape(a_shape)
        b = rhs.transpose(rperm).reshape(b_shape)
        with np.errstate(all="ignore"):
            if converts or a.dtype != cdt or b.dtype != cdt:
                r = _matmul_converting(a, b, cdt, out_dtype)
            else:  # operands and result in the compute type: nothing to widen or narrow
                r = blas.matmul(a, b)
        r = r.reshape(out_shape)
        return contig(r) if r.dtype == out_dtype else finish(r, out_dtype)

    return kernel


def algorithm_dot(
    alg, lhs, rhs, lb, rb, lc, rc, out_dtype, device, inst=None, fast_accumulation=False, split_k: int = 1
):
    """DotGeneral under the dot algorithm `alg` as `device` computes it (kernels/dot_algorithms.py), the result
    rounded once to `out_dtype`; `fast_accumulation`: an fp8 GEMM without promoted partial sums; `split_k`: the
    contracting elements cut into that many consecutive slices (the last one shorter, as XLA pads K), each
    slice's dot apart, the partial results added in f32 in slice order (split_k_gemm_rewriter.cc, partial sums
    reduced in f32: xla_gpu_triton_gemm_disable_reduced_precision_reduction)."""
    lperm, rperm, a_shape, b_shape, out_shape = _dot_plan(
        lhs.shape, rhs.shape, tuple(lb), tuple(rb), tuple(lc), tuple(rc)
    )
    wide = _F64 if alg == "dot_f64_f64_f64" else _F32
    a = to_compute(lhs.transpose(lperm).reshape(a_shape), wide)
    b = to_compute(rhs.transpose(rperm).reshape(b_shape), wide)
    K = a_shape[2]
    if K == 0:
        return finish(np.zeros(out_shape, wide), out_dtype)
    step = -(-K // split_k)
    parts = (
        contract(
            alg,
            a[:, :, k : k + step],
            b[:, k : k + step],
            lambda x, y, dtype: blas.matmul(x, y),
            device,
            k_axes=(2, 1),
            fast_accumulation=fast_accumulation,
            inst=inst,
        )
        for k in range(0, K, step)
    )
    r = functools.reduce(operator.add, parts)  # in slice order
    return finish(r.reshape(out_shape), out_dtype)


def _matmul_converting(a, b, cdt, out_dtype):
    """[B, M, K] @ [B, K, N] in `cdt`, the product in `out_dtype` if that is f16/bf16/f8 (else in `cdt`).
    Low-precision operands are widened and a low-precision product rounded inside blas.matmul's blocks. A
    big low-precision operand beside a small one is multiplied in slices of its free dim as well (fixed by the
    shapes: the same bits every run), so that no f32 copy of it is made whole."""
    B, M, K = a.shape
    N = b.shape[2]
    convert = dict(
        widen=(lambda x: to_compute(x, cdt)) if a.dtype != cdt or b.dtype != cdt else None,
        narrow=(lambda r: f32_to_low(r, out_dtype)) if is_low_float(out_dtype) else None,
        dtype=out_dtype if is_low_float(out_dtype) else cdt,
    )
    if cdt.kind in "iu":  # integer and pred products: numpy's exact loops in the result type
        return blas.matmul(to_compute(a, cdt), to_compute(b, cdt))
    big_b = is_low_float(b.dtype) and b.size > CONVERT_CHUNK and N > M
    big_a = is_low_float(a.dtype) and a.size > CONVERT_CHUNK and M > N
    if not (big_a or big_b):
        return blas.matmul(a, b, **convert)
    step = max(1, CONVERT_CHUNK // max(B * K, 1))
    out = np.empty((B, M, N), convert["dtype"])
    if big_b:
        a = to_compute(a, cdt)
        for n in range(0, N, step):
            out[:, :, n : n + step] = blas.matmul(a, b[:, :, n : n + step], **convert)
        return out
    b = to_compute(b, cdt)
    for m in range(0, M, step):
        out[:, m : m + step] = blas.matmul(a[:, m : m + step], b, **convert)
    return out


def _dot_dims(inst):
    """(lhs batch, rhs batch, lhs contracting, rhs contracting) dims, checked against the operand shapes as
    XLA's dot shape inference does (pairs of equal sizes, each dim once, in range)."""
    d = dot_dims(inst)
    lb, rb, lc, rc = tuple(d.lhs_batch), tuple(d.rhs_batch), tuple(d.lhs_contracting), tuple(d.rhs_contracting)
    lhs, rhs = inst.operands[0].shape, inst.operands[1].shape
    if (
        len(lb) != len(rb)
        or len(lc) != len(rc)
        or len(set(lb + lc)) != len(lb + lc)
        or len(set(rb + rc)) != len(rb + rc)
        or any(not 0 <= x < lhs.rank for x in lb + lc)
        or any(not 0 <= x < rhs.rank for x in rb + rc)
        or any(lhs.dims[a] != rhs.dims[b] for a, b in zip(lb + lc, rb + rc))
    ):
        raise invalid(
            inst,
            f"batch dims {list(lb)}/{list(rb)} and contracting dims {list(lc)}/{list(rc)} of "
            f"{lhs.to_text(False)} and {rhs.to_text(False)}",
        )
    return lb, rb, lc, rc


@op(
    "dot",
    kernel="blas",
    notes="DotGeneral: numpy matmul (BLAS for f32/f64/complex); f16/bf16/f8 accumulate in f32 and round "
    "once; integers exact (wrap-around) in the result type; algorithm= and operand_precision as the "
    "device profile computes them (--device; reference: algorithm= honoured, precision ignored).",
)
def prepare_dot(inst, ctx):
    if len(inst.operands) != 2:
        raise UnsupportedError("dot with sparsity metadata operands", inst)
    lb, rb, lc, rc = _dot_dims(inst)
    out_dtype = inst.shape.dtype
    device = ctx.options.device
    alg = dot_algorithm_of(inst, device)
    split = triton_split_k(inst) if device.split_k and compute_dtype(out_dtype) == _F32 else 1
    fast = fp8_fast_accumulation(
        device,
        inst.attr("algorithm"),
        inst.attr("operand_precision"),
        *(o.shape.element_type.name for o in inst.operands),
    )
    if alg or split > 1 or fast:
        return lambda lhs, rhs: algorithm_dot(alg, lhs, rhs, lb, rb, lc, rc, out_dtype, device, inst, fast, split)
    if in_ynn_dot_order(inst, ctx):
        return lambda lhs, rhs: ynn_dot_general(lhs, rhs, lb, rb, lc, rc)

    def kernel(lhs, rhs):
        return dot_general(lhs, rhs, lb, rb, lc, rc, out_dtype)

    return kernel


def in_ynn_dot_order(inst, ctx) -> bool:
    """Whether dot `inst` sums in YNNPACK's order: under reductions="xla-cpu", an f32 x f32 -> f32 dot inside a
    computation XLA:CPU runs through YNNPACK."""
    comp = inst.computation
    return (
        ctx.options.reductions == "xla-cpu"
        and comp is not None
        and comp.module is not None
        and comp.name in ynn_computations(comp.module)
        and all(t.shape.dtype == _F32 for t in (inst, *inst.operands))
    )


def ynn_dot_general(lhs, rhs, lb, rb, lc, rc):
    """DotGeneral of f32 arrays in YNNPACK's order (kernels/ynn_dot.py)."""
    from ..kernels.ynn_dot import ynn_matmul

    lperm, rperm, a_shape, b_shape, out_shape = _dot_plan(
        lhs.shape, rhs.shape, tuple(lb), tuple(rb), tuple(lc), tuple(rc)
    )
    with np.errstate(all="ignore"):
        return ynn_matmul(lhs.transpose(lperm).reshape(a_shape), rhs.transpose(rperm).reshape(b_shape)).reshape(
            out_shape
        )


# -- ragged-dot, scaled-dot ------------------------------------------------------------------
def _ragged_layout(inst):
    """(mode, group_sizes prefix dims of the lhs) of a ragged-dot, checked as StableHLO's
    checkRaggedDotConstraints: the ragged lhs dim is a batch, contracting or (else) non-contracting dim;
    group_sizes is [g] (broadcast) or [lhs dims before it of its kind (batch dims first)..., g]."""
    lb, rb, lc, rc = _dot_dims(inst)
    ragged, group = ints(inst.attr("lhs_ragged_dims")), ints(inst.attr("rhs_group_dims"))
    if len(inst.operands) != 3 or len(ragged) != 1:
        raise UnsupportedError(
            f"ragged-dot with {len(inst.operands)} operands and lhs_ragged_dims={list(ragged)} "
            "(3 operands and one ragged dim expected)",
            inst,
        )
    r = ragged[0]
    if not 0 <= r < inst.operands[0].shape.rank:
        raise invalid(inst, f"lhs_ragged_dims={{{r}}} of {inst.operands[0].shape.to_text(False)}")
    if r in lb:
        mode, prefix = "batch", lb[: lb.index(r)]
    elif r in lc:
        mode, prefix = "contracting", lb + lc[: lc.index(r)]
    else:
        mode, prefix = "non-contracting", lb + tuple(d for d in range(r) if d not in lb and d not in lc)
    lhs, rhs, sizes = inst.operands[0].shape, inst.operands[1].shape, inst.operands[2].shape
    free = [lhs.dims[d] for d in range(lhs.rank) if d not in lb and d not in lc]
    rhs_free = [rhs.dims[d] for d in range(rhs.rank) if d not in rb and d not in rc and d not in group]
    result = (
        (sizes.dims[-1:] if mode == "contracting" else ())
        + tuple(lhs.dims[d] for d in lb)
        + tuple(free)
        + tuple(rhs_free)
    )
    if sizes.rank < 1 or inst.shape.dims != result or any(not 0 <= g < rhs.rank for g in group):
        raise invalid(
            inst,
            f"a result {inst.shape.to_text(False)} for {lhs.to_text(False)}, {rhs.to_text(False)} "
            f"and group sizes {sizes.to_text(False)} ({list(result)} expected)",
        )
    if len(group) != (mode == "non-contracting") or (
        sizes.rank != 1 and (sizes.rank != len(prefix) + 1 or sizes.dims[:-1] != tuple(lhs.dims[d] for d in prefix))
    ):
        raise UnsupportedError(
            f"ragged-dot ({mode} ragged dim) with rhs_group_dims={list(group)} and group_sizes "
            f"{sizes.to_text(False)}: XLA's shape rules reject it",
            inst,
        )
    return mode, prefix


@op(
    "ragged-dot",
    kernel="blas",
    notes="lhs_ragged_dims splits one lhs dim into consecutive groups of "
    "group_sizes (per index of the lhs dims before it when group_sizes has more than one dim): a non-contracting "
    "ragged dim multiplies each group's rows with its rhs_group_dims slice of the rhs, rows past the groups are 0; "
    "a contracting one gives one dot per group (a leading group dim); a batch one is a plain dot. Compute types "
    "and the device's dot algorithm as dot",
)
def prepare_ragged_dot(inst, ctx):
    lb, rb, lc, rc = _dot_dims(inst)
    mode, _ = _ragged_layout(inst)
    r = ints(inst.attr("lhs_ragged_dims"))[0]
    out_dtype = inst.shape.dtype
    cdt = compute_dtype(out_dtype)
    dot = device_dot(
        inst, ctx, inst.operands[0].shape.element_type, inst.operands[1].shape.element_type, inst.shape.element_type
    )
    if mode == "batch":
        return lambda lhs, rhs, group_sizes: dot(lhs, rhs, lb, rb, lc, rc, out_dtype)
    broadcast = inst.operands[2].shape.rank == 1
    rank = inst.operands[0].shape.rank

    def masks(lhs, group_sizes):
        return ragged_masks(inst, lhs.shape, group_sizes)

    def where(mask, x):
        return np.where(mask, x, np.zeros((), x.dtype))

    if mode == "contracting":
        rr = rc[lc.index(r)]

        def kernel(lhs, rhs, group_sizes):
            if broadcast:  # one slice of k per group on both sides
                bounds = _group_bounds(group_sizes, lhs.shape[r])
                parts = [dot(_take(lhs, r, s, e), _take(rhs, rr, s, e), lb, rb, lc, rc, cdt) for s, e in bounds]
            else:
                parts = [dot(where(m, lhs), rhs, lb, rb, lc, rc, cdt) for m in masks(lhs, group_sizes)]
            return finish(np.stack(parts), out_dtype)

        return kernel

    g_dim = ints(inst.attr("rhs_group_dims"))[0]
    rb_, rc_ = tuple(d - (d > g_dim) for d in rb), tuple(d - (d > g_dim) for d in rc)
    free = [d for d in range(rank) if d not in lb and d not in lc]
    out_axis = len(lb) + free.index(r)  # where the ragged rows land in the result

    def kernel(lhs, rhs, group_sizes):
        out = np.zeros(inst.shape.dims, cdt)
        if broadcast:  # each group's rows are one slice of the ragged dim
            for g, (s, e) in enumerate(_group_bounds(group_sizes, lhs.shape[r])):
                if e > s:
                    out[(slice(None),) * out_axis + (slice(s, e),)] = dot(
                        _take(lhs, r, s, e), np.take(rhs, g, axis=g_dim), lb, rb_, lc, rc_, cdt
                    )
        else:
            for g, m in enumerate(masks(lhs, group_sizes)):
                out += dot(where(m, lhs), np.take(rhs, g, axis=g_dim), lb, rb_, lc, rc_, cdt)
        return finish(out, out_dtype)

    return kernel


def ragged_masks(inst, lhs_shape, group_sizes) -> np.ndarray:
    """[groups, lhs dims (1 where group_sizes does not vary)]: which lhs elements each group of ragged-dot `inst`
    takes (consecutive runs of group_sizes along its ragged dim, per index of the dims before it when group_sizes
    has more than one dim)."""
    _, prefix = _ragged_layout(inst)
    r = ints(inst.attr("lhs_ragged_dims"))[0]
    sizes = group_sizes.astype(np.int64)
    ends = np.cumsum(sizes, axis=-1)
    rows = np.arange(lhs_shape[r])
    inside = np.moveaxis(((ends - sizes)[..., None] <= rows) & (rows < ends[..., None]), -2, 0)
    dims = (*prefix, r) if sizes.ndim > 1 else (r,)  # the axes of `inside` after the group axis, as lhs dims
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    return inside.transpose([0] + [1 + i for i in order]).reshape(
        [sizes.shape[-1]] + [lhs_shape[d] if d in dims else 1 for d in range(len(lhs_shape))]
    )


def _group_bounds(group_sizes, n: int) -> list[tuple[int, int]]:
    """[start, end) of each group along a dim of n, from consecutive sizes (clipped to the dim)."""
    sizes = group_sizes.astype(np.int64)
    ends = np.cumsum(sizes)
    return [(min(max(int(end - size), 0), n), min(max(int(end), 0), n)) for size, end in zip(sizes, ends)]


def _take(x, axis: int, start: int, end: int):
    return x[(slice(None),) * axis + (slice(start, max(start, end)),)]


def _upscaled(a, b):
    """XLA's ScaledDotRewriter GetTargetType: the element type two operands meet in."""
    if a.bits < 16 and b.bits < 16:
        return element_type("bf16")
    if a == b:
        return a
    if a.bits == b.bits:
        return element_type("f32")
    return a if a.bits > b.bits else b


def converter(src, dst, inst):
    """`src` values as `dst` values (the values themselves for the same type)."""
    return (lambda x: x) if src == dst else convert_kernel(src, dst, inst)


def dequantizer(inst, operand: int, scale: int, target=None, block: int | None = None):
    """(kernel(x, scale) -> x times its block-broadcast scale, the element type it returns), as XLA's
    ScaledDotRewriter Dequantize: a scalar scale leaves x as it is; else x and scale meet in their upscaled
    type (`target`: in that type instead, as the block-scaled dot call's rewriter converts both to its result
    type), each scale element covers operand_dim / scale_dim consecutive elements per dim, one multiply.
    `block` (the block-scaled dot call's explicit block size): each scale element covers `block` elements of the
    last dim (the last block may be partial) and one of the others; a padded scale is sliced to what it covers."""
    x, sc = inst.operands[operand].shape, inst.operands[scale].shape
    if sc.rank == 0:
        return (lambda v, s: v), x.element_type
    if block is None:
        used, blocks = sc.dims, [0 if b == 0 else a // b for a, b in zip(x.dims, sc.dims)]
        tiles = sc.rank == x.rank and all(b and not a % b for a, b in zip(x.dims, sc.dims))
    else:
        used, blocks = (*x.dims[:-1], -(-x.dims[-1] // block)), [1] * (x.rank - 1) + [block]
        tiles = block > 0 and sc.rank == x.rank and all(u <= d for u, d in zip(used, sc.dims))
    if not tiles:
        raise UnsupportedError(
            f"scale {sc.to_text(False)} does not tile its operand {x.to_text(False)}"
            + (f" in blocks of {block}" if block else ""),
            inst,
        )
    t = target or _upscaled(x.element_type, sc.element_type)
    cx, cs, mul = (
        converter(x.element_type, t, inst),
        converter(sc.element_type, t, inst),
        float_lifted(np.multiply, t.numpy),
    )
    covered = tuple(slice(0, u) for u in used)
    cut = tuple(slice(0, d) for d in x.dims)

    def kernel(v, s):
        s = cs(s[covered])
        for axis, n in enumerate(blocks):
            if n > 1:
                s = np.repeat(s, n, axis=axis)
        return mul(cx(v), s[cut])

    return kernel, t


def device_dot(inst, ctx, lhs_type, rhs_type, out_type):
    """product(a, b, lb, rb, lc, rc, dtype): DotGeneral of operands of `lhs_type` / `rhs_type` (ElementTypes) in
    `dtype`, as the run's device computes a dot of those types with the dot-like instruction's algorithm= and
    operand_precision when its result is `out_type` (plain: dot_general)."""
    device = ctx.options.device
    alg = device_algorithm(
        device,
        inst.attr("algorithm"),
        inst.attr("operand_precision"),
        lhs_type.name,
        rhs_type.name,
        out_type.name,
        False,
        inst,
    )
    if alg:
        return lambda a, b, lb, rb, lc, rc, dtype: algorithm_dot(alg, a, b, lb, rb, lc, rc, dtype, device, inst)
    return dot_general


@op(
    "scaled-dot",
    kernel="blas",
    notes="(lhs, rhs, lhs_scale, rhs_scale) as XLA's ScaledDotRewriter: each "
    "operand times its scale broadcast over blocks (a scalar scale: none), in their common type (bf16 for two "
    "sub-16-bit types), then a dot in the common type of the operands and result (as the device computes "
    "it), converted to the result type",
)
def prepare_scaled_dot(inst, ctx):
    dims = _dot_dims(inst)
    if len(inst.operands) != 4:
        raise UnsupportedError(f"scaled-dot with {len(inst.operands)} operands (4 expected)", inst)
    (lhs, lt), (rhs, rt) = dequantizer(inst, 0, 2), dequantizer(inst, 1, 3)
    t = _upscaled(lt, rt)
    dot_t = _upscaled(t, inst.shape.element_type)
    cl, cr, out = converter(lt, t, inst), converter(rt, t, inst), converter(dot_t, inst.shape.element_type, inst)
    product = device_dot(inst, ctx, t, t, dot_t)

    def kernel(a, b, a_scale, b_scale):
        return out(product(cl(lhs(a, a_scale)), cr(rhs(b, b_scale)), *dims, dot_t.numpy))

    return kernel


# -- convolution -----------------------------------------------------------------------------
def _conv_dims(inst, rank):
    """dim_labels, checked against the kernel's `rank` (a convolution-like custom-call's shapes are not checked
    by shape inference)."""
    cd = inst.attr("dim_labels")
    if cd is None:
        raise UnsupportedError("convolution without dim_labels", inst)
    if rank != 2 + len(cd.kernel_spatial):
        raise UnsupportedError(
            f"dim_labels name {len(cd.kernel_spatial)} spatial dimensions; the kernel has rank {rank}", inst
        )
    return cd


def conv_core(lhs, rhs, win, out_dtype, xla_cpu_order: bool = False):
    """lhs (N, C, S...), rhs (O, C, W...) -> (N, O, out...), in the compute dtype. `xla_cpu_order` (f32): the
    products of each patch (window positions in row-major order, input features innermost) summed in XLA:CPU's
    order (kernels/conv_order.py)."""
    ns = lhs.ndim - 2
    lows = [0, 0] + [w.pad_low for w in win]
    highs = [0, 0] + [w.pad_high for w in win]
    inter = [0, 0] + [w.base_dilation - 1 for w in win]
    p, _ = pad_dilate(lhs, lows, highs, inter, np.zeros((), lhs.dtype)[()])
    rev = [2 + i for i, w in enumerate(win) if w.reversal]
    if rev:
        rhs = np.flip(rhs, axis=tuple(rev))
    sizes = [w.size for w in win]
    strides = [w.stride for w in win]
    wdil = [w.window_dilation for w in win]
    oshape = window_out_shape(p.shape[2:], sizes, strides, wdil)
    # view over spatial dims only: (N, C, out..., win...)
    st = p.strides
    shape = p.shape[:2] + tuple(oshape) + tuple(sizes)
    strd = st[:2] + tuple(s * k for s, k in zip(st[2:], strides)) + tuple(s * d for s, d in zip(st[2:], wdil))
    N, O = p.shape[0], rhs.shape[0]
    if any(v == 0 for v in shape) or rhs.shape[1] == 0:
        return np.zeros((N, O) + tuple(oshape), lhs.dtype)
    v = np.lib.stride_tricks.as_strided(p, shape=shape, strides=strd, writeable=False)
    if xla_cpu_order:
        from ..kernels.conv_order import conv_matmul

        rows = np.moveaxis(v, 1, -1).reshape(N * math.prod(oshape), -1)  # (N out..., win... C)
        with np.errstate(all="ignore"):
            r = conv_matmul(rows, np.moveaxis(rhs, 1, -1).reshape(O, -1).T).reshape((N, *oshape, O))
        return np.moveaxis(r, -1, 1)
    axes_v = [1] + list(range(2 + ns, 2 + 2 * ns))
    axes_k = [1] + list(range(2, 2 + ns))
    with np.errstate(all="ignore"):
        r = blas.tensordot(v, rhs, axes=(axes_v, axes_k))  # (N, out..., O)
    return np.moveaxis(r, -1, 1)


@op(
    "convolution",
    kernel="blas",
    notes="dim_labels, strides, padding (negative crops), lhs/base + rhs/window dilation, window "
    "reversal, feature_group_count, batch_group_count; pad + strided window view + tensordot "
    "(BLAS), like StableHLO's interpreter. Compute types and the device's dot algorithm as dot.",
)
def prepare_convolution(inst, ctx):
    lshape, rshape = inst.operands[0].shape, inst.operands[1].shape
    cd, _ = conv_window(inst, rshape)
    if not lshape.is_array or lshape.rank != rshape.rank or inst.shape.rank != rshape.rank:
        raise invalid(
            inst,
            f"{lshape.to_text(False)} by {rshape.to_text(False)} -> {inst.shape.to_text(False)}: "
            "input, kernel and result need one rank",
        )
    fgc, bgc = int_attr(inst, "feature_group_count", 1), int_attr(inst, "batch_group_count", 1)
    if (
        fgc < 1
        or bgc < 1
        or lshape.dims[cd.input_feature] != rshape.dims[cd.kernel_input_feature] * fgc
        or rshape.dims[cd.kernel_output_feature] % (fgc * bgc)
        or lshape.dims[cd.input_batch] % bgc
    ):
        raise invalid(
            inst,
            f"{lshape.to_text(False)} by {rshape.to_text(False)} with feature_group_count={fgc}, "
            f"batch_group_count={bgc}",
        )
    device = ctx.options.device
    alg = dot_algorithm_of(inst, device)
    if not alg:
        # XLA:CPU's orders for f32 (reductions="xla-cpu": its sums' orders)
        xla_cpu = ctx.options.reductions == "xla-cpu" and all(t.shape.dtype == _F32 for t in (inst, *inst.operands))
        return convolution(inst, rshape, inst.shape.dtype, xla_cpu_order=xla_cpu)
    plain = {dtype: convolution(inst, rshape, dtype) for dtype in (_F32, _F64)}
    out_dtype = inst.shape.dtype
    wide = _F64 if alg == "dot_f64_f64_f64" else _F32

    def kernel(lhs, rhs):
        r = contract(
            alg, to_compute(lhs, wide), to_compute(rhs, wide), lambda x, y, dtype: plain[dtype](x, y), device, inst=inst
        )
        return finish(r, out_dtype)

    return kernel


def conv_window(inst, kernel_shape):
    """(dim_labels, window) of a convolution-like instruction; no window: the kernel's spatial size, stride 1."""
    cd = _conv_dims(inst, kernel_shape.rank)
    win_attr = inst.attr("window")
    if win_attr is None:
        from ..ir.attributes import WindowDim

        win = tuple(WindowDim(kernel_shape.dims[d]) for d in cd.kernel_spatial)
    else:
        win = tuple(win_attr)
    if len(win) != len(cd.input_spatial):
        raise UnsupportedError("convolution window rank != spatial rank", inst)
    return cd, win


def convolution(inst, kernel_shape, out_dtype, xla_cpu_order: bool = False):
    """kernel(lhs, rhs) of the convolution `inst` describes (dim_labels, window, group counts): its result
    in `out_dtype` (a convolution-like custom-call reads the same attributes); `xla_cpu_order`: conv_core's."""
    cd, win = conv_window(inst, kernel_shape)
    rank = kernel_shape.rank
    fgc = int_attr(inst, "feature_group_count", 1)
    bgc = int_attr(inst, "batch_group_count", 1)
    cdt = compute_dtype(out_dtype)
    lperm = [cd.input_batch, cd.input_feature] + list(cd.input_spatial)
    kperm = [cd.kernel_output_feature, cd.kernel_input_feature] + list(cd.kernel_spatial)
    # (N, O, spatial...) -> output layout
    oinv = [0] * rank
    for src, dst in enumerate([cd.output_batch, cd.output_feature] + list(cd.output_spatial)):
        oinv[dst] = src

    def kernel(lhs, rhs):
        a = to_compute(lhs, cdt).transpose(lperm)
        k = to_compute(rhs, cdt).transpose(kperm)
        O = k.shape[0]
        if bgc > 1:
            nb = a.shape[0] // bgc
            og = O // bgc
            parts = [
                conv_core(a[g * nb : (g + 1) * nb], k[g * og : (g + 1) * og], win, out_dtype, xla_cpu_order)
                for g in range(bgc)
            ]
            r = np.concatenate(parts, axis=1)
        elif fgc > 1:
            cg = a.shape[1] // fgc
            og = O // fgc
            parts = [
                conv_core(a[:, g * cg : (g + 1) * cg], k[g * og : (g + 1) * og], win, out_dtype, xla_cpu_order)
                for g in range(fgc)
            ]
            r = np.concatenate(parts, axis=1)
        else:
            r = conv_core(a, k, win, out_dtype, xla_cpu_order)
        return finish(r.transpose(oinv), out_dtype)

    return kernel


# -- fft -------------------------------------------------------------------------------------
@op(
    "fft",
    dtypes="f32, f64, c64, c128",
    kernel="numpy",
    notes="FFT/IFFT/RFFT/IRFFT over the trailing len(fft_length) dims via numpy.fft (complex128 "
    "internally, rounded to c64/f32).",
)
def prepare_fft(inst, ctx):
    kind = (str_attr(inst, "fft_type") or "FFT").upper()
    lengths = ints(required(inst, "fft_length"))
    if not 0 < len(lengths) <= min(3, inst.operands[0].shape.rank):
        raise invalid(inst, f"fft_length={{{','.join(map(str, lengths))}}} of {inst.operands[0].shape.to_text(False)}")
    axes = tuple(range(-len(lengths), 0))
    out_dtype = inst.shape.dtype

    def kernel(x):
        if kind == "FFT":
            r = np.fft.fftn(x, s=lengths, axes=axes)
        elif kind == "IFFT":
            r = np.fft.ifftn(x, s=lengths, axes=axes)
        elif kind == "RFFT":
            r = np.fft.rfftn(x, s=lengths, axes=axes)
        elif kind == "IRFFT":
            r = np.fft.irfftn(x, s=lengths, axes=axes)
        else:
            raise UnsupportedError(f"fft_type {kind}", inst)
        return contig(r.astype(out_dtype))

    return kernel


# -- cholesky ----------------------------------------------------------------------------------
@op(
    "cholesky",
    dtypes="f16, bf16, f32, f64, c64, c128",
    kernel="numpy",
    notes="XLA's CholeskyExpander semantics: reads the lower triangle (lower=true) or the upper one (as a "
    "plain transpose, no conjugate), the other triangle of the result is 0, and a matrix where any "
    "pivot's sqrt is NaN (not positive definite) comes out all NaN. Computed column by column "
    "(XLA blocks by 128: rounding differs); f16/bf16 computed in f32.",
)
def prepare_cholesky(inst, ctx):
    lower = bool(inst.attr("lower", False))
    out_dtype = inst.shape.dtype
    work = _F32 if is_low_float(out_dtype) else out_dtype

    def kernel(x):
        a = to_compute(x, work)
        if not lower:
            a = np.swapaxes(a, -1, -2)
        n = a.shape[-1]
        l = np.zeros_like(a)
        failed = np.zeros(a.shape[:-2], bool)
        with np.errstate(invalid="ignore", divide="ignore"):
            for j in range(n):
                row = l[..., j, :j]
                ljj = np.sqrt(np.real(a[..., j, j] - np.sum(row * np.conj(row), axis=-1)))
                failed |= np.isnan(ljj)
                l[..., j, j] = ljj
                below = a[..., j + 1 :, j] - np.einsum("...ik,...k->...i", l[..., j + 1 :, :j], np.conj(row))
                l[..., j + 1 :, j] = below / ljj[..., None]
        l[failed] = np.nan
        if not lower:
            l = np.swapaxes(l, -1, -2)
        return finish(l, out_dtype)

    return kernel


# -- triangular-solve --------------------------------------------------------------------------
@op(
    "triangular-solve",
    dtypes="f16, bf16, f32, f64, c64, c128",
    kernel="numpy",
    notes="op(a) x = b (left_side) or x op(a) = b, op per transpose_a (NO_TRANSPOSE/TRANSPOSE/ADJOINT); "
    "only a's lower (lower=true) or upper triangle is read, its diagonal taken as 1 with unit_diagonal. "
    "Solved by substitution row by row (f16/bf16 in f32); a zero pivot gives inf/NaN (XLA's blocked "
    "expander makes them all NaN) instead of refusing.",
)
def prepare_triangular_solve(inst, ctx):
    transpose = (str_attr(inst, "transpose_a") or "NO_TRANSPOSE").upper()
    if transpose not in ("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"):
        raise UnsupportedError(f"triangular-solve with transpose_a={transpose}", inst)
    left = bool(inst.attr("left_side", False))
    a_shape, b_shape = inst.operands[0].shape, inst.operands[1].shape
    m = b_shape.dims[-2 if left else -1] if b_shape.rank >= 2 else -1
    if a_shape.rank < 2 or a_shape.dims[-2:] != (m, m) or a_shape.dims[:-2] != b_shape.dims[:-2]:
        raise invalid(
            inst, f"a {a_shape.to_text(False)} for b {b_shape.to_text(False)} ({'left' if left else 'right'} side)"
        )
    return triangular_solve(
        left, bool(inst.attr("lower", False)), bool(inst.attr("unit_diagonal", False)), transpose, inst.shape.dtype
    )


def triangular_solve(left: bool, lower: bool, unit: bool, transpose: str, out_dtype):
    """kernel(a, b) -> x of triangular-solve (transpose: NO_TRANSPOSE, TRANSPOSE or ADJOINT)."""
    work = _F32 if is_low_float(out_dtype) else out_dtype

    def kernel(a, b):
        a, b = to_compute(a, work), to_compute(b, work)
        a = np.tril(a) if lower else np.triu(a)
        if unit:
            m = a.shape[-1]
            a = a.copy()
            a[..., np.arange(m), np.arange(m)] = 1
        a_lower = lower
        if transpose != "NO_TRANSPOSE":
            a, a_lower = np.swapaxes(a, -1, -2), not lower
            if transpose == "ADJOINT":
                a = np.conj(a)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if left:
                x = _substitute(a, b, a_lower)
            else:  # x a = b  <=>  a^T x^T = b^T
                x = np.swapaxes(_substitute(np.swapaxes(a, -1, -2), np.swapaxes(b, -1, -2), not a_lower), -1, -2)
        return finish(x, out_dtype)

    return kernel


def _substitute(a, b, lower: bool):
    """x with a x = b for triangular a [..., m, m], b [..., m, n], row by row (forward for lower, back for upper):
    a zero on the diagonal gives inf/NaN, as XLA's substitution does, where an LU solve would refuse."""
    m = a.shape[-1]
    x = np.zeros(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + b.shape[-2:], np.result_type(a, b))
    for i in range(m) if lower else range(m - 1, -1, -1):  # rows not solved yet are 0 in x
        x[..., i, :] = (b[..., i, :] - np.einsum("...j,...jn->...n", a[..., i, :], x)) / a[..., i, i, None]
    return x
