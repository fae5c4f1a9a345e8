"""Batch normalization: batch-norm-training, batch-norm-inference, batch-norm-grad.

XLA's operation semantics (BatchNormTraining / BatchNormInference / BatchNormGrad), as its
BatchNormExpander lowers them: statistics over every dimension but `feature_index`, the biased
variance E[(x - mean)^2], `epsilon` added to the variance. f16/bf16 are computed in f32 and rounded
once per result.
"""
from __future__ import annotations

import numpy as np

from .common import contig, invalid, is_low_float, required
from .registry import FLOATS, op

_F32 = np.dtype(np.float32)


def _layout(inst):
    """(feature axis, reduction axes, a reshaper putting a per-feature vector on the feature axis)."""
    operand = inst.operands[0].shape
    feature = required(inst, "feature_index")
    if not 0 <= feature < operand.rank or any(o.shape.dims != (operand.dims[feature],) for o in inst.operands[1:3]):
        raise invalid(inst, f"feature_index={feature} of {operand.to_text(False)} with scale/offset "
                            f"{[o.shape.to_text(False) for o in inst.operands[1:3]]}")
    rank = operand.rank
    axes = tuple(d for d in range(rank) if d != feature)
    shape = [1] * rank
    shape[feature] = -1
    return axes, (lambda v: v.reshape(shape))


def _work_dtype(dtype):
    return _F32 if is_low_float(dtype) else np.dtype(dtype)


def _setup(inst):
    """(reduced axes, per-feature broadcaster, result dtype, compute dtype, epsilon) of a batch-norm op."""
    axes, per_feature = _layout(inst)
    out_dtype = inst.operands[0].shape.dtype
    work = _work_dtype(out_dtype)
    return axes, per_feature, out_dtype, work, np.asarray(inst.attr("epsilon", 0.0), dtype=work)


@op("batch-norm-training", dtypes=FLOATS, kernel="numpy",
    notes="(y, batch mean, batch variance); variance biased; f16/bf16 in f32")
def prepare_batch_norm_training(inst, ctx):
    axes, per_feature, out_dtype, work, eps = _setup(inst)

    def kernel(x, scale, offset):
        x = x.astype(work)
        mean = x.mean(axis=axes, dtype=work)
        centered = x - per_feature(mean)
        var = np.square(centered).mean(axis=axes, dtype=work)
        y = centered / np.sqrt(per_feature(var) + eps) * per_feature(scale.astype(work)) \
            + per_feature(offset.astype(work))
        return contig(y.astype(out_dtype)), contig(mean.astype(out_dtype)), contig(var.astype(out_dtype))
    return kernel


@op("batch-norm-inference", dtypes=FLOATS, kernel="numpy", notes="given mean and variance; f16/bf16 in f32")
def prepare_batch_norm_inference(inst, ctx):
    axes, per_feature, out_dtype, work, eps = _setup(inst)

    def kernel(x, scale, offset, mean, var):
        f = [per_feature(v.astype(work)) for v in (scale, offset, mean, var)]
        y = (x.astype(work) - f[2]) / np.sqrt(f[3] + eps) * f[0] + f[1]
        return contig(y.astype(out_dtype))
    return kernel


@op("batch-norm-grad", dtypes=FLOATS, kernel="numpy",
    notes="(grad operand, grad scale, grad offset) as in XLA's operation semantics; f16/bf16 in f32")
def prepare_batch_norm_grad(inst, ctx):
    axes, per_feature, out_dtype, work, eps = _setup(inst)

    def kernel(x, scale, mean, var, grad_out):
        x, grad_out = x.astype(work), grad_out.astype(work)
        count = work.type(x.size // max(mean.size, 1))
        centered = x - per_feature(mean.astype(work))
        with np.errstate(invalid="ignore", divide="ignore"):  # a negative variance input gives NaN, as XLA
            inv_std = 1 / np.sqrt(var.astype(work) + eps)
        sum_grad = grad_out.sum(axis=axes, dtype=work)
        sum_grad_centered = (grad_out * centered).sum(axis=axes, dtype=work)
        grad_scale = sum_grad_centered * inv_std
        grad_x = per_feature(scale.astype(work) * inv_std / count) * (
            count * grad_out - per_feature(sum_grad)
            - centered * per_feature(sum_grad_centered / (var.astype(work) + eps)))
        return (contig(grad_x.astype(out_dtype)), contig(grad_scale.astype(out_dtype)),
                contig(sum_grad.astype(out_dtype)))
    return kernel
