"""AWS Neuron's activation and normalization calls (pytorch/xla on Trainium/Inferentia dumps), by the meaning
torch-neuronx gives them: the functions of torch.nn.functional they replace. AwsNeuronTransferWithStaticRing is
a transfer whose value is its operand: run those dumps with `--custom-call-identity
AwsNeuronTransferWithStaticRing`."""

from __future__ import annotations

import math

import numpy as np

from ...errors import UnsupportedError
from ..contraction import finish, to_compute
from .cublas import gelu_tanh
from .registry import custom_call, target_of

_F32 = np.dtype(np.float32)


def _work(dtype):
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else _F32


def _elementwise(inst, fn):
    """kernel(x) -> fn(x) computed in f32 (f64 for f64), rounded once to the result type."""
    if len(inst.operands) != 1 or inst.shape.is_tuple:
        raise UnsupportedError(f"{target_of(inst)} takes one array operand", inst)
    out_dtype = inst.shape.dtype
    work = _work(out_dtype)

    def kernel(x):
        with np.errstate(over="ignore"):
            return finish(fn(to_compute(x, work)), out_dtype)

    return kernel


def _phi(x):
    """The standard normal CDF, 0.5 (1 + erf(x / sqrt 2))."""
    from scipy.special import erf

    return (0.5 * (1 + erf(x / np.asarray(math.sqrt(2), x.dtype)))).astype(x.dtype)


@custom_call("AwsNeuronGelu")
def neuron_gelu(inst, ctx):
    """torch's exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); f32 (f64 for f64), rounded once."""
    return _elementwise(inst, lambda x: x * _phi(x))


@custom_call("AwsNeuronGeluApprxTanh")
def neuron_gelu_tanh(inst, ctx):
    """torch's GELU with approximate='tanh': 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); f32, rounded once."""
    return _elementwise(inst, gelu_tanh)


@custom_call("AwsNeuronGeluBackward")
def neuron_gelu_backward(inst, ctx):
    """The derivative of the exact GELU at x, Phi(x) + x phi(x) (the dumps multiply it by the incoming
    gradient); f32 (f64 for f64), rounded once."""

    def derivative(x):
        pdf = np.exp(-0.5 * x * x) / np.asarray(math.sqrt(2 * math.pi), x.dtype)
        return _phi(x) + x * pdf

    return _elementwise(inst, derivative)


@custom_call("AwsNeuronSilu")
def neuron_silu(inst, ctx):
    """SiLU, x * sigmoid(x); f32 (f64 for f64), rounded once."""
    return _elementwise(inst, lambda x: x / (1 + np.exp(-x)))


@custom_call("AwsNeuronErf")
def neuron_erf(inst, ctx):
    """erf(x); f32 (f64 for f64), rounded once."""

    def erf(x):
        from scipy.special import erf as _erf

        return _erf(x).astype(x.dtype)

    return _elementwise(inst, erf)


@custom_call("AwsNeuronRmsNorm", operands=3, returns="array")
def neuron_rms_norm(inst, ctx):
    """RMS norm over the dimension in backend_config (a number as text): operands (x, weight along that
    dimension, epsilon scalar); y = x / sqrt(mean(x^2 over the dimension) + epsilon) * weight, in f32 (f64 for
    f64), rounded once."""
    raw = inst.attr("backend_config")
    x_shape = inst.operands[0].shape
    try:
        dim = int(str(raw).strip()) % x_shape.rank
    except (TypeError, ValueError, ZeroDivisionError):
        raise UnsupportedError(f"AwsNeuronRmsNorm whose backend_config {raw!r} is not a dimension", inst) from None
    if len(inst.operands) != 3 or inst.operands[1].shape.dims != (x_shape.dims[dim],):
        raise UnsupportedError("AwsNeuronRmsNorm takes (x, weight along the normalized dim, epsilon)", inst)
    out_dtype = inst.shape.dtype
    work = _work(out_dtype)
    along = [1] * x_shape.rank
    along[dim] = -1

    def kernel(x, weight, eps):
        x = to_compute(x, work)
        ms = np.mean(np.square(x), axis=dim, keepdims=True, dtype=work)
        y = x / np.sqrt(ms + to_compute(np.asarray(eps), work)) * to_compute(weight, work).reshape(along)
        return finish(y, out_dtype)

    return kernel
