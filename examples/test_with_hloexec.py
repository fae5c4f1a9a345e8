"""hloexec in a test suite: copy this file next to your tests (pip install 'hloexec[jax]'; installing hloexec
enables its pytest plugin). Run it: pytest examples/test_with_hloexec.py"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hloexec.jax


def layernorm(x, g, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * g + b


def loss(x, g, b):
    return jnp.sum(jnp.sin(layernorm(x, g, b)))


@pytest.fixture
def batch():
    r = np.random.default_rng(0)
    return (r.standard_normal((8, 64, 128), dtype=np.float32), 1 + 0.1 * r.standard_normal(128, dtype=np.float32),
            0.1 * r.standard_normal(128, dtype=np.float32))


def test_layernorm_gradient_matches_xla(hlo_reference, batch):
    """The fixture lowers the function with jax, runs it on XLA:CPU and with hloexec, and fails with the
    per-output table and the worst elements if they differ beyond the dtype's tolerance."""
    # the gradients of g and b sum 512 terms: in XLA's order and in hloexec's they differ by a few f32 ULPs of
    # the sum, more than f32's default 1e-5 relative bound where the terms cancel (atol/rtol: an element fails
    # only beyond both)
    grads = hlo_reference(jax.grad(loss, argnums=(0, 1, 2)), *batch, atol=1e-4)
    assert [g.shape for g in grads] == [(8, 64, 128), (128,), (128,)]


def test_optimized_module_too(hlo_reference, batch):
    """stage="opt" runs the module XLA:CPU made of the function (fusions, its own layouts)."""
    hlo_reference(jax.grad(loss, argnums=(0, 1, 2)), *batch, stage="opt", atol=1e-4)


def test_an_hlo_module(hlo_reference):
    """HLO text, a path or a parsed module: compared with XLA:CPU running the same text, or with `expected`."""
    text = """HloModule scale
ENTRY e {
  x = f32[4] parameter(0)
  two = f32[] constant(2)
  b = f32[4] broadcast(two), dimensions={}
  ROOT y = f32[4] multiply(x, b)
}"""
    x = np.arange(4, dtype=np.float32)
    hlo_reference(text, x)
    hlo_reference(text, x, expected=2 * x)


@pytest.mark.hloexec
def test_every_jit_of_this_test_is_checked(batch):
    """Under the marker, each function jitted inside the test also runs with hloexec on each call."""
    step = jax.jit(lambda x, g, b: layernorm(x, g, b).mean())
    assert np.isfinite(step(*batch))


def test_the_bridge_directly(batch, tmp_path):
    outputs = hloexec.jax.run(layernorm, *batch)                 # numpy arrays, in the function's pytree
    assert outputs.dtype == np.float32 and outputs.shape == (8, 64, 128)
    hloexec.jax.check(layernorm, *batch)                         # AssertionError with the table on a mismatch
    paths = hloexec.jax.dump(loss, *batch, to=tmp_path)          # what XLA_FLAGS=--xla_dump_to would write
    assert paths["after"].exists() and paths["inputs"].exists()
