"""custom-call registry and built-in targets (TopK against jax.lax.top_k; gemm against numpy; oneDNN layer norm
in f16/bf16 against its f32 form)."""
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


def test_unknown_target_and_registration():
    with pytest.raises(UnsupportedError, match="no_such_target"):
        CC.prepare_custom_call(cc("no_such_target", "f32[2]", ["f32[2]"]), FakeContext())
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
