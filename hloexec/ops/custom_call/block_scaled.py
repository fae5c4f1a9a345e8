"""XLA-GPU's block-scaling calls (MXFP8 / NVFP4): __op$quantize, __op$dequantize and __op$block_scaled_dot, as
XLA's block_scaling_rewriter.cc expands them."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np

from ...errors import UnsupportedError
from ..contraction import converter, dequantizer, device_dot
from ..elementwise import convert_kernel, float_lifted
from .registry import custom_call, target_of


def block_size(inst, data, scale) -> int:
    """Elements of `data`'s last dim per `scale` element, as the rewriter's GetBlockSize with its shape checks:
    float arrays of one rank >= 1, equal dims but the last, which the scale's divides."""
    if (
        not data.is_array
        or not scale.is_array
        or not data.element_type.is_float
        or not scale.element_type.is_float
        or data.rank < 1
        or scale.rank != data.rank
        or data.dims[:-1] != scale.dims[:-1]
        or scale.dims[-1] == 0
        or data.dims[-1] % scale.dims[-1]
    ):
        raise UnsupportedError(
            f"{target_of(inst)}: scale {scale.to_text(False)} does not split the last dim of "
            f"{data.to_text(False)} into blocks (float arrays, same dims but the last, which "
            "the scale's divides)",
            inst,
        )
    return data.dims[-1] // scale.dims[-1]


@custom_call("__op$quantize", operands=1, returns="tuple")
def quantize(inst, ctx):
    """x -> (values, scales), blocks of the last dim of x (block = x's last dim / scales' last dim), all in
    x's type: amax = max |x| per block; scale = convert(amax / emax) to the scales' type (emax: the largest
    power of two of the values' type, 2^8 for f8e4m3fn, 2^2 for f4e2m1fn; round to nearest even, so an
    f8e8m0fnu scale is a power of two and a block of zeros gets a NaN scale); values = convert(x / scale,
    the scale converted back to x's type) to the values' type (round to nearest even; 0 / 0 is NaN, -0 in a
    type without NaN such as f4e2m1fn)."""
    x = inst.operands[0].shape
    if (
        len(inst.shape.tuple_shapes) != 2
        or not all(s.is_array for s in inst.shape.tuple_shapes)
        or inst.shape.tuple_shapes[0].dims != x.dims
    ):
        raise UnsupportedError(
            f"{target_of(inst)} returns (values of the operand's dims, scales), the call says "
            f"{inst.shape.to_text(layout=False)}",
            inst,
        )
    values, scales = inst.shape.tuple_shapes
    block = block_size(inst, values, scales)
    t = x.element_type
    if not t.is_float:
        raise UnsupportedError(f"{target_of(inst)} quantizes a float array, not {x.to_text(False)}", inst)
    emax = t.numpy.type(2.0 ** (ml_dtypes.finfo(values.element_type.numpy).maxexp - 1))
    divide = float_lifted(np.divide, t.numpy)
    to_scale, from_scale = convert_kernel(t, scales.element_type, inst), convert_kernel(scales.element_type, t, inst)
    to_values = convert_kernel(t, values.element_type, inst)

    def kernel(a):
        amax = np.abs(a.reshape(*scales.dims, block)).max(axis=-1, initial=0)
        scale = to_scale(divide(amax, emax))
        return to_values(divide(a, np.repeat(from_scale(scale), block, axis=-1))), scale

    return kernel


@custom_call("__op$dequantize", operands=2, returns="array")
def dequantize(inst, ctx):
    """(values, scales) -> values times their scale: both converted to the result type, each scale repeated over
    its block of the last dim (block = values' last dim / scales' last dim), one multiply rounded to it."""
    values, scales = (o.shape for o in inst.operands)
    block_size(inst, values, scales)
    if inst.shape.dims != values.dims or not inst.shape.element_type.is_float:
        raise UnsupportedError(
            f"{target_of(inst)} returns a float array of its values' dims, the call says "
            f"{inst.shape.to_text(layout=False)}",
            inst,
        )
    return dequantizer(inst, 0, 1, inst.shape.element_type)[0]


@custom_call("__op$block_scaled_dot")
def block_scaled_dot(inst, ctx):
    """Operands (lhs, rhs, lhs_scale[, rhs_scale[, global_scale]]) of rank 2 ([rows, K]) or 3 ([batch, rows, K]):
    each input and its scale converted to the result type, the scale repeated over blocks of K / scale_K
    consecutive elements of the last dim (or of backend_config's block_scaled_dot_backend_config block_size: the
    scales may be padded, sliced to the rows and ceil(K / block) blocks), multiplied (MXFP8: f8e8m0fnu scales per
    32; NVFP4: f8e4m3fn scales per 16 over f4e2m1fn); without rhs_scale the rhs is only converted; then a dot
    contracting both last dims (batch dim 0 when rank 3) in the result type at DEFAULT precision, as the run's
    device computes such a dot; with a global scale (a scalar of the result type) the dot's result times it, one
    multiply rounded to the result type (block_scaling_rewriter.cc ExpandBlockScaledDotCustomCall, the general
    expansion)."""
    n = len(inst.operands)
    shapes = [o.shape for o in inst.operands]
    out = inst.shape.element_type
    if (
        inst.shape.is_tuple
        or not 3 <= n <= 5
        or shapes[0].rank not in (2, 3)
        or shapes[1].rank != shapes[0].rank
        or (n == 5 and (shapes[4].rank != 0 or shapes[4].element_type != out))
    ):
        raise UnsupportedError(
            f"{target_of(inst)} takes (lhs, rhs, lhs_scale[, rhs_scale[, global_scale: a scalar "
            "of the result type]]) of rank 2 or 3 and returns one array",
            inst,
        )
    rank = shapes[0].rank
    batch = (0,) if rank == 3 else ()
    block = _block_size(inst)
    lhs = dequantizer(inst, 0, 2, out, block)[0]
    rhs = dequantizer(inst, 1, 3, out, block)[0] if n >= 4 else _converted(shapes[1].element_type, out, inst)
    product = device_dot(inst, ctx, out, out, out)
    scaled = float_lifted(np.multiply, out.numpy)

    def kernel(a, b, a_scale, b_scale=None, global_scale=None):
        r = product(lhs(a, a_scale), rhs(b, b_scale), batch, batch, (rank - 1,), (rank - 1,), out.numpy)
        return r if global_scale is None else scaled(r, global_scale)

    return kernel


def _converted(src, dst, inst):
    """kernel(x, unused scale) -> x converted to `dst` (an operand without a scale)."""
    convert = converter(src, dst, inst)
    return lambda x, _: convert(x)


def _block_size(inst) -> int | None:
    """backend_config's block_scaled_dot_backend_config.block_size, None without one."""
    try:
        size = json.loads(inst.attrs.get("backend_config") or "{}").get("block_scaled_dot_backend_config", {})
        size = size.get("block_size") if isinstance(size, dict) else None
        return None if size is None else int(size)
    except (ValueError, TypeError, AttributeError):
        raise UnsupportedError(
            f"{target_of(inst)}: backend_config's block_scaled_dot_backend_config block_size is not an integer", inst
        ) from None
