"""Ops of no other family: stochastic-convert, dynamic-reshape, scan."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import ExecutionError, UnsupportedError
from ..ir.dtypes import element_type
from ..kernels import semantics
from .common import as_tuple, contig, invalid
from .elementwise import convert_kernel
from .registry import op

_F64 = np.dtype(np.float64)


@op(
    "stochastic-convert",
    dtypes="f16, bf16, f32, f64 -> s8-s64",
    notes="as XLA's StochasticConvertDecomposer: "
    "|x| rounds up when random < frac(|x|) * 2^bits(random); x <= INT_MIN / >= INT_MAX saturate, NaN -> 0",
)
def _prepare_stochastic_convert(inst, ctx):
    src_t, random_t, dst_t = (
        inst.operands[0].shape.element_type,
        inst.operands[1].shape.element_type,
        inst.shape.element_type,
    )
    if not inst.operands[0].shape.dims == inst.operands[1].shape.dims == inst.shape.dims:
        raise invalid(
            inst,
            f"operand, random bits and result need one shape: {inst.operands[0].shape.to_text(False)}, "
            f"{inst.operands[1].shape.to_text(False)} -> {inst.shape.to_text(False)}",
        )
    if src_t.kind != "float" or random_t.kind != "uint" or dst_t.kind != "sint":
        raise UnsupportedError(
            f"stochastic-convert {src_t.name} (random {random_t.name}) -> {dst_t.name}: "
            "XLA converts floats to signed integers only",
            inst,
        )
    dst = dst_t.numpy
    info = ml_dtypes.iinfo(dst)  # numpy's iinfo knows no s2/s4
    # XLA compares the operand with INT_MIN/INT_MAX converted to the operand's type (e.g. 2^31 - 1 -> 2^31 in f32).
    lo, hi = semantics.saturation_bounds(src_t, dst_t)
    scale = float(2**random_t.bits)
    f64 = element_type("f64")
    to_random, to_dst = convert_kernel(f64, random_t, inst), convert_kernel(f64, dst_t, inst)

    def kernel(x, random):
        # Every step below is exact in f64 for f16/bf16/f32 operands (floor, |x| - floor, * 2^bits);
        # f64 operands are what XLA computes in already.
        x = x.astype(_F64)
        with np.errstate(invalid="ignore", over="ignore"):
            magnitude = np.abs(x)
            truncated = np.floor(magnitude)
            fixed_fractional = to_random((magnitude - truncated) * scale)
            # in s64, wrapped to the destination's width at the end as XLA's integer ops wrap (s2/s4 included)
            result = to_dst(truncated).astype(np.int64)
            result = np.where(random < fixed_fractional, result + 1, result)
            result = np.where(x < 0, -result, result)
            result = np.where(x <= lo, info.min, result)
            result = np.where(x >= hi, info.max, result)
        return result.astype(dst)

    return kernel


@op(
    "dynamic-reshape",
    notes="operands 1.. are the output's dimension sizes: the first prod(sizes) elements of "
    "the operand, row-major, fill the [:size] corner of the bound-shaped output; the padding past it is 0",
)
def _prepare_dynamic_reshape(inst, ctx):
    bounds = inst.shape.dims
    if len(inst.operands) != 1 + len(bounds):
        raise UnsupportedError(f"dynamic-reshape with {len(inst.operands) - 1} sizes for rank {len(bounds)}", inst)
    dtype = inst.shape.dtype

    def kernel(x, *sizes):
        sizes = tuple(int(s) for s in sizes)
        count = int(np.prod(sizes, dtype=np.int64))
        if any(not 0 <= s <= b for s, b in zip(sizes, bounds)) or count > x.size:
            raise ExecutionError(
                f"dynamic-reshape %{inst.name}: sizes {list(sizes)} outside the bounds "
                f"{list(bounds)} or more than the operand's {x.size} elements"
            )
        if sizes == bounds:
            return x.reshape(bounds)
        out = np.zeros(bounds, dtype)
        out[tuple(slice(0, s) for s in sizes)] = x.reshape(-1)[:count].reshape(sizes)
        return out

    return kernel


@op(
    "scan",
    kernel="python",
    notes="to_apply(slices of inputs along the dimension, carries) -> (outputs, "
    "carries); outputs stack along the dimension; is_reverse runs from the last index; operands are "
    "inputs then initial carries, results are stacked outputs then final carries",
)
def _prepare_scan(inst, ctx):
    dims = tuple(inst.attr("dimensions") or ())
    if len(dims) != 1:
        raise UnsupportedError(f"scan over dimensions {list(dims)} (one dimension expected)", inst)
    axis = int(dims[0])
    num_carries = int(inst.attr("num_carries", 0))
    reverse = str(inst.attr("is_reverse", "false")).lower() == "true"
    num_inputs = len(inst.operands) - num_carries
    if num_inputs < 0:
        raise UnsupportedError(f"scan with num_carries={num_carries} but {len(inst.operands)} operands", inst)
    result_shapes = inst.shape.tuple_shapes if inst.shape.is_tuple else (inst.shape,)
    num_outputs = len(result_shapes) - num_carries
    output_shapes = result_shapes[:num_outputs]
    comp = inst.called["to_apply"]
    if (
        num_outputs < 0
        or len(comp.parameters) != len(inst.operands)
        or any(o.shape.is_tuple or o.shape.rank <= axis for o in inst.operands[:num_inputs])
        or any(s.is_tuple or s.rank <= axis for s in output_shapes)
    ):
        raise invalid(
            inst,
            f"{num_inputs} inputs and {num_carries} carries along dimension {axis}, results "
            f"{inst.shape.to_text(False)} and a body of {len(comp.parameters)} parameters",
        )
    length = inst.operands[0].shape.dims[axis] if num_inputs else (output_shapes[0].dims[axis] if num_outputs else 0)
    body = ctx.computation(comp)

    def kernel(*operands):
        inputs, carries = operands[:num_inputs], operands[num_inputs:]
        outputs = [np.empty(s.dims, s.dtype) for s in output_shapes]
        for i in range(length - 1, -1, -1) if reverse else range(length):
            results = as_tuple(body(*[contig(np.take(x, i, axis=axis)) for x in inputs], *carries))
            for out, value in zip(outputs, results[:num_outputs]):
                out[(slice(None),) * axis + (i,)] = value
            carries = results[num_outputs:]
        results = (*outputs, *(contig(c) for c in carries))
        return results if inst.shape.is_tuple else results[0]

    return kernel
