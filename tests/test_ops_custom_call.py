"""custom-call registry and built-in targets (TopK against jax.lax.top_k; gemm against numpy; oneDNN layer norm
in f16/bf16 against its f32 form)."""
import json

import jax
import ml_dtypes
import numpy as np
import pytest

import hloexec.ops.custom_call as CC
from hloexec.errors import UnsupportedError
from op_helpers import FakeContext, make_inst, shape_text

jax.config.update("jax_enable_x64", True)


def cc(target, shape, operands, **attrs):
    return make_inst("custom-call", shape, operands, custom_call_target=target, **attrs)


def test_unknown_target_and_registration(monkeypatch):
    with pytest.raises(UnsupportedError, match="no_such_target"):
        CC.prepare_custom_call(cc("no_such_target", "f32[2]", ["f32[2]"]), FakeContext())
    monkeypatch.setattr(CC.registry, "CUSTOM_CALLS", dict(CC.CUSTOM_CALLS))     # registered for this test only
    CC.register_custom_call("test_double", lambda inst, ctx: (lambda x: x * 2), replace=True)
    k = CC.prepare_custom_call(cc("test_double", "f32[2]", ["f32[2]"]), FakeContext())
    np.testing.assert_array_equal(k(np.ones(2, np.float32)), [2, 2])
    with pytest.raises(ValueError):
        CC.register_custom_call("test_double", lambda inst, ctx: None)


@pytest.mark.parametrize("target", ["Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "MoveToHost",
                                    "MoveToDevice", "annotate_device_placement", "LayoutConstraint",
                                    "__builtin$CrossMeshAllReduce", "pipeline_marker"])
def test_identity_markers(target):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    k = CC.prepare_custom_call(cc(target, "f32[2,3]", ["f32[2,3]"]), FakeContext())
    np.testing.assert_array_equal(k(x), x)


def test_pipeline_marker_tuple_and_shape_change():
    k = CC.prepare_custom_call(cc("pipeline_marker", "(f32[2], s32[])", ["f32[2]", "s32[]"]), FakeContext())
    a, b = k(np.ones(2, np.float32), np.int32(3))
    assert b == 3
    with pytest.raises(UnsupportedError):
        CC.prepare_custom_call(cc("SPMDFullToShardShape", "f32[1,3]", ["f32[2,3]"]), FakeContext())


@pytest.mark.xla
@pytest.mark.parametrize("dt", [np.float32, np.int32, np.float16])
def test_topk_matches_jax(dt):
    rs = np.random.RandomState(0)
    x = rs.randint(0, 10, (4, 17)).astype(dt)  # ties: lower index first
    for k in (1, 5, 17):
        v, i = jax.lax.top_k(x, k)
        inst = cc("TopK", f"({shape_text(dt, (4, k))}, s32[4,{k}])", [shape_text(dt, (4, 17))])
        gv, gi = CC.prepare_custom_call(inst, FakeContext())(x)
        np.testing.assert_array_equal(gv, v)
        np.testing.assert_array_equal(gi, i)


def _gemm_cfg(beta=0.0, alpha=1.0, epilogue="DEFAULT", nested=True, lc=("1",), rc=("0",), lb=(), rb=()):
    g = {"alpha_real": alpha, "alpha_imag": 0, "beta": beta, "epilogue": epilogue,
         "dot_dimension_numbers": {"lhs_contracting_dimensions": list(lc), "rhs_contracting_dimensions": list(rc),
                                   "lhs_batch_dimensions": list(lb), "rhs_batch_dimensions": list(rb)},
         "precision_config": {"operand_precision": ["DEFAULT", "DEFAULT"]}}
    return {"operation_queue_id": "0", "gemm_backend_config": g} if nested else g


@pytest.mark.parametrize("target", ["__cublas$gemm", "__cublas$lt$matmul"])
def test_gemm(target):
    rs = np.random.RandomState(1)
    a, b, c = rs.randn(4, 6).astype(np.float32), rs.randn(6, 3).astype(np.float32), rs.randn(4, 3).astype(np.float32)
    bias = rs.randn(3).astype(np.float32)
    ref = a.astype(np.float64) @ b
    # plain, tuple result with workspace, nested or flat config
    inst = cc(target, "(f32[4,3], s8[16])", ["f32[4,6]", "f32[6,3]"], backend_config=_gemm_cfg(nested=False))
    out, ws = CC.prepare_custom_call(inst, FakeContext())(a, b)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert ws.dtype == np.int8 and ws.shape == (16,) and not ws.any()
    # alpha, beta * C
    inst = cc(target, "f32[4,3]", ["f32[4,6]", "f32[6,3]", "f32[4,3]"], backend_config=_gemm_cfg(beta=0.5, alpha=2.0))
    np.testing.assert_allclose(CC.prepare_custom_call(inst, FakeContext())(a, b, c), 2 * ref + 0.5 * c,
                               rtol=1e-5, atol=1e-5)
    # bias + relu, bias + gelu (tanh approximation)
    inst = cc(target, "f32[4,3]", ["f32[4,6]", "f32[6,3]", "f32[3]"], backend_config=_gemm_cfg(epilogue="BIAS_RELU"))
    np.testing.assert_allclose(CC.prepare_custom_call(inst, FakeContext())(a, b, bias), np.maximum(ref + bias, 0),
                               rtol=1e-5, atol=1e-5)
    inst = cc(target, "f32[4,3]", ["f32[4,6]", "f32[6,3]", "f32[3]"], backend_config=_gemm_cfg(epilogue="BIAS_GELU"))
    z = ref + bias
    gelu = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
    np.testing.assert_allclose(CC.prepare_custom_call(inst, FakeContext())(a, b, bias), gelu, rtol=1e-5, atol=1e-5)
    # batched, transposed rhs, bf16 in/out
    x, y = rs.randn(2, 4, 5).astype(ml_dtypes.bfloat16), rs.randn(2, 3, 5).astype(ml_dtypes.bfloat16)
    inst = cc(target, "bf16[2,4,3]", ["bf16[2,4,5]", "bf16[2,3,5]"],
              backend_config=_gemm_cfg(lc=("2",), rc=("2",), lb=("0",), rb=("0",)))
    got = CC.prepare_custom_call(inst, FakeContext())(x, y)
    want = np.einsum("bik,bjk->bij", x.astype(np.float32), y.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_onednn_layernorm_low_precision_is_the_f32_one_rounded_once(dt):
    """XLA:CPU's oneDNN has no f16 layer norm here (SIGILL) and gives garbage for bf16, so the reference is
    the f32 kernel (matched against XLA:CPU by the corpus' thunk_coverage module) on the same values, rounded
    once. 96x48 values take the Numba converters (f16 both ways, bf16 back)."""
    rs = np.random.RandomState(0)
    low = [(rs.randn(*s) * 3 + 1).astype(dt) for s in ((96, 48), (48,), (48,))]
    cfg = {"onednn_layer_norm_config": {"rescale": "SCALE_AND_SHIFT"}}

    def layernorm(d, *args):
        inst = cc("__onednn$layernorm", shape_text(d, (96, 48)),
                  [shape_text(d, (96, 48)), shape_text(d, (48,)), shape_text(d, (48,))], backend_config=cfg)
        return CC.prepare_custom_call(inst, FakeContext())(*args)

    want = layernorm(np.float32, *(v.astype(np.float32) for v in low)).astype(dt)
    got = layernorm(dt, *low)
    assert got.dtype == dt
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


# -- cuBLAS fp8 and triangular solve, against the plain HLO on XLA:CPU ---------------------------------
F8_PLAIN = """HloModule f8
mx {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT m = f32[] maximum(x, y)
}
ENTRY e {
  a = f8e4m3fn[16,32] parameter(0)
  b = f8e4m3fn[16,32] parameter(1)
  sa = f32[] parameter(2)
  sb = f32[] parameter(3)
  sd = f32[] parameter(4)
  a32 = f32[16,32] convert(a)
  b32 = f32[16,32] convert(b)
  d = f32[16,16] dot(a32, b32), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  s = f32[] multiply(sa, sb)
  sbc = f32[16,16] broadcast(s), dimensions={}
  r = f32[16,16] multiply(d, sbc)
  ab = f32[16,16] abs(r)
  z = f32[] constant(0)
  amax = f32[] reduce(ab, z), dimensions={0,1}, to_apply=mx
  dsb = f32[16,16] broadcast(sd), dimensions={}
  r2 = f32[16,16] multiply(r, dsb)
  lo = f32[] constant(-448)
  hi = f32[] constant(448)
  c = f32[16,16] clamp(lo, r2, hi)
  o = f8e4m3fn[16,16] convert(c)
  ROOT t = (f8e4m3fn[16,16], f32[]) tuple(o, amax)
}
"""


def test_cublas_lt_matmul_f8_scales_saturates_and_reports_amax():
    """XLA's FP8 form (gemm_rewriter_fp8_test: a, b transposed, a_scale, b_scale, d_scale last, damax_output)
    against the unfused computation it replaces, on XLA:CPU."""
    import hloexec
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    rs = np.random.RandomState(0)
    a = (rs.randn(16, 32) * 8).astype(ml_dtypes.float8_e4m3fn)
    b = (rs.randn(16, 32) * 8).astype(ml_dtypes.float8_e4m3fn)
    scales = [np.float32(0.5), np.float32(0.25), np.float32(4.0)]
    cfg = _gemm_cfg(lc=("1",), rc=("1",))
    cfg["gemm_backend_config"]["damax_output"] = True
    text = ("HloModule m\nENTRY e {\n  a = f8e4m3fn[16,32] parameter(0)\n  b = f8e4m3fn[16,32] parameter(1)\n"
            "  sa = f32[] parameter(2)\n  sb = f32[] parameter(3)\n  sd = f32[] parameter(4)\n"
            "  ROOT c = (f8e4m3fn[16,16], f32[], s8[33554432]) custom-call(a, b, sa, sb, sd), "
            f"custom_call_target=\"__cublas$lt$matmul$f8\", backend_config={json.dumps(cfg)}\n}}\n")
    out, amax, ws = hloexec.load(text).run(a, b, *scales)
    want_out, want_amax = run_on_xla_cpu(F8_PLAIN, [a, b, *scales])
    assert np.abs(want_out.astype(np.float32)).max() == 448                  # saturation exercised
    assert amax == np.float32(want_amax) and ws.size == 33554432 and not ws[:16].any()
    got, want = out.astype(np.float32), want_out.astype(np.float32)
    step = np.abs(want) * 2.0 ** -3                 # one fp8 e4m3 step: the f32 sums may round apart
    assert np.all(np.abs(got - want) <= step + 2.0 ** -9)


def test_cublas_triangular_solve_is_the_triangular_solve_op():
    import hloexec
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    rs = np.random.RandomState(0)
    a = (rs.randn(2, 4, 4) + 4 * np.eye(4)).astype(np.float32)
    b = rs.randn(2, 3, 4).astype(np.float32)
    options = dict(left_side=False, lower=True, unit_diagonal=False, transpose_a="TRANSPOSE")
    plain = ("HloModule t\nENTRY e {\n  a = f32[2,4,4] parameter(0)\n  b = f32[2,3,4] parameter(1)\n"
             "  ROOT x = f32[2,3,4] triangular-solve(a, b), left_side=false, lower=true, transpose_a=TRANSPOSE\n}\n")
    call = ("HloModule t\nENTRY e {\n  a = f32[2,4,4] parameter(0)\n  b = f32[2,3,4] parameter(1)\n"
            "  ROOT x = (f32[2,3,4], s8[32]) custom-call(a, b), custom_call_target=\"__cublas$triangularSolve\", "
            f"backend_config={json.dumps(options)}\n}}\n")
    x, temp = hloexec.load(call).run(a, b)
    np.testing.assert_allclose(x, run_on_xla_cpu(plain, [a, b])[0], rtol=1e-5, atol=1e-5)
    assert temp.dtype == np.int8 and temp.shape == (32,)


# -- sorting calls --------------------------------------------------------------------------------------
def test_gpu_topk_is_topk():
    x = np.random.RandomState(0).randint(0, 5, (3, 20)).astype(np.float32)
    inst = cc("__gpu$TopK", "(f32[3,4], s32[3,4])", ["f32[3,20]"])
    v, i = CC.prepare_custom_call(inst, FakeContext())(x)
    want_v, want_i = jax.lax.top_k(x, 4)
    np.testing.assert_array_equal(v, want_v)
    np.testing.assert_array_equal(i, want_i)


@pytest.mark.parametrize("descending", [False, True])
def test_cub_radix_sort_is_a_stable_total_order_sort(descending):
    """Against XLA's sort op with a TOTALORDER comparator (stable) on XLA:CPU: keys with ties, -0, NaN, inf."""
    import hloexec
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    rs = np.random.RandomState(1)
    keys = rs.randint(-3, 3, (2, 40)).astype(np.float32)
    keys[0, :6] = [-0.0, 0.0, np.nan, -np.inf, np.inf, -np.nan]
    values = np.arange(80, dtype=np.int32).reshape(2, 40)
    direction = "GT" if descending else "LT"
    plain = ("HloModule s\ncmp {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  c = s32[] parameter(2)\n"
             f"  d = s32[] parameter(3)\n  ROOT r = pred[] compare(a, b), direction={direction}, type=TOTALORDER\n}}\n"
             "ENTRY e {\n  k = f32[2,40] parameter(0)\n  v = s32[2,40] parameter(1)\n"
             "  ROOT s = (f32[2,40], s32[2,40]) sort(k, v), dimensions={1}, is_stable=true, to_apply=cmp\n}\n")
    call = ("HloModule s\nENTRY e {\n  k = f32[2,40] parameter(0)\n  v = s32[2,40] parameter(1)\n"
            "  ROOT s = (f32[2,40], s32[2,40], u8[128]) custom-call(k, v), custom_call_target=\"__cub$DeviceRadixSort\", "
            f"backend_config={{\"descending\":{'true' if descending else 'false'}}}\n}}\n")
    got_k, got_v, _ = hloexec.load(call).run(keys, values)
    want_k, want_v = run_on_xla_cpu(plain, [keys, values])
    np.testing.assert_array_equal(got_k.view(np.uint32), want_k.view(np.uint32))
    np.testing.assert_array_equal(got_v, want_v)


def test_partial_reduce_from_approx_max_k():
    """jax.lax.approx_max_k lowered for TPU: PartialReduce then an exact sort. Its results are elements of the
    input with their indices; the top values, one per bin (here the k largest sit in k distinct bins), are
    exact."""
    import hloexec
    x = np.random.RandomState(0).randn(4, 256).astype(np.float32)
    fn = lambda v: jax.lax.approx_max_k(v, 8, recall_target=0.9)        # noqa: E731
    text = jax.jit(fn).trace(x).lower(lowering_platforms=("tpu",)).as_text(dialect="hlo")
    assert 'custom_call_target="PartialReduce"' in text
    exe = hloexec.load(text)
    vals, idx = exe.run(x)
    np.testing.assert_array_equal(np.take_along_axis(x, idx, axis=1), vals)
    exact = -np.sort(-x, axis=1)[:, :8]
    assert np.all(vals <= exact + 0) and np.all(np.diff(vals, axis=1) <= 0)
    ramp = np.tile(np.arange(256, dtype=np.float32), (4, 1))      # the 8 largest in 8 distinct bins (i mod 128)
    np.testing.assert_array_equal(exe.run(ramp)[0], -np.sort(-ramp, axis=1)[:, :8])


def test_pad_to_static_returns_the_data_and_its_sizes(shared_path):
    import hloexec
    exe = hloexec.load(shared_path("corpus", "xla", "xla__backends__gpu__tests__pad_to_static.hlo"))
    x = np.arange(8, dtype=np.int32).reshape(2, 2, 2)
    data, *sizes = exe.run(x)
    np.testing.assert_array_equal(data, x)
    assert [int(s) for s in sizes] == [2, 2, 2] and all(s.dtype == np.int32 for s in sizes)


# -- AWS Neuron -------------------------------------------------------------------------------------
NEURON = {
    "AwsNeuronGelu": lambda x: jax.nn.gelu(x, approximate=False),
    "AwsNeuronGeluApprxTanh": lambda x: jax.nn.gelu(x, approximate=True),
    "AwsNeuronGeluBackward": jax.vmap(jax.grad(lambda x: jax.nn.gelu(x, approximate=False))),
    "AwsNeuronSilu": jax.nn.silu,
    "AwsNeuronErf": jax.scipy.special.erf,
}


@pytest.mark.parametrize("target", list(NEURON))
def test_neuron_activations_match_jax(target):
    x = np.linspace(-6, 6, 97).astype(np.float32)
    got = CC.prepare_custom_call(cc(target, "f32[97]", ["f32[97]"]), FakeContext())(x)
    np.testing.assert_allclose(got, np.asarray(jax.jit(NEURON[target])(x)), rtol=2e-6, atol=1e-6)  # f32 tails
    bf = x.astype(ml_dtypes.bfloat16)         # bf16 in, computed in f32, rounded once
    got = CC.prepare_custom_call(cc(target, "bf16[97]", ["bf16[97]"]), FakeContext())(bf)
    want = np.asarray(jax.jit(NEURON[target])(bf.astype(np.float32)))
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2 ** -7, atol=2 ** -9)


def test_neuron_rms_norm_over_the_configured_dim():
    """The llama dump's form: x [4096, 1, 4], weight [4096], eps scalar, backend_config "0"."""
    rs = np.random.RandomState(0)
    x, w = rs.randn(64, 1, 4).astype(np.float32), rs.randn(64).astype(np.float32)
    inst = cc("AwsNeuronRmsNorm", "f32[64,1,4]", ["f32[64,1,4]", "f32[64]", "f32[]"], backend_config="0")
    got = CC.prepare_custom_call(inst, FakeContext())(x, w, np.float32(1e-5))
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 ** 2, axis=0, keepdims=True) + 1e-5) * w.reshape(64, 1, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5)


# -- kCustom fusions run their fused computation -----------------------------------------------------
def test_triton_gemm_fusion_runs_its_computation():
    import hloexec
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    text = """HloModule t
triton_gemm {
  p0 = f32[16,32] parameter(0)
  p1 = f32[32,8] parameter(1)
  ROOT d = f32[16,8] dot(p0, p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
ENTRY e {
  a = f32[16,32] parameter(0)
  b = f32[32,8] parameter(1)
  ROOT f = f32[16,8] fusion(a, b), kind=kCustom, calls=triton_gemm, backend_config={"fusion_backend_config":{"kind":"__triton_gemm","triton_gemm_config":{"block_m":"16","block_n":"16","block_k":"32","split_k":"1","num_stages":"1","num_warps":"4","num_ctas":"1"}}}
}
"""
    rs = np.random.RandomState(0)
    a, b = rs.randn(16, 32).astype(np.float32), rs.randn(32, 8).astype(np.float32)
    plain = ("HloModule d\nENTRY e {\n  a = f32[16,32] parameter(0)\n  b = f32[32,8] parameter(1)\n"
             "  ROOT d = f32[16,8] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n")
    np.testing.assert_allclose(hloexec.load(text).run(a, b), run_on_xla_cpu(plain, [a, b])[0], rtol=1e-5, atol=1e-5)


@pytest.mark.xla
def test_dce_sink_keeps_its_operand_alive_and_does_nothing():
    """jax's lax.dce_sink(..., prevent_mlir_dce=True) lowers to custom-call "dce_sink" (side effect, value ())."""
    import hloexec

    def f(x):
        jax.lax.dce_sink(x * 2, prevent_mlir_dce=True)
        return x + 1
    x = np.arange(3, dtype=np.float32)
    lowered = jax.jit(f).lower(x)
    for text in (lowered.as_text(dialect="hlo"), lowered.compile().as_text()):
        assert 'custom_call_target="dce_sink"' in text
        np.testing.assert_array_equal(hloexec.load(text).run(x), x + 1)
