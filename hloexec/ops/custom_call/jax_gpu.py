"""jax's own GPU kernels that are not linear algebra (the solver calls are in lapack.py)."""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ..common import contig
from ..rng import threefry2x32
from .registry import custom_call, target_of


@custom_call("cu_threefry2x32_ffi", "hip_threefry2x32_ffi")
def jax_threefry2x32(inst, ctx):
    """jax's threefry2x32 hash on the GPU (`jax_threefry_gpu_kernel_lowering`): operands (key0, key1, x0, x1),
    u32 arrays of one shape; results (y0, y1) = Threefry-2x32 with 20 rounds of (x0, x1) under the key
    (k0, k1), elementwise: the bits jax.random's threefry computes on any backend."""
    leaves = inst.shape.tuple_shapes if inst.shape.is_tuple else ()
    if len(inst.operands) != 4 or len(leaves) != 2:
        raise UnsupportedError(f"{target_of(inst)} takes (key0, key1, x0, x1) and returns (y0, y1)", inst)

    def kernel(k0, k1, x0, x1):
        k0, k1, x0, x1 = np.broadcast_arrays(*(np.asarray(v, np.uint32) for v in (k0, k1, x0, x1)))
        y0, y1 = threefry2x32(x0, x1, k0, k1)
        return contig(np.asarray(y0, np.uint32)), contig(np.asarray(y1, np.uint32))

    return kernel
