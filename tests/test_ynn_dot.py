"""f32 dots XLA:CPU hands to YNNPACK (`__ynn_fusion`) sum in YNNPACK's order under the xla-cpu profile
(hloexec/kernels/ynn_dot.py): bit-identical to XLA:CPU on the shapes the order was measured for, in every tier;
BLAS's order (the default profile) is not."""
from __future__ import annotations

import os

import numpy as np
import pytest

from xla_compare import bits_agreement

os.environ.setdefault("JAX_PLATFORMS", "cpu")
jax = pytest.importorskip("jax")

import hloexec  # noqa: E402
from hloexec.options.devices import machine_vector_width  # noqa: E402

avx512 = pytest.mark.skipif(machine_vector_width() != 16, reason="YNNPACK's order was measured on AVX-512 only")


def xla(fn, *args):
    jitted = jax.jit(fn)
    return jitted.lower(*args).compile().as_text(), np.asarray(jitted(*args))


@avx512
@pytest.mark.parametrize("m, k, n", [(64, 4, 3), (64, 7, 16), (8, 13, 3), (16, 30, 8), (8, 3, 3), (64, 5, 64),
                                     (128, 1024, 128), (64, 600, 16), (96, 300, 256), (64, 16, 48), (64, 7, 80),
                                     (64, 13, 32), (128, 16, 96), (48, 16, 32)])
def test_f32_dots_sum_in_ynnpacks_order(m, k, n):
    r = np.random.default_rng(m * k + n)
    a, b = r.standard_normal((m, k)).astype(np.float32), r.standard_normal((k, n)).astype(np.float32)
    text, want = xla(lambda a, b: a @ b, a, b)
    assert "__ynn_fusion" in text
    for tier in ({"use_numba": False}, {"compile": "eager"}):
        assert bits_agreement(hloexec.load(text, device="xla-cpu", **tier)(a, b), want) == (1.0, 0.0), tier


@avx512
def test_batched_and_the_default_profile():
    r = np.random.default_rng(7)
    a, b = r.standard_normal((3, 32, 260)).astype(np.float32), r.standard_normal((3, 260, 12)).astype(np.float32)
    text, want = xla(lambda a, b: jax.numpy.einsum("bmk,bkn->bmn", a, b), a, b)
    assert bits_agreement(hloexec.load(text, device="xla-cpu")(a, b), want)[0] == 1.0
    assert bits_agreement(hloexec.load(text)(a, b), want)[0] < 0.9


@avx512
@pytest.mark.parametrize("shape, window, stride", [((1, 12, 12, 3), (3, 3, 3, 4), (1, 1)),
                                                   ((2, 10, 9, 2), (4, 5, 2, 3), (1, 2))])
def test_f32_convolutions_chain_fmas_as_xla_cpu(shape, window, stride):
    r = np.random.default_rng(sum(shape))
    x, w = r.standard_normal(shape).astype(np.float32), r.standard_normal(window).astype(np.float32)
    text, want = xla(lambda x, w: jax.lax.conv_general_dilated(x, w, stride, "SAME", dimension_numbers=(
        "NHWC", "HWIO", "NHWC")), x, w)
    assert bits_agreement(hloexec.load(text, device="xla-cpu")(x, w), want) == (1.0, 0.0)
    assert bits_agreement(hloexec.load(text)(x, w), want)[0] < 0.9


def conv(x, w, stride=(1, 1), padding="SAME", lhs_dilation=None, rhs_dilation=None, groups=1):
    return jax.lax.conv_general_dilated(x, w, stride, padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups)


@avx512
@pytest.mark.parametrize("shape, window, how", [
    *[((1, 1, 300 + k - 1, 1), (1, k, 1, 1), {"padding": "VALID"}) for k in (2, 3, 7, 9, 13, 24, 40, 60, 100, 200,
                                                                              333, 512)],
    ((1, 28, 28, 1), (3, 3, 1, 1), {"padding": "VALID"}),  # lax_test's testConvTransposePaddingList
    ((3, 9, 10, 3), (4, 5, 3, 1), {"padding": ((3, 3), (4, 4)), "lhs_dilation": (2, 2), "rhs_dilation": (2, 2)}),
    ((2, 10, 9, 3), (4, 5, 3, 1), {"stride": (2, 1)}),
    ((2, 12, 12, 4), (3, 3, 1, 4), {"groups": 4}),  # depthwise: one output feature per group
])
def test_f32_convolutions_of_one_output_feature_as_xla_cpu(shape, window, how):
    """XLA:CPU's matrix-vector order (hloexec/kernels/conv_order.py): lanes of 8, neighbours first, inner-dim
    shards of K beyond 96; the FMA chain of wider convolutions is not it."""
    r = np.random.default_rng(sum(shape) + sum(window))
    x, w = r.standard_normal(shape).astype(np.float32), r.standard_normal(window).astype(np.float32)
    text, want = xla(lambda x, w: conv(x, w, **how), x, w)
    assert bits_agreement(hloexec.load(text, device="xla-cpu")(x, w), want) == (1.0, 0.0)
    if window[0] * window[1] * window[2] > 3:
        assert bits_agreement(hloexec.load(text)(x, w), want)[0] < 0.9
