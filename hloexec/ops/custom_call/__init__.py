"""custom-call: one opcode, dispatched on `custom_call_target` through a registry users can extend.

    from hloexec.ops.custom_call import register_custom_call
    def prepare_my_target(inst, ctx):          # same contract as an op's prepare
        return lambda *operands: ...
    register_custom_call("my_target", prepare_my_target)

or `@custom_call("my_target")` as a decorator; from the command line `hloexec run --plugin my_calls.py`, or
an installed package's entry point in the group `hloexec.custom_calls` (see registry.py). An unregistered
target raises UnsupportedError naming it and these ways to plug one in.

The built-in targets, one module per family (each target's docstring states its numerics):
  markers   identity markers, dce_sink, SliceToDynamic, PadToStatic, targets named by --custom-call-identity
  cublas    cuBLAS gemm / cublasLt matmul (fp8 scales too), cuBLAS triangular solve
  block_scaled  __op$quantize, __op$dequantize, __op$block_scaled_dot (MXFP8 / NVFP4 block scaling)
  cudnn     cuDNN convolutions (forward, backward input/filter, bias-activation, graph), batch norm,
            layer norm, fused attention
  lapack    jax's CPU LAPACK calls
  gpu_solver  the GPU solver calls (cuSOLVER, cuBLAS batched, pivots) through the same routines
  sorting   TopK, __gpu$TopK, cub radix sort, PartialReduce (approximate top-k)
  composite xla_builder.* calls, Transformer Engine softmax, kCustom-style bodies, XLA:CPU's GetRngSeed
  jax_gpu   jax's GPU threefry
  neuron    AWS Neuron activations and RMS norm
  onednn    XLA:CPU's oneDNN layer norm
  opaque    compiled kernels (Triton, Mosaic) that cannot run: a clear error
"""

from __future__ import annotations

from ..registry import op
from .registry import (
    CUSTOM_CALLS,
    ENTRY_POINT_GROUP,
    OPAQUE_KERNELS,
    backend_config,
    custom_call,
    field,
    load_entry_points,
    lookup,
    register_custom_call,
    target_of,
)


@op(
    "custom-call",
    kernel="python",
    notes="Dispatches on custom_call_target through hloexec.ops.custom_call.CUSTOM_CALLS (register_custom_call, "
    "--plugin FILE, --custom-call-identity NAME and the `hloexec.custom_calls` entry points add targets); "
    "the built-in targets are in the table below.",
)
def prepare_custom_call(inst, ctx):
    return lookup(inst)(inst, ctx)


from . import (
    block_scaled,
    composite,
    cublas,
    cudnn,
    gpu_solver,
    jax_gpu,
    lapack,
    markers,
    neuron,
    onednn,
    opaque,
    sorting,
)
from .markers import register_identity
