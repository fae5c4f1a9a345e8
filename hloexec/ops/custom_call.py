"""custom-call: one opcode, dispatched on `custom_call_target` through a registry users can extend.

    from hloexec.ops.custom_call import register_custom_call
    def prepare_my_target(inst, ctx):          # same contract as an op's prepare
        return lambda *operands: ...
    register_custom_call("my_target", prepare_my_target)

or `@custom_call("my_target")` as a decorator. An unregistered target raises UnsupportedError naming it.

Built in:
* `__cublas$gemm`, `__cublas$lt$matmul`: backend_config (JSON; `gemm_backend_config` nested or at top
  level): dot_dimension_numbers (string lists), alpha_real/alpha_imag, beta (beta != 0: operand 2 is C,
  result = alpha*dot + beta*C), epilogue DEFAULT/BIAS/RELU/BIAS_RELU/GELU/BIAS_GELU(/_AUX: the
  pre-activation as the 2nd result) with GELU the tanh approximation cuBLASLt uses. f16/bf16 compute in
  f32, rounded once. A tuple result's remaining leaves (the s8 workspace) are zeros.
* identity markers (one participant): Sharding, xla.sdy.FuncResultSharding, SPMDFullToShardShape,
  SPMDShardToFullShape (shape must be unchanged), MoveToHost, MoveToDevice, annotate_device_placement, LayoutConstraint,
  __builtin$CrossMeshAllReduce (one mesh), pipeline_marker (passes its operand(s)/tuple through), SetBound.
* dce_sink: jax's keep-alive marker, a no-op with the empty tuple as its value.
* TopK: [batch, n] or [n] -> (values [.., k], indices s32 [.., k]), sorted descending, ties by the
  lower index (NaN counts as the largest).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedError
from .contraction import compute_dtype, dot_general, finish, to_compute
from .common import contig, total_order_key
from .registry import op

_F32 = np.dtype(np.float32)
CUSTOM_CALLS: dict = {}


def register_custom_call(target: str, prepare, *, replace: bool = False):
    """Register `prepare(inst, ctx) -> kernel(*operands)` for custom-call target `target`."""
    if target in CUSTOM_CALLS and not replace:
        raise ValueError(f"custom-call target {target!r} registered twice")
    CUSTOM_CALLS[target] = prepare
    return prepare


def custom_call(*targets: str):
    """Decorator form of register_custom_call (one prepare for several target names)."""
    def deco(prepare):
        for t in targets:
            register_custom_call(t, prepare)
        return prepare
    return deco


def target_of(inst) -> str:
    t = inst.attr("custom_call_target")
    return "" if t is None else str(t).strip().strip('"')


@op("custom-call", kernel="python",
    notes="Dispatches on custom_call_target through hloexec.ops.custom_call.CUSTOM_CALLS "
          "(register_custom_call adds targets). Built in: cuBLAS gemm / cublasLt matmul, TopK, "
          "one-participant identity markers (Sharding, SPMD*Shape, MoveTo*, LayoutConstraint, ...).")
def prepare_custom_call(inst, ctx):
    target = target_of(inst)
    prepare = CUSTOM_CALLS.get(target)
    if prepare is None:
        raise UnsupportedError(f"unsupported custom-call target {target!r}", inst)
    return prepare(inst, ctx)


# -- identity markers ------------------------------------------------------------------------
@custom_call("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "MoveToHost", "MoveToDevice",
             "annotate_device_placement", "LayoutConstraint", "__builtin$CrossMeshAllReduce", "pipeline_marker",
             "xla_python_cpu_callback_identity_marker_unused", "xla.sdy.FuncResultSharding",
             "SetBound")  # SetBound: a bound for dynamic shapes, values unchanged
def _identity(inst, ctx):
    """Markers that are the identity for one participant: the operand (or operands, as a tuple) passes through;
    a marker changing the shape needs several participants and is unsupported."""
    if inst.shape.is_tuple and len(inst.operands) > 1:
        def kernel(*xs):
            return tuple(xs)
        return kernel
    if len(inst.operands) != 1:
        raise UnsupportedError(f"custom-call {target_of(inst)!r} with {len(inst.operands)} operands", inst)
    src = inst.operands[0].shape
    if not src.is_tuple and not inst.shape.is_tuple and tuple(src.dims) != tuple(inst.shape.dims):
        raise UnsupportedError(f"custom-call {target_of(inst)!r} changes the shape "
                               f"{src.to_text(False)} -> {inst.shape.to_text(False)} (needs >1 participant)", inst)

    def kernel(x):
        return x
    return kernel


@custom_call("dce_sink")
def _dce_sink(inst, ctx):
    """`dce_sink` (jax's lax.dce_sink with prevent_mlir_dce): a side effect that keeps its operands alive
    through dead-code elimination and does nothing else; its value is the empty tuple."""
    return lambda *operands: ()


@custom_call("SliceToDynamic")
def _slice_to_dynamic(inst, ctx):
    """SliceToDynamic(x, size_0, ...): x with the given dynamic sizes. hloexec values are static arrays of
    the bound shape, so the value is x; elements past a dynamic size are padding (XLA:CPU leaves them
    uninitialized)."""
    if inst.shape.is_tuple or tuple(inst.operands[0].shape.dims) != tuple(inst.shape.dims):
        raise UnsupportedError("SliceToDynamic whose result bounds differ from its operand's shape", inst)

    def kernel(x, *sizes):
        return x
    return kernel


# -- TopK --------------------------------------------------------------------------------------
def top_k(x: np.ndarray, k: int, largest: bool = True):
    key = total_order_key(x) if x.dtype.kind != "b" else x.astype(np.int8)
    order = np.argsort(~key if largest else key, axis=-1, kind="stable")[..., :k]
    vals = np.take_along_axis(x, order, axis=-1)
    return contig(vals), contig(order.astype(np.int32))


@custom_call("TopK")
def _topk(inst, ctx):
    """k largest (or smallest with largest=false) along the last dim: (values, s32 indices), sorted, ties by
    the lower index, NaN the largest."""
    if not inst.shape.is_tuple or len(inst.shape.tuple_shapes) != 2:
        raise UnsupportedError(f"{inst.opcode} must return (values, indices)", inst)
    vshape, ishape = inst.shape.tuple_shapes
    k = vshape.dims[-1]
    idt = ishape.dtype
    largest = inst.attr("largest", True)

    def kernel(x):
        v, i = top_k(x, k, largest)
        return v.astype(vshape.dtype, copy=False), i.astype(idt, copy=False)
    return kernel


op("topk", kernel="numpy", notes="the topk opcode: k largest (or smallest) along the last dim, stable")(_topk)


# -- oneDNN (XLA:CPU's own rewrites) ------------------------------------------------------------
@custom_call("__onednn$layernorm")
def _onednn_layernorm(inst, ctx):
    """oneDNN forward-inference layer norm over the last dim: (x - mean) / sqrt(var + eps) * scale + shift,
    biased variance, computed in f32 (onednn_layer_norm.cc). eps is the config's epsilon_typecast (the f32
    bits as an int) where given, else 1e-5 (the runtime's constant before that field existed)."""
    cfg = _backend_config(inst).get("onednn_layer_norm_config", {})
    rescale = cfg.get("rescale", "SCALE_AND_SHIFT")
    if rescale != "SCALE_AND_SHIFT" or len(inst.operands) != 3:
        raise UnsupportedError(f"__onednn$layernorm with rescale={rescale} and {len(inst.operands)} operands", inst)
    bits = cfg.get("epsilon_typecast")
    eps = np.float32(1e-5) if bits is None else np.array(int(bits), np.int32).view(np.float32)[()]
    out_dtype = inst.shape.dtype

    def kernel(x, scale, shift):
        x32, scale32, shift32 = (to_compute(v, _F32) for v in (x, scale, shift))   # f16/bf16 via low_to_f32
        mean = x32.mean(axis=-1, keepdims=True, dtype=np.float32)
        var = np.square(x32 - mean).mean(axis=-1, keepdims=True, dtype=np.float32)
        return finish((x32 - mean) / np.sqrt(var + eps) * scale32 + shift32, out_dtype)   # ... and f32_to_low
    return kernel


# -- cuBLAS gemm -------------------------------------------------------------------------------
def _backend_config(inst) -> dict:
    cfg = inst.attr("backend_config")
    if cfg is None:
        return {}
    if not isinstance(cfg, dict):   # the decoder returns JSON objects as dicts, anything else as text
        raise UnsupportedError(f"{inst.attr('custom_call_target')} with a non-JSON backend_config", inst)
    return cfg


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def _strs(v):
    return tuple(int(t) for t in (v or ()))


@custom_call("__cublas$gemm", "__cublas$lt$matmul")
def _gemm(inst, ctx):
    """backend_config dot_dimension_numbers, alpha (real/imag), beta (beta != 0: operand 2 is C), epilogues
    DEFAULT, RELU, GELU (tanh), SILU, their BIAS_ forms and (BIAS_)GELU_AUX; f16/bf16 computed in f32, rounded once."""
    cfg = _backend_config(inst)
    g = cfg.get("gemm_backend_config", cfg)
    dd = g.get("dot_dimension_numbers", {})
    lc, rc = _strs(dd.get("lhs_contracting_dimensions")), _strs(dd.get("rhs_contracting_dimensions"))
    lb, rb = _strs(dd.get("lhs_batch_dimensions")), _strs(dd.get("rhs_batch_dimensions"))
    alpha = complex(float(g.get("alpha_real", 1)), float(g.get("alpha_imag", 0)))
    beta = float(g.get("beta", 0))
    epilogue = str(g.get("epilogue", "DEFAULT")).upper()
    known = {"DEFAULT", "BIAS", "RELU", "BIAS_RELU", "GELU", "BIAS_GELU", "GELU_AUX", "BIAS_GELU_AUX",
             "SILU", "BIAS_SILU"}
    if epilogue not in known:
        raise UnsupportedError(f"cuBLAS gemm epilogue {epilogue}", inst)
    has_bias = epilogue.startswith("BIAS")
    leaves = [s for _, s in inst.shape.leaves()]
    out_shape = leaves[0]
    out_dtype = out_shape.dtype
    cdt = compute_dtype(out_dtype)
    if cdt.kind == "i" or cdt.kind == "u":
        pass
    elif cdt.kind != "c":
        cdt = np.dtype(np.float64) if out_dtype == np.float64 else np.dtype(np.float32)
    nops = len(inst.operands)
    c_index = 2 if beta != 0 else None
    bias_index = (3 if beta != 0 else 2) if has_bias else None
    need = 2 + (beta != 0) + has_bias
    if nops < need:
        raise UnsupportedError(f"cuBLAS gemm expects {need} operands, got {nops}", inst)

    def kernel(*xs):
        r = dot_general(xs[0], xs[1], lb, rb, lc, rc, cdt)
        if alpha.imag != 0:
            r = r * alpha
        elif alpha.real != 1:
            r = (r * np.asarray(alpha.real, cdt)).astype(cdt)
        if c_index is not None:
            r = r + np.asarray(beta, cdt) * xs[c_index].astype(cdt)
        if bias_index is not None:
            r = r + xs[bias_index].astype(cdt)     # broadcast along the last (column) dim
        pre = r
        if "RELU" in epilogue:
            r = np.maximum(r, 0)
        elif "GELU" in epilogue:
            r = _gelu_tanh(r)
        elif "SILU" in epilogue:
            r = r / (1 + np.exp(-r))
        out = contig(np.asarray(r).astype(out_dtype))
        if not inst.shape.is_tuple:
            return out
        res = [out]
        for j, s in enumerate(leaves[1:], start=1):
            if j == 1 and epilogue.endswith("AUX"):
                res.append(contig(np.asarray(pre).astype(s.dtype).reshape(s.dims)))
            else:
                res.append(np.zeros(s.dims, s.dtype))
        return tuple(res)
    return kernel
