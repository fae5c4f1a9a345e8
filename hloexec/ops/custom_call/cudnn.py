"""cuDNN calls of XLA-GPU: convolutions, batch norm, layer norm, fused attention.

Convolutions (GpuConvRewriter, gpu_conv_runner.cc): the custom-call carries the forward convolution's
`window`, `dim_labels` and group counts whatever its kind; its operands and result are that convolution's
(input, filter, output) in the order of the kind: forward (input, filter) -> output, backward input
(output, filter) -> input, backward filter (input, output) -> filter. The result is a tuple (value, u8
scratch); the scratch is zeros here. backend_config: CudnnConvBackendConfig (backend_configs.proto), nested in
GpuBackendConfig as cudnn_conv_backend_config or at the top level in older dumps, with protobuf's JSON names
(convResultScale) or the proto's (conv_result_scale).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

import numpy as np

from ...errors import UnsupportedError
from ..common import contig
from ..contraction import conv_window, convolution, finish, to_compute
from ..normalization import batch_norm_grad, batch_norm_inference, batch_norm_training
from .registry import backend_config, custom_call, enum_field, field, result_leaves, target_of

_F32 = np.dtype(np.float32)

# stream_executor.dnn.ActivationMode (xla/tsl/protobuf/dnn.proto)
ACTIVATIONS = (
    "kNone",
    "kSigmoid",
    "kRelu",
    "kRelu6",
    "kReluX",
    "kTanh",
    "kBandPass",
    "kElu",
    "kLeakyRelu",
    "kGeluExact",
)


def _work_dtype(dtype):
    """cuDNN's compute type: f64 for f64 convolutions, else f32 (f16/bf16/fp8 inputs, integer inputs too:
    they accumulate in s32 exactly, which f64 holds exactly here)."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return dtype
    return np.dtype(np.float64) if dtype.kind in "iu" else _F32


def _to_output(r, out_dtype):
    """The f32/f64 result in the output type: floats rounded once, integers rounded to nearest and
    saturated (cuDNN's int8 output)."""
    out_dtype = np.dtype(out_dtype)
    if out_dtype.kind in "iu":
        info = np.iinfo(out_dtype)
        return contig(np.clip(np.rint(r), info.min, info.max).astype(out_dtype))
    return finish(r, out_dtype)


def activation(mode: str, alpha: float, inst):
    """The elementwise function of a cuDNN activation mode (dnn.proto's definitions)."""
    if mode == "kNone":
        return lambda x: x
    if mode == "kRelu":
        return lambda x: np.maximum(x, 0)
    if mode == "kRelu6":
        return lambda x: np.clip(x, 0, 6)
    if mode == "kSigmoid":
        return lambda x: 1 / (1 + np.exp(-x))
    if mode == "kTanh":
        return np.tanh
    if mode == "kElu":
        return lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0)))
    if mode == "kLeakyRelu":
        return lambda x: np.where(x > 0, x, x * np.asarray(alpha, x.dtype))
    if mode == "kGeluExact":
        from scipy.special import erf

        return lambda x: (0.5 * x * (1 + erf(x / np.sqrt(np.asarray(2, x.dtype))))).astype(x.dtype)
    raise UnsupportedError(f"cuDNN activation {mode} (its bound is not in the HLO)", inst)


# the convolution custom-calls: target -> which convolution its two first operands make (ConvCall's kind)
CONV_KINDS = {
    "__cudnn$convForward": "forward",
    "__cudnn$convBiasActivationForward": "forward",
    "__cudnn$convBackwardInput": "backward_input",
    "__cudnn$convBackwardFilter": "backward_filter",
}


class ConvCall:
    """A cuDNN convolution custom-call decoded: which operand is which, its layouts, window and config."""

    def __init__(self, inst, kind: str):
        self.kind = kind  # forward, backward_input, backward_filter
        self.cfg = backend_config(inst, "cudnn_conv_backend_config")
        leaves = result_leaves(inst)
        self.result, self.rest = leaves[0], leaves[1:]
        ops = [o.shape for o in inst.operands]
        if len(ops) < 2:
            raise UnsupportedError(f"{target_of(inst)} with {len(ops)} operands", inst)
        if kind == "backward_input":
            self.input, self.filter, self.output = self.result, ops[1], ops[0]
        elif kind == "backward_filter":
            self.input, self.filter, self.output = ops[0], self.result, ops[1]
        else:
            self.input, self.filter, self.output = ops[0], ops[1], self.result
        self.cd, self.win = conv_window(inst, self.filter)
        for what, shape in (("input", self.input), ("output", self.output)):
            if not shape.is_array or shape.rank != self.filter.rank:
                raise UnsupportedError(
                    f"{target_of(inst)}: the {what} {shape.to_text(False)} is not of the filter's "
                    f"rank {self.filter.rank}",
                    inst,
                )
        self.groups = int(inst.attr("feature_group_count", 1))
        if int(inst.attr("batch_group_count", 1)) != 1 and kind != "forward":
            raise UnsupportedError(f"{target_of(inst)} with batch_group_count", inst)
        if kind.startswith("backward") and any(w.base_dilation != 1 for w in self.win):
            raise UnsupportedError(f"{target_of(inst)} with base dilation (cuDNN has none)", inst)
        self.scale = float(field(self.cfg, "conv_result_scale", 1) or 1)
        self.work = _work_dtype(self.input.dtype)
        cd = self.cd
        self.in_perm = [cd.input_batch, cd.input_feature, *cd.input_spatial]
        self.k_perm = [cd.kernel_output_feature, cd.kernel_input_feature, *cd.kernel_spatial]
        self.out_perm = [cd.output_batch, cd.output_feature, *cd.output_spatial]
        self.reversed = [2 + i for i, w in enumerate(self.win) if w.reversal]

    def scratch(self):
        return tuple(np.zeros(s.dims, s.dtype) for s in self.rest)

    def backward_input(self, dy, w):
        """The gradient of sum(conv(x, w) * dy) with respect to x: (N, O, out...), (O, C/g, k...) ->
        (N, C, in...), each kernel tap's contribution scattered into the padded input."""
        if self.reversed:
            w = np.flip(w, axis=self.reversed)
        n, c = dy.shape[0], w.shape[1] * self.groups
        in_sizes = [self.input.dims[d] for d in self.cd.input_spatial]
        lows = [wd.pad_low for wd in self.win]
        padded = [s + wd.pad_low + wd.pad_high for s, wd in zip(in_sizes, self.win)]
        out_sizes = dy.shape[2:]
        dxp = np.zeros((n, c, *padded), dy.dtype)
        og, cg = dy.shape[1] // self.groups, w.shape[1]
        for g in range(self.groups):
            dyg, wg = dy[:, g * og : (g + 1) * og], w[g * og : (g + 1) * og]
            for tap in itertools.product(*(range(wd.size) for wd in self.win)):
                contrib = np.tensordot(dyg, wg[(slice(None), slice(None), *tap)], axes=([1], [0]))
                window = tuple(
                    slice(t * wd.window_dilation, t * wd.window_dilation + (o - 1) * wd.stride + 1, wd.stride)
                    for t, wd, o in zip(tap, self.win, out_sizes)
                )
                dxp[(slice(None), slice(g * cg, (g + 1) * cg), *window)] += np.moveaxis(contrib, -1, 1)
        dx = np.zeros((n, c, *in_sizes), dy.dtype)  # input positions the padding cropped get 0
        src, dst = [slice(None)] * 2, [slice(None)] * 2
        for size, lo, pad in zip(in_sizes, lows, padded):
            first, last = max(0, -lo), min(size, pad - lo)
            src.append(slice(first + lo, max(last, first) + lo))
            dst.append(slice(first, max(last, first)))
        dx[tuple(dst)] = dxp[tuple(src)]
        return dx

    def backward_filter(self, x, dy):
        """The gradient of sum(conv(x, w) * dy) with respect to w: (N, C, in...), (N, O, out...) ->
        (O, C/g, k...), one contraction over batch and output positions per kernel tap."""
        from ..reduction import pad_dilate

        lows = [0, 0] + [wd.pad_low for wd in self.win]
        highs = [0, 0] + [wd.pad_high for wd in self.win]
        xp, _ = pad_dilate(x, lows, highs, [0] * x.ndim, np.zeros((), x.dtype)[()])
        o, cg = dy.shape[1], x.shape[1] // self.groups
        og = o // self.groups
        out_sizes = dy.shape[2:]
        dw = np.zeros((o, cg, *(wd.size for wd in self.win)), x.dtype)
        axes = [0, *range(2, x.ndim)]
        for g in range(self.groups):
            xg, dyg = xp[:, g * cg : (g + 1) * cg], dy[:, g * og : (g + 1) * og]
            for tap in itertools.product(*(range(wd.size) for wd in self.win)):
                window = tuple(
                    slice(t * wd.window_dilation, t * wd.window_dilation + (n - 1) * wd.stride + 1, wd.stride)
                    for t, wd, n in zip(tap, self.win, out_sizes)
                )
                patch = xg[(slice(None), slice(None), *window)]
                if patch.shape[2:] != out_sizes:  # the padded input ends before the last window
                    patch = np.pad(patch, [(0, 0), (0, 0)] + [(0, n - p) for n, p in zip(out_sizes, patch.shape[2:])])
                dw[(slice(g * og, (g + 1) * og), slice(None), *tap)] = np.tensordot(dyg, patch, axes=(axes, axes))
        if self.reversed:
            dw = np.flip(dw, axis=self.reversed)
        return dw


def _layout(a, perm):
    """The array with its dims in `perm`'s order (canonical (batch, feature, spatial...) form)."""
    return a.transpose(perm)


def _unlayout(a, perm):
    return a.transpose(np.argsort(perm))


@custom_call("__cudnn$convForward")
def cudnn_conv_forward(inst, ctx):
    """output = conv_result_scale * convolution(input, filter) (the window, dim_labels and group counts on the
    call), computed in f32 (f64 for f64; integer inputs exactly) and rounded once; integer outputs round to
    nearest and saturate."""
    c = ConvCall(inst, "forward")
    conv = conv_product(inst, c)
    out_dtype = c.result.dtype

    def kernel(x, w, *_):
        r = conv(x, w)
        if c.scale != 1:
            r = r * np.asarray(c.scale, c.work)
        return (_to_output(r, out_dtype), *c.scratch())

    return kernel


@custom_call("__cudnn$convBiasActivationForward")
def cudnn_conv_bias_activation(inst, ctx):
    """output = activation(conv_result_scale * convolution(input, filter) + side_input_scale * side_input +
    bias): operands (input, filter, bias along the output feature dim, [side_input]); activation_mode kNone,
    kRelu, kRelu6, kSigmoid, kTanh, kElu, kLeakyRelu (leakyrelu_alpha), kGeluExact (kReluX and kBandPass need
    a bound the HLO does not carry: unsupported). Computed in f32 (f64 for f64), rounded once."""
    c = ConvCall(inst, "forward")
    conv = conv_product(inst, c)
    _, act, side_scale, bias_shape = bias_activation(inst, c)
    out_dtype = c.result.dtype

    def kernel(x, w, bias, *side):
        r = conv(x, w)
        if c.scale != 1:
            r = r * np.asarray(c.scale, c.work)
        if side and side_scale != 0:
            r = r + np.asarray(side_scale, c.work) * to_compute(side[0], c.work)
        r = act(r + to_compute(bias, c.work).reshape(bias_shape))
        return (_to_output(r, out_dtype), *c.scratch())

    return kernel


def bias_activation(inst, c: ConvCall) -> tuple:
    """(activation mode, its function, side_input_scale, the bias's shape along the output feature dim) of a
    __cudnn$convBiasActivationForward call `inst` (decoded: `c`)."""
    if len(inst.operands) < 3:
        raise UnsupportedError(f"{target_of(inst)} needs (input, filter, bias[, side_input])", inst)
    mode = enum_field(c.cfg, "activation_mode", ACTIVATIONS, inst)
    act = activation(mode, float(field(c.cfg, "leakyrelu_alpha", 0) or 0), inst)
    bias_shape = [1] * c.result.rank
    bias_shape[c.cd.output_feature] = -1
    return mode, act, float(field(c.cfg, "side_input_scale", 0) or 0), bias_shape


def conv_product(inst, c: ConvCall) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """product(first, second) of the cuDNN convolution call `inst` (decoded: `c`): its convolution of its two
    first operands in its compute type and the result's layout, before conv_result_scale and what follows
    (bilinear: tools/bound_epilogues bounds it as a convolution). Forward: the convolution the call describes;
    backward: both operands into the canonical layouts, the gradient, back."""
    if c.kind == "forward":
        return convolution(inst, c.filter, c.work)
    grad: Callable[[np.ndarray, np.ndarray], np.ndarray]  # the two operands in the canonical layouts
    if c.kind == "backward_input":  # (output gradient, filter) -> input gradient
        perms, out_perm, grad = (c.out_perm, c.k_perm), c.in_perm, c.backward_input
    else:  # (input, output gradient) -> filter gradient
        perms, out_perm, grad = (c.in_perm, c.out_perm), c.k_perm, c.backward_filter

    def product(first, second):
        return _unlayout(grad(*(_layout(to_compute(v, c.work), p) for v, p in zip((first, second), perms))), out_perm)

    return product


def _conv_gradient(inst, kind: str):
    """kernel(first, second) of a backward convolution: its product (conv_product), the scale, the result's
    type."""
    c = ConvCall(inst, kind)
    product = conv_product(inst, c)
    out_dtype = c.result.dtype

    def kernel(first, second, *_):
        r = product(first, second)
        if c.scale != 1:
            r = r * np.asarray(c.scale, c.work)
        return (_to_output(r, out_dtype), *c.scratch())

    return kernel


@custom_call("__cudnn$convBackwardInput")
def cudnn_conv_backward_input(inst, ctx):
    """input gradient = conv_result_scale * the gradient of sum(convolution(input, filter) * output) with
    respect to input (the transposed convolution of the forward one the call describes): operands (output
    gradient, filter); f32 (f64 for f64), rounded once."""
    return _conv_gradient(inst, "backward_input")


@custom_call("__cudnn$convBackwardFilter")
def cudnn_conv_backward_filter(inst, ctx):
    """filter gradient = conv_result_scale * the gradient of sum(convolution(input, filter) * output) with
    respect to filter: operands (input, output gradient); f32 (f64 for f64), rounded once."""
    return _conv_gradient(inst, "backward_filter")


# -- the graph form ------------------------------------------------------------------------------
_GRAPH_OP = re.compile(r"(\d+):\[(\w+)\](\w+)\(([\d,]*)\);")
_GRAPH_BINARY = {"add": np.add, "scale": np.multiply, "invscale": np.divide, "min": np.minimum, "max": np.maximum}
_GRAPH_UNARY = {"relu": lambda x: np.maximum(x, 0), "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0)))}


def parse_conv_graph(text: str, inst):
    """cudnn_fused_conv_rewriter's serialized graph "UID:[type]op(in-graph operand UIDs);..." -> a list of
    (uid, type, op, operand uids); the convolution first."""
    ops = [(int(u), t, name, [int(a) for a in args.split(",") if a]) for u, t, name, args in _GRAPH_OP.findall(text)]
    if (
        "".join(f"{u}:[{t}]{n}({','.join(map(str, a))});" for u, t, n, a in ops) != text
        or not ops
        or ops[0][2] != "conv"
    ):
        raise UnsupportedError(f"{target_of(inst)}: unreadable serialized_graph {text!r}", inst)
    for _, _, name, args in ops:
        if name not in _GRAPH_BINARY and name not in _GRAPH_UNARY and name not in ("conv", "amax"):
            raise UnsupportedError(f"{target_of(inst)}: graph op {name!r}", inst)
    return ops


@custom_call("__cudnn$convForwardGraph")
def cudnn_conv_forward_graph(inst, ctx):
    """A convolution followed by the pointwise graph cudnn_fused_conv_rewriter serialized in
    `serialized_graph`: ops conv, add, scale (x * s), invscale (x / s), min, max, relu, elu and amax
    (max |x|, an extra scalar result); a binary op whose second operand is not in the graph takes the next
    custom-call operand after (input, filter). Values are f32 throughout (f64 for f64); an op typed fp8
    saturates to its type's range, the output op rounds to the output type. Results: (output, the amax
    values in graph order, scratch)."""
    c = ConvCall(inst, "forward")
    ops = parse_conv_graph(str(field(c.cfg, "serialized_graph", "")), inst)
    conv = convolution(inst, c.filter, c.work)
    aux = [op for op in ops if op[2] == "amax"]
    main = [op for op in ops if op[2] != "amax"]
    n_aux = len(c.rest) - 1 if c.rest and c.rest[-1].dtype == np.uint8 else len(c.rest)
    if len(aux) != n_aux:
        raise UnsupportedError(f"{target_of(inst)}: {len(aux)} amax ops in the graph, {n_aux} scalar results", inst)
    import ml_dtypes

    def typed(v, type_name):
        if type_name.startswith("f8"):
            limit = float(ml_dtypes.finfo(getattr(ml_dtypes, _ML_DTYPES[type_name])).max)
            return np.clip(v, -limit, limit)
        return v

    def kernel(x, w, *extra):
        values, pending = {}, list(extra)
        for uid, type_name, name, args in ops:
            if name == "conv":
                v = conv(x, w)
            elif name == "amax":
                v = np.asarray(np.max(np.abs(values[args[0]]), initial=0), c.work)
            elif name in _GRAPH_UNARY:
                v = _GRAPH_UNARY[name](values[args[0]])
            else:
                a = values[args[0]]
                b = values[args[1]] if len(args) == 2 else to_compute(np.asarray(pending.pop(0)), c.work)
                v = _GRAPH_BINARY[name](a, b)
            values[uid] = typed(np.asarray(v, c.work), type_name)
        out = _to_output(values[main[-1][0]], c.result.dtype)
        amaxes = [np.asarray(values[uid], s.dtype) for (uid, *_), s in zip(aux, c.rest)]
        return (out, *amaxes, *(np.zeros(s.dims, s.dtype) for s in c.rest[len(aux) :]))

    return kernel


_ML_DTYPES = {
    "f8e4m3fn": "float8_e4m3fn",
    "f8e5m2": "float8_e5m2",
    "f8e4m3fnuz": "float8_e4m3fnuz",
    "f8e5m2fnuz": "float8_e5m2fnuz",
    "f8e4m3": "float8_e4m3",
    "f8e3m4": "float8_e3m4",
}


# -- batch norm ------------------------------------------------------------------------------------
def _bn_scalars(inst, n_arrays):
    """(epsilon, feature_index) from the two trailing constant operands CudnnBatchNormRewriter appends."""
    if len(inst.operands) != n_arrays + 2:
        raise UnsupportedError(f"{target_of(inst)} expects {n_arrays} arrays, epsilon and feature_index", inst)
    eps_op, feature_op = inst.operands[-2], inst.operands[-1]
    if eps_op.opcode != "constant" or feature_op.opcode != "constant":
        raise UnsupportedError(f"{target_of(inst)} whose epsilon/feature_index are not constants", inst)
    return float(eps_op.literal.reshape(())), int(feature_op.literal.reshape(()))


@custom_call("__cudnn$batchNormalizationForwardTraining")
def cudnn_batch_norm_training(inst, ctx):
    """CudnnBatchNormRewriter's batch-norm-training: operands (x, scale, offset, epsilon, feature_index) ->
    (y, batch mean, 1 / sqrt(batch variance + epsilon)): the batch-norm-training op's values with the
    variance returned as its inverse standard deviation (the rewriter converts it back). x and y may be f16
    while the statistics are f32; computed in f32."""
    eps, feature = _bn_scalars(inst, 3)
    train = batch_norm_training(feature, eps, inst.operands[0].shape.rank, _F32)
    y_t, mean_t, inv_t = (s.dtype for s in inst.shape.tuple_shapes)

    def kernel(x, scale, offset, *_):
        y, mean, var = train(x, scale, offset)
        inv_std = 1 / np.sqrt(var + np.float32(eps))
        return finish(y, y_t), finish(mean, mean_t), finish(inv_std, inv_t)

    return kernel


@custom_call("__cudnn$batchNormalizationForwardInference")
def cudnn_batch_norm_inference(inst, ctx):
    """CudnnBatchNormRewriter's batch-norm-inference: operands (x, scale, offset, mean, variance, epsilon,
    feature_index) -> y, as the batch-norm-inference op; computed in f32."""
    eps, feature = _bn_scalars(inst, 5)
    infer = batch_norm_inference(feature, eps, inst.operands[0].shape.rank, _F32)
    out_dtype = inst.shape.dtype

    def kernel(x, scale, offset, mean, var, *_):
        return finish(infer(x, scale, offset, mean, var), out_dtype)

    return kernel


@custom_call("__cudnn$batchNormalizationBackward")
def cudnn_batch_norm_backward(inst, ctx):
    """CudnnBatchNormRewriter's batch-norm-grad: operands (x, scale, mean, 1 / sqrt(variance + epsilon),
    grad_output, epsilon, feature_index) -> (grad x, grad scale, grad offset), as the batch-norm-grad op with
    the inverse standard deviation given (cuDNN's input); computed in f32."""
    eps, feature = _bn_scalars(inst, 5)
    grad = batch_norm_grad(feature, inst.operands[0].shape.rank, _F32)
    out_types = [s.dtype for s in inst.shape.tuple_shapes]

    def kernel(x, scale, mean, inv_std, dy, *_):
        inv_std = to_compute(inv_std, _F32)
        with np.errstate(divide="ignore"):
            var_eps = 1 / np.square(inv_std)
        return tuple(finish(v, t) for v, t in zip(grad(x, scale, mean, var_eps, inv_std, dy), out_types))

    return kernel


# -- layer norm ------------------------------------------------------------------------------------------
NORM_KINDS = ("LAYER_FWD_INFER", "LAYER_FWD_TRAIN", "LAYER_BWD")


@custom_call("__cudnn$norm")
def cudnn_layer_norm(inst, ctx):
    """cuDNN layer norm (CudnnNormRewriter): x [N, d1, d2, d3] normalized over d1..d3 per row n, scale and bias
    holding d1*d2*d3 values (as [d1, d2, d3, 1] or similar), epsilon and kind in cudnn_norm_backend_config.
    LAYER_FWD_INFER: (x, scale, bias) -> (y, workspace); LAYER_FWD_TRAIN: -> (y, mean [N,1,1,1], norm factor
    1/sqrt(var + eps) [N,1,1,1], workspace); LAYER_BWD: (x, scale, dy, mean, norm factor) -> (dx, dscale, dbias,
    workspace), layer norm's gradients. Variance biased; computed in f32 (f64 for f64), rounded once."""
    cfg = backend_config(inst, "cudnn_norm_backend_config")
    kind = enum_field(cfg, "kind", NORM_KINDS, inst)
    eps = float(field(cfg, "epsilon", 0) or 0)
    leaves = result_leaves(inst)
    expect = {"LAYER_FWD_INFER": (3, 2), "LAYER_FWD_TRAIN": (3, 4), "LAYER_BWD": (5, 4)}[kind]
    if (len(inst.operands), len(leaves)) != expect:
        raise UnsupportedError(f"__cudnn$norm {kind} takes {expect[0]} operands and returns {expect[1]} results", inst)
    x_shape = inst.operands[0].shape
    if not all(o.shape.is_array for o in inst.operands) or x_shape.rank < 1:
        raise UnsupportedError(
            "__cudnn$norm takes arrays, x of rank 1 or more ([N, d1, ...]), got "
            f"{', '.join(o.shape.to_text(False) for o in inst.operands)}",
            inst,
        )
    work = _work_dtype(x_shape.dtype)
    rows = x_shape.dims[0]
    types = [s.dtype for s in leaves]
    shapes = [tuple(s.dims) for s in leaves]

    def stats(x):
        x2 = to_compute(x, work).reshape(rows, -1)
        mean = x2.mean(axis=1, keepdims=True, dtype=work)
        var = np.square(x2 - mean).mean(axis=1, keepdims=True, dtype=work)
        return x2, mean, 1 / np.sqrt(var + np.asarray(eps, work))

    def flat(v):
        return to_compute(v, work).reshape(1, -1)

    if kind == "LAYER_BWD":

        def kernel(x, scale, dy, mean, norm_factor):
            x2 = to_compute(x, work).reshape(rows, -1)
            nf = to_compute(norm_factor, work).reshape(rows, 1)
            xhat = (x2 - to_compute(mean, work).reshape(rows, 1)) * nf
            dy2 = to_compute(dy, work).reshape(rows, -1)
            g = dy2 * flat(scale)
            dx = nf * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
            dscale, dbias = (dy2 * xhat).sum(axis=0), dy2.sum(axis=0)
            outs = [_to_output(v.reshape(s), t) for v, s, t in zip((dx, dscale, dbias), shapes, types)]
            return (*outs, np.zeros(shapes[3], types[3]))

        return kernel

    def kernel(x, scale, bias):
        x2, mean, nf = stats(x)
        y = _to_output(((x2 - mean) * nf * flat(scale) + flat(bias)).reshape(shapes[0]), types[0])
        if kind == "LAYER_FWD_INFER":
            return y, np.zeros(shapes[1], types[1])
        return (
            y,
            _to_output(mean.reshape(shapes[1]), types[1]),
            _to_output(nf.reshape(shapes[2]), types[2]),
            np.zeros(shapes[3], types[3]),
        )

    return kernel


# -- fused attention ------------------------------------------------------------------------------------
MASK_TYPES = ("NO_MASK", "PADDING", "CAUSAL", "PADDING_CAUSAL", "ALIBI")


class _Attention:
    """A cuDNN fMHA call decoded: its operands, layout, scale and masks (jax's cudnn dot_product_attention,
    jax/_src/cudnn/fused_attention_stablehlo.py, is what emits them)."""

    def __init__(self, inst, backward: bool):
        target = target_of(inst)
        cfg = backend_config(inst, "cudnn_fmha_backend_config")
        if target.endswith("F8"):
            raise UnsupportedError(f"{target}: the fp8 fused attention (its scale and amax operands)", inst)
        self.scale = float(field(cfg, "fmha_scale", 1.0) or 1.0)
        self.mask = enum_field(cfg, "mask_type", MASK_TYPES, inst)
        if self.mask == "ALIBI":
            raise UnsupportedError(f"{target} with the ALIBI mask", inst)
        if "Dropout" in target and float(field(cfg, "dropout_rate", 0) or 0) > 0:
            raise UnsupportedError(
                f"{target} with dropout_rate={field(cfg, 'dropout_rate')}: its mask comes from "
                "cuDNN's own Philox stream (seed in backend_config), which hloexec does not "
                "reproduce; a dump lowered with dropout_rate=0 runs",
                inst,
            )
        if int(field(cfg, "max_seg_per_batch", 1) or 1) > 1 or field(cfg, "is_paged_attention", False):
            raise UnsupportedError(f"{target} with packed segments or paged attention", inst)
        self.window = int(field(cfg, "sliding_window_length", 0) or 0)
        key = "bmm1_grad_gemm1_dot_dimension_numbers" if backward else "bmm1_dot_dimension_numbers"
        dims = field(cfg, key, {}) or {}
        batch = [int(d) for d in field(dims, "rhs_batch_dimensions" if backward else "lhs_batch_dimensions", [0, 1])]
        self.btnh = batch == [0, 2]  # BTNH (else BNTH)
        self.has_bias = "Bias" in target
        self.padding = self.mask in ("PADDING", "PADDING_CAUSAL")
        self.causal = self.mask in ("CAUSAL", "PADDING_CAUSAL")

    def bnth(self, x):
        """An operand in (batch, heads, seq, head dim) order, in f32."""
        x = to_compute(x, _F32)
        return np.swapaxes(x, 1, 2) if self.btnh else x

    def masked_scores(self, q, k, bias, seqlens):
        """(scaled scores + bias with masked positions at -inf, the query rows padding removes) in f32;
        q (B, N, T, H), k (B, Nkv, S, H)."""
        k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)  # grouped-query heads
        s = np.matmul(q, np.swapaxes(k, -1, -2)) * np.float32(self.scale)
        if bias is not None:
            s = s + to_compute(bias, _F32)
        t, n = s.shape[-2:]
        keep = np.ones(s.shape, bool)
        ti, si = np.arange(t)[:, None], np.arange(n)[None, :]
        if self.causal:
            keep &= si <= ti
        if self.window > 0:
            keep &= si > ti - self.window
        dead_rows = np.zeros(s.shape[:3], bool)
        if self.padding:
            q_len, kv_len = (np.asarray(v).reshape(-1) for v in seqlens)
            keep &= (si[None] < kv_len[:, None, None])[:, None]
            dead_rows |= (np.arange(t)[None, :] >= q_len[:, None])[:, None, :]
        return np.where(keep, s, -np.inf), dead_rows


def _softmax_rows(s):
    """(probabilities, log-sum-exp) along the last dim, rows that are all -inf giving 0 and -inf."""
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.max(s, axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(m), m, 0))
        total = e.sum(axis=-1, keepdims=True)
        p = np.where(total > 0, e / total, 0)
        lse = (np.where(np.isfinite(m), m, 0) + np.log(total))[..., 0]
    return p, lse


@custom_call(
    "__cudnn$fmhaSoftmax",
    "__cudnn$fmhaScaleBiasSoftmax",
    "__cudnn$fmhaSoftmaxDropout",
    "__cudnn$fmhaScaleBiasSoftmaxDropout",
    operands=range(3, 7),
    returns="tuple",
)
def cudnn_fmha_forward(inst, ctx):
    """cuDNN fused attention, forward: operands (Q, K, V, [bias], [q_seqlen, kv_seqlen with a PADDING mask]) in
    the layout the bmm1 dimension numbers give (BTNH or BNTH); O = softmax(fmha_scale * Q K^T + bias, masked)
    V with K/V heads shared by query-head groups, masks CAUSAL (key > query), PADDING (keys past kv_seqlen;
    query rows past q_seqlen give 0) and the sliding window; results (O as (B, N, T, H), [the softmax
    statistics, log-sum-exp per row, f32 (B, N, T), when training], workspace). f32 throughout, O rounded once
    to the input type (cuDNN's flash kernel rounds the probabilities to it before P V: last-bit differences).
    Dropout (rate > 0) is refused: cuDNN draws its mask from its own Philox stream."""
    a = _Attention(inst, backward=False)
    leaves = result_leaves(inst)
    out_t = leaves[0].dtype
    training = len(leaves) == 3

    def kernel(q, k, v, *rest):
        bias = rest[0] if a.has_bias else None
        seqlens = rest[1:3] if a.has_bias else rest[0:2]
        s, dead = a.masked_scores(a.bnth(q), a.bnth(k), bias, seqlens)
        p, lse = _softmax_rows(s)
        vv = a.bnth(v)
        o = np.matmul(p, np.repeat(vv, p.shape[1] // vv.shape[1], axis=1))
        o[dead] = 0
        out = [_to_output(o, out_t)]
        if training:
            out.append(contig(lse.astype(leaves[1].dtype)))
        return (*out, np.zeros(leaves[-1].dims, leaves[-1].dtype))

    return kernel


@custom_call(
    "__cudnn$fmhaSoftmaxBackward",
    "__cudnn$fmhaScaleBiasSoftmaxBackward",
    "__cudnn$fmhaSoftmaxDropoutBackward",
    "__cudnn$fmhaScaleBiasSoftmaxDropoutBackward",
    operands=range(6, 10),
    returns="tuple",
)
def cudnn_fmha_backward(inst, ctx):
    """cuDNN fused attention, backward: operands (Q, K, V, softmax statistics, dO, [bias], O, [q_seqlen,
    kv_seqlen]); the probabilities recomputed from the statistics, then dV = P^T dO, dP = dO V^T, dS = P (dP -
    rowsum(dO O)), dQ = scale dS K, dK = scale dS^T Q (K/V gradients summed over their query-head group), dbias
    = dS summed to the bias's shape; results (dQ, dK, dV as (B, N, S/T, H), [dbias], workspace), f32 throughout,
    each rounded once. Dropout refused as in the forward call."""
    a = _Attention(inst, backward=True)
    leaves = result_leaves(inst)
    has_dbias = len(leaves) == 5

    def kernel(q, k, v, stats, do, *rest):
        bias = rest[0] if a.has_bias else None
        o = rest[1] if a.has_bias else rest[0]
        seqlens = rest[2:4] if a.has_bias else rest[1:3]
        qq, kk, vv, dO, oo = (a.bnth(x) for x in (q, k, v, do, o))
        group = qq.shape[1] // kk.shape[1]
        s, dead = a.masked_scores(qq, kk, bias, seqlens)
        with np.errstate(invalid="ignore", over="ignore"):
            p = np.where(np.isfinite(s), np.exp(s - to_compute(stats, _F32)[..., None]), 0)
        p[dead] = 0
        dv = np.matmul(np.swapaxes(p, -1, -2), dO)
        dp = np.matmul(dO, np.swapaxes(np.repeat(vv, group, axis=1), -1, -2))
        ds = p * (dp - np.sum(dO * oo, axis=-1, keepdims=True))
        dq = np.matmul(ds, np.repeat(kk, group, axis=1)) * np.float32(a.scale)
        dk = np.matmul(np.swapaxes(ds, -1, -2), qq) * np.float32(a.scale)

        def per_kv_head(x):
            return x.reshape(x.shape[0], -1, group, *x.shape[2:]).sum(axis=2)

        out = [
            _to_output(dq, leaves[0].dtype),
            _to_output(per_kv_head(dk), leaves[1].dtype),
            _to_output(per_kv_head(dv), leaves[2].dtype),
        ]
        if has_dbias:
            shape = leaves[3].dims
            axes = tuple(i for i, (n, m) in enumerate(zip(shape, ds.shape)) if n == 1 and m != 1)
            out.append(_to_output(ds.sum(axis=axes, keepdims=True).reshape(shape), leaves[3].dtype))
        return (*out, np.zeros(leaves[-1].dims, leaves[-1].dtype))

    return kernel
