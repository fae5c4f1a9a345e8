"""Error bounds of XLA-GPU's library calls that finish a contraction in their compute type before one final
rounding (tools/bounds.py): cuBLAS gemms with alpha, beta (a C operand accumulated) or an epilogue (bias,
RELU, GELU, SILU, the pre-activation aux output), cuBLASLt's fp8 matmul (its scales, saturation and amax too:
`_f8_matmul_epilogue`), and cuDNN convolutions (forward, backward input, backward
filter, bias-activation). The shadow computes them in f64 (exec/shadow.py COMPUTING_CUSTOM_CALLS), so their exact
values are known; the bound is the contraction's rule (a dot's, a convolution's: their accumulation in the
compute type, f32 for 16-bit and f32 calls, f64 for f64 ones), then the epilogue as the elementwise rules would
bound it, every step in the compute type:

- the scale (alpha, conv_result_scale): its bound scaled, plus the scalar's own rounding to the compute type
  (cuBLAS and cuDNN take it as one: 0.01 is f32's 0.01) on every element, plus one rounding unless it is a power
  of two;
- an accumulated operand (beta * C, side_input_scale * side_input) and a bias: their bounds added as independent,
  one rounding each;
- the activation at the ends of the interval, `max |f(y +- e) - f(y)|` (RELU, relu6, leaky relu: exact or one
  rounding; GELU's tanh form, SILU, sigmoid, tanh, elu, erf's GELU: TRANSCENDENTAL ulps of f32 more);
- the final rounding to the result's type (an aux output: the pre-activation value rounded to its own).

The samples are the call's own kernel on the perturbed operands (bounds.ErrorBounds._sample), so its bound is
calibrated and raised as a dot's, its ceiling the product's ceiling carried through the same steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from collections.abc import Callable

import numpy as np

from ..ir.dtypes import ELEMENT_TYPES
from ..ir.module import Instruction
from ..ops.custom_call.cublas import F8_MATMUL, F8Operands, Gemm
from ..ops.custom_call.cudnn import CONV_KINDS, ConvCall, bias_activation, conv_product
from ..ops.custom_call.registry import result_leaves, target_of
from .bound_convolution import GEMM_TARGETS, convolution_bounds, gemm_dot
from .bound_dots import dot_bounds

_ACTIVATION_ROUNDING = {  # cuDNN activation mode -> the opcode whose rounding rule it has (None: exact)
    "kNone": None,
    "kRelu": None,
    "kRelu6": None,
    "kLeakyRelu": "multiply",
    "kSigmoid": "logistic",
    "kTanh": "tanh",
    "kElu": "exponential-minus-one",
    "kGeluExact": "erf",
}


@dataclass
class Epilogue:
    """A library call decoded for its bound: the product of its two first operands (`product(bounds)`: its
    kernel, exact in the shadow) and `contracted(bounds, orig, p, a, b, etype)` bounding it in the compute type
    `etype` (stored; its own error and ceiling returned); then `scale`, the accumulated operands (operand index,
    factor), the bias (operand index, its placement on the result's shape), `activate` (None: none) and the opcode
    whose rounding rule it has (None: exact; `rounds_at_input`: in ulps of its input), `aux`: whether the result's
    second leaf is the pre-activation value."""

    product: Callable
    contracted: Callable
    scale: float = 1.0
    addends: tuple = ()
    bias: tuple | None = None
    activate: Callable | None = None
    activation_rounds: str | None = None
    rounds_at_input: bool = False
    aux: bool = False
    # an fp8 matmul's (cuBLASLt): scalar operands multiplying the product after `scale` (a_scale, b_scale), one
    # multiplying the result after the activation (d_scale), whether its second leaf is max |result| before d_scale
    # (amax)
    factors: tuple = ()
    out_factor: int | None = None
    amax: bool = False


def library_epilogue(inst, context) -> Epilogue | None:
    """The Epilogue of a shadow's custom-call `inst` the rules can bound (a gemm that is not a plain dot -- that one
    is bounded as the dot, bound_convolution.gemm_as_dot --, a cuDNN convolution), else None (a complex alpha)."""
    target = target_of(inst)
    if target in GEMM_TARGETS:
        return _gemm_epilogue(inst, Gemm(inst, context))
    if target == F8_MATMUL:
        return _f8_matmul_epilogue(inst, Gemm(inst, context))
    if target in CONV_KINDS:
        return _conv_epilogue(inst, target)
    return None


def _gemm_epilogue(inst, g: Gemm) -> Epilogue | None:
    if g.alpha.imag != 0:
        return None
    dot = gemm_dot(inst, result_leaves(inst)[0])

    def contracted(bounds, orig, p, a, b, etype):
        # the dot at the original's operand types, its result in the compute type: its accumulation's rule
        dot_orig = Instruction(orig.name, "dot", replace(result_leaves(orig)[0], element_type=etype), orig.operands[:2])
        return dot_bounds(bounds, dot, dot_orig, p, [a, b])

    return Epilogue(
        product=lambda bounds: bounds._kernel(dot),
        contracted=contracted,
        scale=g.alpha.real,
        addends=((2, g.beta),) if g.beta != 0 else (),
        bias=((3 if g.beta != 0 else 2), np.broadcast_to) if g.has_bias else None,  # along the last dims
        activate=g.activation(),
        activation_rounds=None if "RELU" in g.epilogue else "tanh",
        rounds_at_input="GELU" in g.epilogue,
        aux=g.epilogue.endswith("AUX"),
    )


def _f8_matmul_epilogue(inst, g: Gemm) -> Epilogue | None:
    """cuBLASLt's fp8 matmul (ops/custom_call/cublas.cublas_lt_matmul_f8): a gemm's steps, the product (of the fp8
    values, exact; its fast accumulation: bound_dots.fast_accumulation_allowance) also scaled by a_scale * b_scale,
    d_scale after the activation, amax. An fp8 result's saturation keeps its bound (a clamp moves no value farther
    from the exact value's clamp, which the shadow's is)."""
    epilogue = _gemm_epilogue(inst, g)
    if epilogue is None:
        return None
    where = F8Operands(inst, g)
    epilogue.factors, epilogue.out_factor = where.scales, where.d_scale
    epilogue.bias = None if where.bias is None else (where.bias, np.broadcast_to)
    epilogue.amax = g.damax
    return epilogue


def _conv_epilogue(inst, target) -> Epilogue:
    c = ConvCall(inst, CONV_KINDS[target])
    product = conv_product(inst, c)

    def contracted(bounds, orig, p, a, b, etype):
        return convolution_bounds(bounds, inst, orig, p, [a, b], kernel=product, etype=etype)

    epilogue = Epilogue(product=lambda bounds: product, contracted=contracted, scale=c.scale)
    if target == "__cudnn$convBiasActivationForward":
        mode, act, side_scale, bias_shape = bias_activation(inst, c)
        epilogue.addends = ((3, side_scale),) if len(inst.operands) > 3 and side_scale != 0 else ()
        epilogue.bias = (2, lambda v, shape: np.broadcast_to(np.reshape(v, bias_shape), shape))
        epilogue.activate = None if mode == "kNone" else act
        epilogue.activation_rounds = _ACTIVATION_ROUNDING[mode]
        epilogue.rounds_at_input = mode == "kGeluExact"
    return epilogue


def epilogue_bounds(bounds, inst, orig, value, operands, epilogue: Epilogue) -> tuple:
    """The bounds of a library call's results (stored; module docstring) and (its own error per leaf, SIGMAS
    sigmas; a function giving its ceiling) for the samples."""
    leaves = result_leaves(orig)
    etype = ELEMENT_TYPES["f64" if leaves[0].element_type.name == "f64" else "f32"]  # the compute type
    wide = np.dtype(np.float64)
    a, b = operands[0], operands[1]
    p = np.asarray(epilogue.product(bounds)(a, b), wide)
    own, product_ceiling = epilogue.contracted(bounds, orig, p, a, b, etype)
    steps = _Steps(bounds, orig, etype, p, bounds.of(p), own)
    del p
    steps.scale(epilogue.scale)
    if epilogue.factors:
        steps.scale_by([(operands[k], bounds.of(operands[k])) for k in epilogue.factors])
    for index, factor in epilogue.addends:
        steps.add(factor * np.asarray(operands[index], wide), abs(factor) * bounds.of(operands[index]), factor)
    if epilogue.bias is not None:
        index, place = epilogue.bias
        shape = steps.y.shape
        steps.add(place(np.asarray(operands[index], wide), shape), place(bounds.of(operands[index]), shape))
    pre = (steps.y, steps.bound) if epilogue.aux else None
    if epilogue.activate is not None:
        steps.activate(epilogue.activate, epilogue.activation_rounds, epilogue.rounds_at_input)
    values = value if isinstance(value, tuple) else (value,)
    local: list = [None] * len(values)
    if epilogue.amax:
        local[1] = _amax_bounds(bounds, values[1], steps)
    if epilogue.out_factor is not None:
        steps.scale_by([(operands[epilogue.out_factor], bounds.of(operands[epilogue.out_factor]))])
    bound, final = bounds._round(orig, values[0], np.square(steps.bound), "dot", etype=leaves[0].element_type)
    bounds._put(values[0], bound)
    local[0] = np.sqrt(np.square(steps.own) + np.square(final))
    if pre is not None:
        bound, rounding = bounds._round(orig, values[1], np.square(pre[1]), "dot", etype=leaves[1].element_type)
        bounds._put(values[1], bound)
        local[1] = rounding

    def ceiling():  # the product's ceiling carried through the steps, its own bound added
        carried = steps.spread(steps.gain * product_ceiling() + steps.before_activation)
        return steps.out_gain * carried + bounds.of(values[0])

    return (local if isinstance(value, tuple) else local[0]), ceiling


class _Steps:
    """The epilogue's value `y` (exact), its bound and its own error (SIGMAS sigmas: the draws of the samples)
    through its steps, each rounding in the compute type `etype`."""

    def __init__(self, bounds, orig, etype, y, bound, own):
        self.bounds, self.orig, self.etype = bounds, orig, etype
        self.y, self.bound, self.own = y, np.asarray(bound, np.float64), np.asarray(own, np.float64)
        self.spread = lambda e: e  # the activation's spread (identity before one)
        self.before_activation = self.bound
        self.activated = False
        self.gain, self.out_gain = 1.0, 1.0  # the most the scales multiply an error by, before / after activating

    def _rounded(self, opcode, at=None):
        bound, rounding = self.bounds._round(self.orig, self.y, np.square(self.bound), opcode, self.etype, at)
        self.bound, self.own = np.asarray(bound, np.float64), np.sqrt(np.square(self.own) + np.square(rounding))

    def scale(self, factor: float) -> None:
        """y * factor: the bound scaled, plus the factor's own rounding to the compute type on every element,
        plus the product's rounding unless the factor is a power of two."""
        if factor == 1:
            return
        self._multiplied(factor, _scalar_error(factor, self.etype), math.frexp(abs(factor))[0] != 0.5)

    def scale_by(self, factors: list) -> None:
        """y times the product of scalar operands (value, bound) the library multiplies together in the compute
        type first (cuBLASLt's a_scale * b_scale): each one's bound and each product's rounding, at the corners of
        their intervals, then the product's rounding."""
        exact = math.prod(float(v) for v, _ in factors)
        reach = math.prod(abs(float(v)) + float(e) for v, e in factors)
        u = 2.0 ** -(np.finfo(self.etype.numpy).nmant + 1)
        self._multiplied(exact, reach - abs(exact) + (len(factors) - 1) * u * reach, True)

    def _multiplied(self, factor: float, error: float, rounds: bool) -> None:
        """y * factor (exact), the factor `error` away from the device's: the bound scaled, plus the error times
        |y| and the bound, then the product's rounding where `rounds`."""
        self.bound = abs(factor) * self.bound + error * (np.abs(self.y) + self.bound)
        self.own = abs(factor) * self.own
        if self.activated:
            self.out_gain *= abs(factor) + error
        else:
            self.gain *= abs(factor) + error
        self.y = self.y * factor
        if rounds:
            self._rounded("multiply")

    def add(self, term, term_bound, factor: float = 1.0) -> None:
        """y + term (bounded by `term_bound`; `factor`, the scalar it was multiplied by, rounded to the compute
        type: its error on every element), one rounding."""
        self.bound = np.sqrt(np.square(self.bound) + np.square(term_bound))
        if factor != 1:
            self.bound = self.bound + _scalar_error(factor, self.etype) / abs(factor) * np.abs(term)
        self.y = self.y + term
        self._rounded("add")
        self.before_activation = self.bound

    def activate(self, f, rounds: str | None, at_input: bool) -> None:
        """f(y): the bound and own error through f at their intervals' ends, then f's own rounding (`at_input`: its
        ulps taken at |y|, not at f(y): GELU's x (1 + tanh(...)) / 2 cancels where x is negative, its f32 tanh's
        error staying that of a value near 1, times x / 2)."""
        y, fy = self.y, f(self.y)
        at = np.abs(y) + self.bound if at_input else None

        def spread(e):
            return np.maximum(np.abs(f(y + e) - fy), np.abs(f(y - e) - fy))

        self.before_activation = self.bound
        self.bound, self.own, self.y, self.spread = spread(self.bound), spread(self.own), fy, spread
        self.activated = True
        if rounds is not None:
            self._rounded(rounds, at)


def _amax_bounds(bounds, amax, steps) -> np.ndarray:
    """max |y| (an fp8 matmul's amax, before d_scale; `steps`' y and its bound) bounded at its interval's ends: the
    device's lies between the max of |y| - e and of |y| + e. Stored; returns its own error (its element's)."""
    y, e = np.abs(steps.y), steps.bound
    exact = float(np.max(y, initial=0.0))
    highest, lowest = np.max(y + e, initial=0.0), np.max(np.maximum(y - e, 0.0), initial=0.0)
    bounds._put(amax, np.asarray(max(highest - exact, exact - lowest), np.float64))
    return np.asarray(np.broadcast_to(steps.own, y.shape).flat[np.argmax(y)] if y.size else 0.0, np.float64)


def _scalar_error(factor: float, etype) -> float:
    """How far a scalar is from its value in the compute type `etype` (what the library multiplies by)."""
    return abs(float(np.asarray(factor, etype.numpy)) - factor)
