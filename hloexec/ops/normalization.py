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


def _per_feature(rank: int, feature: int):
    """(reduced axes, a reshaper putting a per-feature vector on the feature axis)."""
    axes = tuple(d for d in range(rank) if d != feature)
    shape = [1] * rank
    shape[feature] = -1
    return axes, (lambda v: v.reshape(shape))


def _work_dtype(dtype):
    return _F32 if is_low_float(dtype) else np.dtype(dtype)


def _setup(inst):
    """(feature index, epsilon, rank, result dtype, compute dtype) of a batch-norm op; feature_index is required
    (XLA's parser) and must index a dimension whose size the scale (and offset) have."""
    operand = inst.operands[0].shape
    feature = required(inst, "feature_index")
    if not 0 <= feature < operand.rank or inst.operands[1].shape.dims != (operand.dims[feature],):
        raise invalid(
            inst,
            f"feature_index={feature} of {operand.to_text(False)} with the scale "
            f"{inst.operands[1].shape.to_text(False)}",
        )
    out_dtype = operand.dtype
    return feature, inst.attr("epsilon", 0.0), operand.rank, out_dtype, _work_dtype(out_dtype)


def batch_norm_training(feature: int, epsilon: float, rank: int, work):
    """kernel(x, scale, offset) -> (y, batch mean, biased batch variance), in the compute dtype `work`."""
    axes, per_feature = _per_feature(rank, feature)
    eps = np.asarray(epsilon, dtype=work)

    def kernel(x, scale, offset):
        x = x.astype(work)
        mean = x.mean(axis=axes, dtype=work)
        centered = x - per_feature(mean)
        var = np.square(centered).mean(axis=axes, dtype=work)
        y = centered / np.sqrt(per_feature(var) + eps) * per_feature(scale.astype(work)) + per_feature(
            offset.astype(work)
        )
        return y, mean, var

    return kernel


def batch_norm_inference(feature: int, epsilon: float, rank: int, work):
    """kernel(x, scale, offset, mean, variance) -> y, in the compute dtype `work`."""
    _, per_feature = _per_feature(rank, feature)
    eps = np.asarray(epsilon, dtype=work)

    def kernel(x, scale, offset, mean, var):
        f = [per_feature(v.astype(work)) for v in (scale, offset, mean, var)]
        return (x.astype(work) - f[2]) / np.sqrt(f[3] + eps) * f[0] + f[1]

    return kernel


def batch_norm_grad(feature: int, rank: int, work):
    """kernel(x, scale, mean, variance + epsilon, 1 / sqrt(variance + epsilon), grad_out) -> (grad operand,
    grad scale, grad offset), in the compute dtype `work`."""
    axes, per_feature = _per_feature(rank, feature)

    def kernel(x, scale, mean, var_eps, inv_std, grad_out):
        x, grad_out = x.astype(work), grad_out.astype(work)
        count = work.type(x.size // max(mean.size, 1))
        centered = x - per_feature(mean.astype(work))
        sum_grad = grad_out.sum(axis=axes, dtype=work)
        sum_grad_centered = (grad_out * centered).sum(axis=axes, dtype=work)
        grad_scale = sum_grad_centered * inv_std
        grad_x = per_feature(scale.astype(work) * inv_std / count) * (
            count * grad_out - per_feature(sum_grad) - centered * per_feature(sum_grad_centered / var_eps)
        )
        return grad_x, grad_scale, sum_grad

    return kernel


@op(
    "batch-norm-training",
    dtypes=FLOATS,
    kernel="numpy",
    notes="(y, batch mean, batch variance); variance biased; f16/bf16 in f32",
)
def prepare_batch_norm_training(inst, ctx):
    feature, eps, rank, out_dtype, work = _setup(inst)
    train = batch_norm_training(feature, eps, rank, work)

    def kernel(x, scale, offset):
        return tuple(contig(v.astype(out_dtype)) for v in train(x, scale, offset))

    return kernel


@op("batch-norm-inference", dtypes=FLOATS, kernel="numpy", notes="given mean and variance; f16/bf16 in f32")
def prepare_batch_norm_inference(inst, ctx):
    feature, eps, rank, out_dtype, work = _setup(inst)
    infer = batch_norm_inference(feature, eps, rank, work)

    def kernel(x, scale, offset, mean, var):
        return contig(infer(x, scale, offset, mean, var).astype(out_dtype))

    return kernel


@op(
    "batch-norm-grad",
    dtypes=FLOATS,
    kernel="numpy",
    notes="(grad operand, grad scale, grad offset) as in XLA's operation semantics; f16/bf16 in f32",
)
def prepare_batch_norm_grad(inst, ctx):
    feature, eps, rank, out_dtype, work = _setup(inst)
    grad = batch_norm_grad(feature, rank, work)
    eps = np.asarray(eps, dtype=work)

    def kernel(x, scale, mean, var, grad_out):
        var_eps = var.astype(work) + eps
        with np.errstate(invalid="ignore", divide="ignore"):  # a negative variance input gives NaN, as XLA
            inv_std = 1 / np.sqrt(var_eps)
        return tuple(contig(v.astype(out_dtype)) for v in grad(x, scale, mean, var_eps, inv_std, grad_out))

    return kernel
