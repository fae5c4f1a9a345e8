"""Compiled kernels a dump can only name: their meaning is the program in their backend_config (Triton IR,
PTX, Mosaic bytecode), which hloexec does not run. A run stops at them with an error that says so and how to
plug in an implementation (a plugin registering the target replaces this error)."""

from __future__ import annotations

from .registry import OPAQUE_KERNELS

OPAQUE_KERNELS.update(
    {
        "__gpu$xla.gpu.triton": "a Triton kernel (jax Pallas on GPU / jax-triton): its Triton IR is in backend_config",
        "triton_kernel_call": "a jax-triton kernel compiled to PTX",
        "triton_kernel_call_ffi": "a jax-triton kernel compiled to PTX",
        "tpu_custom_call": "a Mosaic TPU kernel (jax Pallas on TPU, pytorch/xla's Pallas kernels): serialized MLIR "
        "in backend_config",
        "mosaic_gpu": "a Mosaic GPU kernel (jax.experimental.mosaic.gpu): serialized MLIR in backend_config",
        "mosaic_gpu_v2": "a Mosaic GPU kernel (jax.experimental.mosaic.gpu): serialized MLIR in backend_config",
        "CuteDSLRT_NvJaxCutlassCall": "a CUTLASS CuTe DSL kernel compiled for the GPU",
    }
)
