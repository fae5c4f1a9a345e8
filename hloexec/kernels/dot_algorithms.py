"""Dot algorithms (PrecisionConfig.Algorithm) computed as the devices that run them compute them.

A device profile (hloexec.options.devices) says which algorithm a dot runs with: its explicit `algorithm=`, or
the one its operand precisions select on that device (a TPU's DEFAULT is one bf16 pass, an A100's is TF32).
`device_algorithm` makes that choice for one dot and refuses an algorithm the device does not run; `contract`
computes a contraction under an algorithm from a `product(x, y, dtype)` of plain arrays, as the recipes say:

* one pass (bf16, f16, tf32): each operand rounded to the algorithm's input type, one product accumulated in f32
  (the rounded operands' products are exact in f32: only the accumulation rounds);
* bf16 X3 / X6 (xla/service/gpu/transforms/dot_algorithm_rewriter.cc): each f32 operand cut into a high part
  (its top 16 bits: `bits & 0xFFFF0000`, or rounded, per the profile's `bf16_split`) and lower parts (the rest
  rounded to bf16); every partial product is its own f32 dot, summed in the rewriter's order, a NaN in the sum
  of the small terms replaced by 0 (an inf operand times a 0 low part), then the high x high product added;
* bf16 X9 and TF32 X3: the same scheme in the order of Triton's BF16DotTC / F32DotTC passes;
* f16 / bf16 accumulation (dot_f16_f16_f16, dot_bf16_bf16_bf16): one contracting element at a time, each
  product (exact) added to the running sum and the sum rounded to the type, in index order;
* fp8 fast accumulation (Hopper): products summed in f32 over blocks of 32 contracting elements, the running
  sum truncated to the profile's `fp8_accumulator_bits` significand bits after each block.
"""

from __future__ import annotations

import functools
import math
import operator
import weakref

import numpy as np

from ..errors import UnsupportedError
from ..ir.attributes import dot_dims
from .index_maps import dot_free_dims

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)

# Algorithms whose arithmetic is the plain dot's when the operands already have the algorithm's input type (and
# the result accumulates in f32, or f64 for f64): they keep the plain path (BLAS, the compiled tiers).
PLAIN_INPUT = {
    "dot_f32_f32_f32": "f32",
    "dot_f64_f64_f64": "f64",
    "dot_bf16_bf16_f32": "bf16",
    "dot_f16_f16_f32": "f16",
    "dot_any_f8_any_f8_f32": "f8",
}
# The partial products of the multi-pass recipes, (lhs part, rhs part) with 0 the high part, summed in this order
# before the NaN replacement; the high x high product is added last.
PASSES = {
    "dot_bf16_bf16_f32_x3": ((1, 0), (0, 1)),  # dot_algorithm_rewriter.cc X3
    "dot_bf16_bf16_f32_x6": ((1, 1), (0, 2), (2, 0), (0, 1), (1, 0)),  # dot_algorithm_rewriter.cc X6
    "dot_bf16_bf16_f32_x9": ((2, 2), (1, 2), (2, 1), (1, 1), (2, 0), (0, 2), (1, 0), (0, 1)),  # Triton BF16x9
    "dot_tf32_tf32_f32_x3": ((1, 0), (0, 1)),  # Triton F32DotTC (3xTF32)
}
FP8_K_BLOCK = 32  # contracting elements an fp8 WGMMA step adds before the accumulator is touched


def algorithm_name(text: str | None) -> str:
    """An algorithm as HLO text spells it: `dot_bf16_bf16_f32` from that or from backend_config's
    `ALG_DOT_BF16_BF16_F32`; "" for none (`ALG_UNSET`)."""
    name = (text or "").strip().lower()
    name = name[4:] if name.startswith("alg_") else name
    return "" if name in ("", "unset") else name


def device_algorithm(
    device, algorithm: str, precisions, lhs_type: str, rhs_type: str, out_type: str, matrix_vector: bool, inst=None
) -> str:
    """The algorithm `device` (a DeviceProfile) computes a dot with (element type names as HLO text spells them);
    "" when that is the dot as its types say (the plain path). An algorithm the device does not run is an
    UnsupportedError naming both."""
    precisions = tuple(str(p).lower() for p in precisions or ())
    alg = device.dot_algorithm(algorithm_name(algorithm), precisions, lhs_type == rhs_type == "f32", matrix_vector)
    # f64 storage runs no narrower algorithm (xla/service/algorithm_util.cc's allowed operand types): the f64
    # dots of a module's shadow stay exact under every profile
    if not alg or ("f64" in (lhs_type, rhs_type) and alg != "dot_f64_f64_f64"):
        return ""
    if alg not in device.algorithms:
        raise UnsupportedError(
            f"dot algorithm {alg} ({lhs_type} x {rhs_type} -> {out_type}): the device profile "
            f"{device.name!r} does not run it (it runs {', '.join(device.algorithms) or 'none'})",
            inst,
        )
    want = PLAIN_INPUT.get(alg)
    same = lhs_type == rhs_type == want or (want == "f8" and lhs_type.startswith("f8") and rhs_type.startswith("f8"))
    if same and (out_type == "f64") == (alg == "dot_f64_f64_f64"):
        return ""
    return alg


def fp8_fast_accumulation(device, algorithm: str | None, precisions, lhs_type: str, rhs_type: str) -> bool:
    """Whether an fp8 x fp8 GEMM keeps its partial sums unpromoted: its algorithm says so, or it has none and runs
    at DEFAULT precision on a device whose fp8 GEMMs then use fast accumulation (stream_executor/cuda/
    cuda_blas_lt.cc: CUBLASLT_MATMUL_DESC_FAST_ACCUM at the default compute precision). Never for other operand
    types (algorithm_util.cc: the algorithm takes fp8 storage only; the shadow's f64 dots stay exact)."""
    name = algorithm_name(algorithm)
    if not (lhs_type.startswith("f8") and rhs_type.startswith("f8")):  # (the shadow's f64 operands: exact)
        return False
    if name == "dot_any_f8_any_f8_f32_fast_accum":
        return True
    return not name and device.fp8_fast_accumulation and all(str(p).lower() == "default" for p in precisions or ())


# -- operand rounding (f32 or f64 arrays in, arrays of the same type out) -------------------------------------
_UINT: dict[int, type[np.unsignedinteger]] = {4: np.uint32, 8: np.uint64}


def _cut(x, stored: int, rounding: str):
    """x (f32 or f64) with `stored` significand bits after the point: "truncate" drops the rest, "nearest"
    rounds ties to even, "nearest-away" ties away from zero; NaNs stay NaN, overflow goes to inf."""
    x = np.ascontiguousarray(x)
    if x.dtype not in (F32, F64):
        x = x.astype(F32)
    uint = _UINT[x.dtype.itemsize]
    drop = np.finfo(x.dtype).nmant - stored
    u = x.view(uint)
    mask = uint(~((1 << drop) - 1) & ((1 << (8 * x.dtype.itemsize)) - 1))
    if rounding == "truncate":
        return (u & mask).view(x.dtype)
    half = uint(1 << (drop - 1))
    if rounding == "nearest":
        r = (u + (half - uint(1)) + ((u >> uint(drop)) & uint(1))) & mask
    else:
        r = (u + half) & mask
    return np.where(np.isnan(x), x, r.view(x.dtype))


def to_bf16(x, rounding: str = "nearest"):
    """Values rounded (or truncated) to bf16, in their own type (f32 or f64)."""
    return _cut(x, 7, rounding)


def to_tf32(x, rounding: str):
    """Values rounded (or truncated) to tf32 (10 stored significand bits), in their own type."""
    return _cut(x, 10, rounding)


def to_f16(x):
    """Values rounded to f16 (numpy's conversion: to nearest, ties to even, from f32 or f64 directly), as f32."""
    return np.asarray(x).astype(np.float16).astype(F32)


def keep_bits(x, bits: int):
    """Values truncated to `bits` significand bits (the implicit one counted)."""
    return _cut(x, bits - 1, "truncate")


def split(x, parts: int, device, tf32: bool = False):
    """An f32 operand as `parts` parts (high first) whose sum approximates it: each high part cut from what is left
    (bf16: per `bf16_split`; tf32: per `tf32_rounding`), the last one the rest rounded to the type."""
    cut = (lambda v: to_tf32(v, device.tf32_rounding)) if tf32 else (lambda v: to_bf16(v, device.bf16_split))
    last = (lambda v: to_tf32(v, device.tf32_rounding)) if tf32 else to_bf16
    out, rest = [], np.asarray(x, F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for _ in range(parts - 1):
            high = cut(rest)
            out.append(high)
            rest = rest - high
    out.append(last(rest))
    return out


# -- the contraction ------------------------------------------------------------------------------------------
def contract(
    alg: str, a, b, product, device, k_axes: tuple[int, int] | None = None, fast_accumulation=False, inst=None
):
    """The contraction `product(x, y, dtype)` (the plain dot or convolution of two arrays computed in dtype) of
    `a` and `b` under the algorithm `alg`, in f32 (f64 for dot_f64_f64_f64). `k_axes`: the one contracting axis
    of a and of b, for the recipes that accumulate a few contracting elements at a time (none: refused).
    `fast_accumulation`: an fp8 product whose partial sums are not promoted (fp8_fast_accumulation)."""
    if alg == "dot_f64_f64_f64":
        return product(np.asarray(a, F64), np.asarray(b, F64), F64)
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    with np.errstate(all="ignore"):
        if fast_accumulation:
            bits = device.fp8_accumulator_bits
            return _blocked(a, b, product, k_axes, FP8_K_BLOCK, lambda s, p: keep_bits(s + p, bits), alg, inst)
        # (the fast-accum algorithm on operands other than fp8 -- the shadow's, a test's f32 -- accumulates in f32)
        if alg in ("", "dot_f32_f32_f32", "dot_any_f8_any_f8_f32", "dot_any_f8_any_f8_f32_fast_accum"):
            return product(a, b, F32)
        if alg == "dot_bf16_bf16_f32":
            return product(to_bf16(a), to_bf16(b), F32)
        if alg == "dot_f16_f16_f32":
            return product(to_f16(a), to_f16(b), F32)
        if alg == "dot_tf32_tf32_f32":
            return product(to_tf32(a, device.tf32_rounding), to_tf32(b, device.tf32_rounding), F32)
        if alg in ("dot_f16_f16_f16", "dot_bf16_bf16_bf16"):
            low = to_f16 if alg == "dot_f16_f16_f16" else (lambda v: to_bf16(v).astype(F32))
            # the running sum (a value of the type) plus one exact product, exact in f64, rounded once to the type
            step = lambda s, p: low(np.asarray(s, F64) + p)  # noqa: E731
            return _blocked(low(a), low(b), product, k_axes, 1, step, alg, inst)
        if alg in PASSES:
            parts = 3 if alg in ("dot_bf16_bf16_f32_x6", "dot_bf16_bf16_f32_x9") else 2
            tf32 = alg == "dot_tf32_tf32_f32_x3"
            pa, pb = split(a, parts, device, tf32), split(b, parts, device, tf32)
            # the small terms in the pass order
            small = functools.reduce(operator.add, (product(pa[i], pb[j], F32) for i, j in PASSES[alg]))
            small = np.where(np.isnan(small), np.float32(0), small)
            return small + product(pa[0], pb[0], F32)
    raise UnsupportedError(f"dot algorithm {alg}: not one of PrecisionConfig.Algorithm's", inst)


def _blocked(a, b, product, k_axes, block: int, step, alg: str, inst):
    """The sum over the contracting axis `k_axes` taken `block` elements at a time: each block's product in f32,
    folded into the running sum by `step(sum, block_product)` in index order."""
    if k_axes is None:
        raise UnsupportedError(f"{alg} on a contraction with more than one contracting axis (a convolution)", inst)
    ka, kb = k_axes
    total = None
    for k in range(0, a.shape[ka], block):
        part = product(
            np.take(a, range(k, min(k + block, a.shape[ka])), axis=ka),
            np.take(b, range(k, min(k + block, b.shape[kb])), axis=kb),
            F32,
        )
        total = step(np.zeros_like(part), part) if total is None else step(total, part)
    if total is None:
        return product(a, b, F32)
    return np.asarray(total, F32)


def dot_algorithm_of(inst, device) -> str:
    """device_algorithm for a dot or convolution instruction: its algorithm= and operand_precision attributes,
    operand and result types; a dot is matrix-vector when one side has a single free row or column."""
    lhs, rhs = inst.operands[0].shape, inst.operands[1].shape
    matrix_vector = False
    if inst.opcode == "dot":
        d = dot_dims(inst)
        lf, rf = dot_free_dims(d, lhs.rank, rhs.rank)
        matrix_vector = math.prod(lhs.dims[k] for k in lf) == 1 or math.prod(rhs.dims[k] for k in rf) == 1
    return device_algorithm(
        device,
        inst.attr("algorithm"),
        inst.attr("operand_precision"),
        lhs.element_type.name,
        rhs.element_type.name,
        inst.shape.element_type.name,
        matrix_vector,
        inst,
    )


def plain_dot(inst, device) -> bool:
    """Whether `device` computes the dot `inst` as its types say: no algorithm of its own, no split-K, no fp8
    fast accumulation (what the compiled tiers compute)."""
    lhs, rhs = (o.shape.element_type.name for o in inst.operands[:2])
    return not (
        dot_algorithm_of(inst, device)
        or (device.split_k and triton_split_k(inst) > 1)
        or fp8_fast_accumulation(device, inst.attr("algorithm"), inst.attr("operand_precision"), lhs, rhs)
    )


_SPLIT_K: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def triton_split_k(inst) -> int:
    """The split_k of the Triton GEMM fusion whose fused computation holds the dot `inst` (its backend_config's
    fusion_backend_config.triton_gemm_config), 1 when none or when XLA already split the dot (a batch dim of
    that size: split_k_gemm_rewriter.cc's form, which the text computes as written)."""
    comp = inst.computation
    if comp is None or comp.module is None:
        return 1
    by_computation = _SPLIT_K.get(comp.module)
    if by_computation is None:
        by_computation = {}
        for c in comp.module.computations:
            for i in c.instructions:
                cfg = i.attr("backend_config") if i.opcode == "fusion" else None
                gemm = (
                    ((cfg.get("fusion_backend_config") or {}).get("triton_gemm_config") or {})
                    if isinstance(cfg, dict)
                    else {}
                )
                split = int(gemm.get("split_k", 1) or 1)
                if split > 1:
                    by_computation[i.called["calls"].name] = split
        _SPLIT_K[comp.module] = by_computation
    split = by_computation.get(comp.name, 1)
    batch = dot_dims(inst).lhs_batch
    return 1 if any(inst.operands[0].shape.dims[d] == split for d in batch) else split
