"""XLA-GPU's block-scaled dot call (MXFP8 / NVFP4), as xla/service/gpu/transforms/block_scaling_rewriter.cc
expands it."""
from __future__ import annotations

from ...errors import UnsupportedError
from ..contraction import dequantizer, device_dot
from .registry import custom_call, target_of


@custom_call("__op$block_scaled_dot")
def block_scaled_dot(inst, ctx):
    """Operands (lhs, rhs, lhs_scale, rhs_scale) of rank 2 ([rows, K]) or 3 ([batch, rows, K]): each input and its
    scale converted to the result type, the scale repeated over blocks of K / scale_K consecutive elements of the
    last dim, multiplied (MXFP8: f8e8m0fnu scales per 32; NVFP4: f8e4m3fn scales per 16 over f4e2m1fn); then a
    dot contracting both last dims (batch dim 0 when rank 3) in the result type at DEFAULT precision, as the
    run's device computes such a dot (block_scaling_rewriter.cc TransformCustomCall)."""
    if inst.shape.is_tuple or len(inst.operands) != 4 or inst.operands[0].shape.rank not in (2, 3) \
            or inst.operands[1].shape.rank != inst.operands[0].shape.rank:
        raise UnsupportedError(f"{target_of(inst)} takes (lhs, rhs, lhs_scale, rhs_scale) of rank 2 or 3 and "
                               "returns one array", inst)
    rank = inst.operands[0].shape.rank
    out = inst.shape.element_type
    batch = (0,) if rank == 3 else ()
    (lhs, _), (rhs, _) = dequantizer(inst, 0, 2, out), dequantizer(inst, 1, 3, out)
    product = device_dot(inst, ctx, out, out, out)

    def kernel(a, b, a_scale, b_scale):
        return product(lhs(a, a_scale), rhs(b, b_scale), batch, batch, (rank - 1,), (rank - 1,), out.numpy)
    return kernel
