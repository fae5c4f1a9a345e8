"""cuDNN custom-calls of XLA-GPU, each checked against the same computation in plain ops on XLA:CPU: the
convolutions against jax.lax.conv_general_dilated and its vjp, the fused epilogues against jnp, batch norm
against XLA's batch-norm ops. The call forms are those of the dumps in ../shared/corpus/external (TF-era,
escaped-JSON configs with protobuf's JSON names) and of XLA's own tests (GpuBackendConfig, graph strings)."""
import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import hloexec
from hloexec.errors import UnsupportedError
from op_helpers import shape_text

pytestmark = pytest.mark.xla
jax.config.update("jax_enable_x64", True)

# (input NCHW-ish logical shape, dim_labels, filter spatial, stride, padding, rhs dilation, groups, reversal)
CONVS = [
    ("bf01_01io->bf01", (2, 4, 9, 8), 6, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, False),   # maskrcnn form
    ("bf01_oi01->bf01", (2, 6, 9, 8), 4, (3, 3), (2, 1), ((1, 0), (2, 1)), (1, 2), 2, False),
    ("b01f_01io->b01f", (1, 7, 6, 3), 5, (2, 2), (2, 2), ((0, 0), (0, 0)), (1, 1), 1, False),   # leftover rows
    ("b01f_01io->b01f", (2, 4, 5, 5), 8, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 4, False),   # depthwise x2
    ("bf0_oi0->bf0", (3, 4, 11), 2, (5,), (3,), ((-1, 2),), (2,), 1, True),                     # 1-D, crop, flip
]


def _layouts(labels):
    lhs, rest = labels.split("_")
    rhs, out = rest.split("->")
    return lhs, rhs, out


def _to_labels(x, canon, labels):
    """A canonical (N, C, spatial...) / (O, I, spatial...) array in the layout `labels` names."""
    letters = canon
    return np.transpose(x, [letters.index(ch) for ch in labels])


def _case(i, dtype=np.float32):
    labels, in_shape, out_f, ksize, stride, pad, dil, groups, rev = CONVS[i]
    rs = np.random.RandomState(i)
    ns = len(ksize)
    spatial = "".join(str(d) for d in range(ns))
    x = rs.randn(*in_shape).astype(dtype)
    w = rs.randn(out_f, in_shape[1] // groups, *ksize).astype(dtype)
    lhs_l, rhs_l, out_l = _layouts(labels)
    dn = lax.conv_dimension_numbers(in_shape, w.shape, ("NC" + "HWD"[:ns], "OI" + "HWD"[:ns], "NC" + "HWD"[:ns]))

    def conv(x, w):
        wk = jnp.flip(w, axis=tuple(range(2, 2 + ns))) if rev else w
        return lax.conv_general_dilated(x, wk, stride, pad, rhs_dilation=dil, dimension_numbers=dn,
                                        feature_group_count=groups, preferred_element_type=jnp.float32)
    y = np.asarray(jax.jit(conv)(x, w))
    dy = rs.randn(*y.shape).astype(dtype)
    dx, dw = jax.jit(lambda x, w, dy: jax.vjp(conv, x, w)[1](dy))(x.astype(np.float32), w.astype(np.float32),
                                                                     dy.astype(np.float32))
    window = " ".join([f"size={'x'.join(map(str, ksize))}", f"stride={'x'.join(map(str, stride))}",
                       f"pad={'x'.join(f'{lo}_{hi}' for lo, hi in pad)}", f"rhs_dilate={'x'.join(map(str, dil))}"]
                      + ([f"rhs_reversal={'x'.join(['1'] * ns)}"] if rev else []))
    lay = {"x": lambda a: _to_labels(a, "bf" + spatial, lhs_l), "w": lambda a: _to_labels(a, "oi" + spatial, rhs_l),
           "y": lambda a: _to_labels(a, "bf" + spatial, out_l)}
    attrs = f"window={{{window}}}, dim_labels={labels}, feature_group_count={groups}"
    return dict(x=x, w=w, y=y, dy=dy, dx=np.asarray(dx), dw=np.asarray(dw), lay=lay, attrs=attrs)


def _call_module(result, operands, target, attrs, config):
    """A module whose root is (the custom-call's value, its scratch) for the given parameter shapes."""
    params = "\n".join(f"  p{i} = {s} parameter({i})" for i, s in enumerate(operands))
    args = ", ".join(f"p{i}" for i in range(len(operands)))
    cfg = json.dumps(json.dumps(config)) if isinstance(config, dict) else config
    return (f"HloModule m\n\nENTRY e {{\n{params}\n  ROOT c = ({result}, u8[0]) custom-call({args}), "
            f"{attrs}, custom_call_target=\"{target}\", backend_config={cfg}\n}}\n")


def _run(text, *args):
    return hloexec.load(text).run(*args)


def _close(got, want, rtol=2e-5):
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = np.abs(want).max() + 1
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("i", range(len(CONVS)))
def test_conv_forward_backward_input_backward_filter_match_the_convolution_and_its_vjp(i):
    c = _case(i)
    x, w, dy = c["lay"]["x"](c["x"]), c["lay"]["w"](c["w"]), c["lay"]["y"](c["dy"])
    sx, sw, sy = (shape_text(np.float32, a.shape) for a in (x, w, dy))
    # TF-era config at the top level with protobuf's JSON names; the scale multiplies the result
    fwd = _run(_call_module(sy, [sx, sw], "__cudnn$convForward", c["attrs"], '"{\\"algorithm\\":\\"1\\",'
               '\\"convResultScale\\":0.5}"'), x, w)
    _close(fwd[0], c["lay"]["y"](c["y"]) * np.float32(0.5))
    assert fwd[1].dtype == np.uint8 and fwd[1].size == 0
    cfg = {"operation_queue_id": "0", "cudnn_conv_backend_config": {"conv_result_scale": 1, "activation_mode": "kNone"}}
    dx = _run(_call_module(sx, [sy, sw], "__cudnn$convBackwardInput", c["attrs"], cfg), dy, w)[0]
    _close(dx, c["lay"]["x"](c["dx"]))
    dw = _run(_call_module(sw, [sx, sy], "__cudnn$convBackwardFilter", c["attrs"], cfg), x, dy)[0]
    _close(dw, c["lay"]["w"](c["dw"]))


def test_conv_f16_computes_in_f32_and_rounds_once():
    c = _case(0, np.float16)
    x, w = c["lay"]["x"](c["x"]), c["lay"]["w"](c["w"])
    sx, sw = shape_text(np.float16, x.shape), shape_text(np.float16, w.shape)
    y = c["lay"]["y"](c["y"])
    got = _run(_call_module(shape_text(np.float16, y.shape), [sx, sw], "__cudnn$convForward", c["attrs"], {}), x, w)[0]
    want = y.astype(np.float16)  # f32 XLA conv of the f16 values, rounded once
    # hloexec's f32 sums add in another order than XLA:CPU's (its order differs by CPU): where the f32 value lies
    # within that reordering's error of an f16 midpoint, the neighbour across it is the same single rounding
    off = got != want
    neighbours = (got[off] == np.nextafter(want[off], np.float16(np.inf))) | (
        got[off] == np.nextafter(want[off], np.float16(-np.inf)))
    midpoint = (got[off].astype(np.float64) + want[off]) / 2
    assert neighbours.all() and (np.abs(y[off] - midpoint) <= 1e-5 * np.abs(y).max()).all(), (got[off], y[off])


ACTIVATIONS = {"kNone": lambda v: v, "kRelu": jax.nn.relu, "kRelu6": jax.nn.relu6, "kSigmoid": jax.nn.sigmoid,
               "kTanh": jnp.tanh, "kElu": jax.nn.elu, "kLeakyRelu": lambda v: jnp.where(v > 0, v, 0.1 * v),
               "kGeluExact": lambda v: jax.nn.gelu(v, approximate=False)}


@pytest.mark.parametrize("mode", list(ACTIVATIONS))
def test_conv_bias_activation_is_activation_of_scaled_conv_plus_side_input_plus_bias(mode):
    c = _case(0)
    x, w = c["lay"]["x"](c["x"]), c["lay"]["w"](c["w"])
    y = c["lay"]["y"](c["y"])
    rs = np.random.RandomState(7)
    bias = rs.randn(y.shape[1]).astype(np.float32)
    side = rs.randn(*y.shape).astype(np.float32)
    sy = shape_text(np.float32, y.shape)
    cfg = {"cudnn_conv_backend_config": {"activation_mode": mode, "conv_result_scale": 0.5,
                                         "side_input_scale": 0.25, "leakyrelu_alpha": 0.1}}
    text = _call_module(sy, [shape_text(np.float32, x.shape), shape_text(np.float32, w.shape), "f32[6]", sy],
                        "__cudnn$convBiasActivationForward", c["attrs"], cfg)
    got = _run(text, x, w, bias, side)[0]
    want = np.asarray(jax.jit(ACTIVATIONS[mode])(0.5 * y + 0.25 * side + bias[None, :, None, None]))
    _close(got, want.astype(np.float32), rtol=1e-5)


def test_conv_bias_activation_tf_form_with_numeric_activation_mode():
    """`activationMode":"2"` (kRelu as a number, as TF-era dumps print it) and no side input."""
    c = _case(0)
    x, w = c["lay"]["x"](c["x"]), c["lay"]["w"](c["w"])
    y = c["lay"]["y"](c["y"])
    bias = np.linspace(-1, 1, y.shape[1]).astype(np.float32)
    text = _call_module(shape_text(np.float32, y.shape), [shape_text(np.float32, x.shape),
                        shape_text(np.float32, w.shape), "f32[6]"], "__cudnn$convBiasActivationForward",
                        c["attrs"], '"{\\"algorithm\\":\\"6\\",\\"activationMode\\":\\"2\\",\\"convResultScale\\":1}"')
    _close(_run(text, x, w, bias)[0], np.maximum(y + bias[None, :, None, None], 0))
    with pytest.raises(UnsupportedError, match="kReluX"):
        hloexec.load(text.replace('\\"2\\"', '\\"4\\"'))


def test_conv_forward_graph_fp8_scales_amax_and_saturation():
    """XLA's FP8 graph form (cudnn_fused_conv_rewriter_test): conv of the fp8 values, then x_scale, w_scale,
    z_scale as scale ops, an f8e4m3fn output (saturating) and the amax of the pre-output value."""
    F8 = ml_dtypes.float8_e4m3fn
    rs = np.random.RandomState(3)
    x = (rs.randn(1, 6, 6, 8) * 4).astype(F8)
    w = rs.randn(3, 3, 8, 16).astype(F8)
    scales = [np.float32(2.0), np.float32(0.5), np.float32(8.0)]
    graph = "28:[f32]conv();30:[f32]scale(28);32:[f32]scale(30);16:[f8e4m3fn]scale(32);25:[f32]amax(32);"
    text = ("HloModule m\n\nENTRY e {\n  x = f8e4m3fn[1,6,6,8] parameter(0)\n  w = f8e4m3fn[3,3,8,16] parameter(1)\n"
            "  a = f32[] parameter(2)\n  b = f32[] parameter(3)\n  z = f32[] parameter(4)\n"
            "  ROOT c = (f8e4m3fn[1,4,4,16], f32[], u8[0]) custom-call(x, w, a, b, z), window={size=3x3}, "
            "dim_labels=b01f_01io->b01f, custom_call_target=\"__cudnn$convForwardGraph\", "
            "backend_config={\"cudnn_conv_backend_config\":{\"conv_result_scale\":1,\"serialized_graph\":\""
            + graph + "\"}}\n}\n")
    out, amax, _ = _run(text, x, w, *scales)
    conv = np.asarray(lax.conv_general_dilated(x.astype(np.float32), w.astype(np.float32), (1, 1), "VALID",
                                               dimension_numbers=("NHWC", "HWIO", "NHWC")))
    pre = conv * 2.0 * 0.5
    assert amax.dtype == np.float32 and amax == np.float32(np.abs(pre).max())
    want = np.clip(pre * 8.0, -448, 448).astype(F8)
    assert np.abs(pre * 8).max() > 448                  # the saturation is exercised
    np.testing.assert_array_equal(out.astype(np.float32), want.astype(np.float32))
    with pytest.raises(UnsupportedError, match="serialized_graph"):
        hloexec.load(text.replace("amax(32);", "amax(32)"))


# -- batch norm ---------------------------------------------------------------------------------
BN_PLAIN = """HloModule bn
ENTRY e {
  x = f32[2,3,4,5] parameter(0)
  scale = f32[3] parameter(1)
  offset = f32[3] parameter(2)
  dy = f32[2,3,4,5] parameter(3)
  t = (f32[2,3,4,5], f32[3], f32[3]) batch-norm-training(x, scale, offset), epsilon=0.001, feature_index=1
  y = f32[2,3,4,5] get-tuple-element(t), index=0
  mean = f32[3] get-tuple-element(t), index=1
  var = f32[3] get-tuple-element(t), index=2
  g = (f32[2,3,4,5], f32[3], f32[3]) batch-norm-grad(x, scale, mean, var, dy), epsilon=0.001, feature_index=1
  gx = f32[2,3,4,5] get-tuple-element(g), index=0
  gs = f32[3] get-tuple-element(g), index=1
  go = f32[3] get-tuple-element(g), index=2
  bni = f32[2,3,4,5] batch-norm-inference(x, scale, offset, mean, var), epsilon=0.001, feature_index=1
  ROOT r = (f32[2,3,4,5], f32[3], f32[3], f32[2,3,4,5], f32[3], f32[3], f32[2,3,4,5]) tuple(y, mean, var, gx, gs, go, bni)
}
"""

BN_CUDNN = """HloModule bn
ENTRY e {
  x = f32[2,3,4,5] parameter(0)
  scale = f32[3] parameter(1)
  offset = f32[3] parameter(2)
  dy = f32[2,3,4,5] parameter(3)
  eps = f32[] constant(0.001)
  fi = s64[] constant(1)
  t = (f32[2,3,4,5], f32[3], f32[3]) custom-call(x, scale, offset, eps, fi), custom_call_target="__cudnn$batchNormalizationForwardTraining"
  y = f32[2,3,4,5] get-tuple-element(t), index=0
  mean = f32[3] get-tuple-element(t), index=1
  inv = f32[3] get-tuple-element(t), index=2
  g = (f32[2,3,4,5], f32[3], f32[3]) custom-call(x, scale, mean, inv, dy, eps, fi), custom_call_target="__cudnn$batchNormalizationBackward"
  gx = f32[2,3,4,5] get-tuple-element(g), index=0
  gs = f32[3] get-tuple-element(g), index=1
  go = f32[3] get-tuple-element(g), index=2
  m2 = f32[] constant(-2)
  mb = f32[3] broadcast(m2), dimensions={}
  ve = f32[3] power(inv, mb)
  eb = f32[3] broadcast(eps), dimensions={}
  var = f32[3] subtract(ve, eb)
  bni = f32[2,3,4,5] custom-call(x, scale, offset, mean, var, eps, fi), custom_call_target="__cudnn$batchNormalizationForwardInference"
  ROOT r = (f32[2,3,4,5], f32[3], f32[3], f32[2,3,4,5], f32[3], f32[3], f32[2,3,4,5]) tuple(y, mean, var, gx, gs, go, bni)
}
"""


def test_cudnn_batch_norm_matches_the_batch_norm_ops_on_xla():
    """CudnnBatchNormRewriter's rewrite (inverse stddev out of training, into backward; variance recovered
    as inv^-2 - eps, as the rewriter emits it) against XLA's own batch-norm ops (which hloexec's batch-norm ops,
    sharing the kernels, must match too)."""
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    rs = np.random.RandomState(0)
    args = [(rs.randn(2, 3, 4, 5) * 2 + 1).astype(np.float32), rs.randn(3).astype(np.float32),
            rs.randn(3).astype(np.float32), rs.randn(2, 3, 4, 5).astype(np.float32)]
    want = run_on_xla_cpu(BN_PLAIN, args)
    for got in (_run(BN_CUDNN, *args), _run(BN_PLAIN, *args)):     # the calls, and hloexec's own batch-norm ops
        for g, w in zip(got, want):
            _close(g, np.asarray(w), rtol=1e-4)


# -- layer norm ---------------------------------------------------------------------------------------
def _norm_module(kind, operands, results):
    params = "\n".join(f"  p{i} = {s} parameter({i})" for i, s in enumerate(operands))
    args = ", ".join(f"p{i}" for i in range(len(operands)))
    cfg = json.dumps(json.dumps({"cudnn_norm_backend_config": {"epsilon": 0.001, "kind": kind}}))
    return (f"HloModule n\nENTRY e {{\n{params}\n  ROOT c = ({', '.join(results)}, u8[64]) custom-call({args}), "
            f"custom_call_target=\"__cudnn$norm\", backend_config={cfg}\n}}\n")


def test_cudnn_layer_norm_forward_training_and_backward_match_jax():
    """The rewriter's form (x [N, d1, d2, 1], scale/bias [d1, d2, 1, 1]) against jax's layer norm on XLA:CPU."""
    rs = np.random.RandomState(0)
    x = (rs.randn(16, 4, 6, 1) * 2 + 1).astype(np.float32)
    scale, bias = rs.randn(4, 6, 1, 1).astype(np.float32), rs.randn(4, 6, 1, 1).astype(np.float32)
    dy = rs.randn(16, 4, 6, 1).astype(np.float32)

    def layer_norm(x, scale, bias):
        rows = x.reshape(16, -1)
        mean = rows.mean(axis=1, keepdims=True)
        var = jnp.square(rows - mean).mean(axis=1, keepdims=True)
        y = (rows - mean) * jax.lax.rsqrt(var + 0.001) * scale.reshape(1, -1) + bias.reshape(1, -1)
        return y.reshape(x.shape), mean, jax.lax.rsqrt(var + 0.001)
    y, mean, nf = (np.asarray(v) for v in jax.jit(layer_norm)(x, scale, bias))
    shapes = ["f32[16,4,6,1]", "f32[4,6,1,1]", "f32[4,6,1,1]"]
    got = _run(_norm_module("LAYER_FWD_INFER", shapes, ["f32[16,4,6,1]"]), x, scale, bias)
    _close(got[0], y)
    got = _run(_norm_module("LAYER_FWD_TRAIN", shapes, ["f32[16,4,6,1]", "f32[16,1,1,1]", "f32[16,1,1,1]"]),
               x, scale, bias)
    _close(got[1], mean.reshape(16, 1, 1, 1))
    _close(got[2], nf.reshape(16, 1, 1, 1))
    grads = jax.jit(lambda *a: jax.vjp(lambda *b: layer_norm(*b)[0], *a)[1](dy))(x, scale, bias)
    got = _run(_norm_module("LAYER_BWD", ["f32[16,4,6,1]", "f32[4,6,1,1]", "f32[16,4,6,1]", "f32[16,1,1,1]",
                                          "f32[16,1,1,1]"], ["f32[16,4,6,1]", "f32[4,6,1,1]", "f32[4,6,1,1]"]),
               x, scale, dy, mean.reshape(16, 1, 1, 1), nf.reshape(16, 1, 1, 1))
    for g, w in zip(got[:3], grads):
        _close(g, np.asarray(w), rtol=1e-4)


# -- fused attention --------------------------------------------------------------------------------
@pytest.fixture
def cudnn_lowering(monkeypatch):
    """jax lowers dot_product_attention(implementation='cudnn') for CUDA without a GPU once told a cuDNN exists."""
    import jax._src.cudnn.fused_attention_stablehlo as fa
    monkeypatch.setattr(fa, "check_cudnn_version", lambda: 90500)
    monkeypatch.setattr(fa, "check_compute_capability", lambda capability: True)

    def lower(fn, *args):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text(dialect="hlo")
    return lower


def _attention_inputs():
    rs = np.random.RandomState(0)
    mk = lambda *s: jnp.asarray(rs.randn(*s), jnp.bfloat16)          # noqa: E731
    q, k, v = mk(2, 8, 4, 16), mk(2, 6, 2, 16), mk(2, 6, 2, 16)          # BTNH, 2 key/value heads for 4 query heads
    return q, k, v, mk(1, 4, 8, 6), jnp.array([8, 5], jnp.int32), jnp.array([6, 3], jnp.int32)


ATTENTION = {   # extra inputs (indices into _attention_inputs()[3:]), keyword arguments
    "causal": ((), lambda: dict(is_causal=True)),
    "bias": ((0,), lambda b: dict(bias=b)),
    "padding": ((1, 2), lambda ql, kl: dict(query_seq_lengths=ql, key_value_seq_lengths=kl)),
}


@pytest.mark.parametrize("case", list(ATTENTION))
def test_cudnn_fused_attention_forward_and_backward_match_the_xla_implementation(case, cudnn_lowering):
    """jax's cuDNN attention lowered for CUDA (the fmha custom-calls, grouped-query heads, BTNH) against
    jax's XLA implementation on XLA:CPU: outputs and the gradients of a loss (forward in training mode with
    its statistics, then the backward call). bf16 inputs: agreement to bf16 rounding."""
    q, k, v, *extra_all = _attention_inputs()
    picks, kwargs = ATTENTION[case]
    extra = [extra_all[i] for i in picks]

    def attention(impl):
        return lambda q, k, v, *e: jax.nn.dot_product_attention(q, k, v, implementation=impl, **kwargs(*e))
    args = (q, k, v, *extra)
    text = cudnn_lowering(attention("cudnn"), *args)
    assert "__cudnn$fmha" in text
    got = hloexec.load(text).run(*(np.asarray(a) for a in args))
    want = np.asarray(jax.jit(attention("xla"))(*args), np.float32)
    np.testing.assert_allclose(got.astype(np.float32), want, atol=0.02 * np.abs(want).max())
    argnums = tuple(range(4 if case == "bias" else 3))

    def loss(impl):
        return lambda *a: jnp.sum(attention(impl)(*a).astype(jnp.float32) ** 2)
    text = cudnn_lowering(jax.grad(loss("cudnn"), argnums=argnums), *args)
    assert "Backward" in text
    grads = hloexec.load(text).run(*(np.asarray(a) for a in args))
    for g, w in zip(grads, jax.jit(jax.grad(loss("xla"), argnums=argnums))(*args)):
        w = np.asarray(w, np.float32)
        np.testing.assert_allclose(g.astype(np.float32), w, atol=0.02 * np.abs(w).max())


def test_cudnn_attention_with_dropout_is_refused(cudnn_lowering):
    q, k, v, *_ = _attention_inputs()
    from jax._src.cudnn.fused_attention_stablehlo import dot_product_attention
    text = cudnn_lowering(lambda q, k, v: dot_product_attention(q, k, v, dropout_rate=0.1), q, k, v)
    with pytest.raises(UnsupportedError, match="Philox"):
        hloexec.load(text)
