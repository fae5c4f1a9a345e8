"""An hloexec plugin: custom-call targets hloexec does not know, registered from a Python file.

    hloexec run ../shared/corpus/external/files/jaxdocs_custom_op_rms_norm_shardmap_gpu.hlo \
        --plugin examples/custom_call_plugin.py

The target here is `rms_forward_affine_mixed_dtype`, the fused RMS norm of JAX's "Custom operations for GPUs"
tutorial (docs/Custom_Operation_for_GPUs.md), a CUDA kernel a dump can only name. A plugin states its
meaning in numpy: `prepare(inst, ctx)` runs once per instruction, reads what the call carries (operand and
result shapes, the backend_config) and returns `kernel(*operand_values)`, which every run calls.

The same file works as an installed plugin: put the registration in a module of your package and name it in
your pyproject.toml, and hloexec loads it the first time it meets a target it does not know:

    [project.entry-points."hloexec.custom_calls"]
    rms_norm = "my_package.hloexec_calls"        # a module (registers on import), or "module:function"
"""
import struct

import numpy as np

from hloexec import UnsupportedError
from hloexec.ops.custom_call import register_custom_call


def prepare_rms_forward_affine(inst, ctx):
    """rms_forward_affine_mixed_dtype(x [n1, ...], weight [...]) -> (out, invvar f32[n1]): over the trailing
    n2 elements of each of the n1 rows, invvar = 1 / sqrt(mean(x^2) + eps) and out = weight * x * invvar,
    computed in f32. The descriptor (backend_config) packs n1, n2 (int32) and eps (float64), little-endian."""
    descriptor = inst.attr("backend_config")
    if not isinstance(descriptor, bytes) or len(descriptor) < 16:
        raise UnsupportedError("rms_forward_affine_mixed_dtype without its packed descriptor", inst)
    n1, n2, eps = struct.unpack_from("<iid", descriptor)
    out_shape, invvar_shape = inst.shape.tuple_shapes
    eps32 = np.float32(eps)

    def kernel(x, weight):
        rows = x.astype(np.float32).reshape(n1, n2)
        invvar = 1 / np.sqrt(np.mean(np.square(rows), axis=1, dtype=np.float32) + eps32)
        out = weight.astype(np.float32).reshape(1, n2) * (rows * invvar[:, None])
        return out.astype(out_shape.dtype).reshape(out_shape.dims), invvar.astype(invvar_shape.dtype)
    return kernel


register_custom_call("rms_forward_affine_mixed_dtype", prepare_rms_forward_affine)
