"""Markers whose value is their operand, jax's dce_sink, and the dynamic-shape calls (values are static arrays of
the bound shape in hloexec: a dynamic size is the bound)."""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from .registry import custom_call, register_custom_call, target_of


@custom_call(
    "Sharding",
    "MoveToHost",
    "MoveToDevice",
    "annotate_device_placement",
    "LayoutConstraint",
    "__builtin$CrossMeshAllReduce",
    "pipeline_marker",
    "xla_python_cpu_callback_identity_marker_unused",
    "xla.sdy.FuncResultSharding",
    "SetBound",
)  # SetBound: a bound for dynamic shapes, values unchanged
def identity(inst, ctx):
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
        raise UnsupportedError(
            f"custom-call {target_of(inst)!r} changes the shape "
            f"{src.to_text(False)} -> {inst.shape.to_text(False)} (needs >1 participant)",
            inst,
        )
    if not src.is_tuple and not inst.shape.is_tuple and src.dtype != inst.shape.dtype:
        raise UnsupportedError(
            f"custom-call {target_of(inst)!r} changes the element type "
            f"{src.to_text(False)} -> {inst.shape.to_text(False)}: not an identity",
            inst,
        )

    def kernel(x):
        return x

    return kernel


def register_identity(target: str) -> None:
    """Make `target` an identity marker (`--custom-call-identity NAME`): its value is its operand(s)."""
    register_custom_call(target, identity, replace=True)


@custom_call("dce_sink")
def dce_sink(inst, ctx):
    """`dce_sink` (jax's lax.dce_sink with prevent_mlir_dce): a side effect that keeps its operands alive
    through dead-code elimination and does nothing else; its value is the empty tuple."""
    return lambda *operands: ()


@custom_call("SliceToDynamic", operands=range(1, 1 << 31), returns="array")
def slice_to_dynamic(inst, ctx):
    """SliceToDynamic(x, size_0, ...): x with the given dynamic sizes. hloexec values are static arrays of
    the bound shape, so the value is x; elements past a dynamic size are padding (XLA:CPU leaves them
    uninitialized)."""
    if inst.shape.is_tuple or tuple(inst.operands[0].shape.dims) != tuple(inst.shape.dims):
        raise UnsupportedError("SliceToDynamic whose result bounds differ from its operand's shape", inst)

    def kernel(x, *sizes):
        return x

    return kernel


@custom_call("PadToStatic", operands=1, returns="tuple")
def pad_to_static(inst, ctx):
    """PadToStatic(x) -> (x as a static array, s32 size of dim 0, size of dim 1, ...): the inverse of
    SliceToDynamic. hloexec values are static arrays of the bound shape, so the data is x and each size its
    bound (XLA fills the padding past a smaller dynamic size with unspecified values)."""
    leaves = inst.shape.tuple_shapes if inst.shape.is_tuple else ()
    src = inst.operands[0].shape
    if (
        len(inst.operands) != 1
        or len(leaves) != src.rank + 1
        or tuple(leaves[0].dims) != tuple(src.dims)
        or any(s.rank != 0 for s in leaves[1:])
    ):
        raise UnsupportedError("PadToStatic must return (the operand's shape, one scalar size per dimension)", inst)
    sizes = [np.asarray(d, s.dtype) for d, s in zip(src.dims, leaves[1:])]

    def kernel(x):
        return (x, *sizes)

    return kernel
