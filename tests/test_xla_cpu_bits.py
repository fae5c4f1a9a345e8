"""`device="xla-cpu"` reproduces XLA:CPU's bits on XLA:CPU's own optimized dumps (issue 27): f16 gradients and
an Adam step made by jax (tests/numerics_programs.py), each output >= 99% bit-identical and within 1 ULP of its
scale; the default profile measurably further. The pieces on their own: YNNPACK's f32 row sums (__ynn_fusion) and LLVM's FMA contraction,
against XLA:CPU on tiny programs; every tier (op by op, compiled fusions) gives the same bits."""
from __future__ import annotations

import os

import numpy as np
import pytest

from xla_compare import bits_agreement, flatten

os.environ.setdefault("JAX_PLATFORMS", "cpu")
jax = pytest.importorskip("jax")
jnp = jax.numpy

import hloexec  # noqa: E402
from hloexec.options.devices import machine_vector_width  # noqa: E402

# The rules were measured on an AVX-512 host with AVX512-FP16 (docs/device-numerics-xla-cpu.md): elsewhere
# XLA:CPU's orders and f16 arithmetic differ, and what these tests check is not known to hold.
_FLAGS = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
measured_host = pytest.mark.skipif(machine_vector_width() != 16 or "avx512_fp16" not in _FLAGS,
                                   reason="xla-cpu's rules were measured on AVX-512 with AVX512-FP16 only")


def xla_dump(fn, *args):
    """(XLA:CPU's optimized text of jit(fn), its outputs)."""
    jitted = jax.jit(fn)
    return jitted.lower(*args).compile().as_text(), [np.asarray(o) for o in jax.tree_util.tree_leaves(jitted(*args))]


def agreement(text, args, want, **options):
    got = flatten(hloexec.load(text, **options)(*args))
    return [bits_agreement(g, w) for g, w in zip(got, want)]


def rmsnorm_grad(x, g, b):
    def loss(x, g, b):
        return jnp.sum((x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g + b) ** 2)
    return jax.grad(loss, argnums=(0, 1, 2))(x, g, b)


@measured_host
@pytest.mark.parametrize("name", ["layernorm_grad_f16", "rmsnorm_grad_f16", "adam_f16"])
def test_xla_cpu_profile_reproduces_xla_cpus_bits_and_the_default_does_not(name):
    import numerics_programs
    dump = numerics_programs.dump(name)
    xla_cpu = agreement(dump.opt, dump.inputs, dump.xla, device="xla-cpu")
    for k, (same, ulps) in enumerate(xla_cpu):
        assert same >= 0.99 and ulps <= 1, f"output {k}: {100 * same:.2f}% identical, {ulps:g} ULPs of scale"
    reference = agreement(dump.opt, dump.inputs, dump.xla)
    assert min(same for same, _ in reference) < min(same for same, _ in xla_cpu), reference


@measured_host
@pytest.mark.parametrize("n", [100, 256, 300, 512, 768])
def test_ynn_row_sums_have_xla_cpus_bits(n):
    x = np.random.default_rng(n).standard_normal((64, n)).astype(np.float32)
    text, want = xla_dump(lambda x: x.sum(-1), x)
    assert "__ynn_fusion" in text
    assert agreement(text, (x,), want, device="xla-cpu")[0][0] == 1.0
    assert agreement(text, (x,), want, device="xla-cpu", reductions="per-step")[0][0] < 0.9


@measured_host
@pytest.mark.parametrize("shape", [(16, 2048), (8, 4096), (4, 8192), (16, 1280), (16, 1536), (8, 2560), (8, 3200),
                                   (8, 64, 64), (8, 16, 256), (8, 8, 512), (4, 128, 128)])
def test_ynn_sums_of_tiles_and_of_several_dims_have_xla_cpus_bits(shape):
    """Beyond 1024 elements YNNPACK's tiles of 64 chunks add up by compensated summation (a last, shorter tile
    uncompensated); a sum over several minor dims is one row (a train step's loss)."""
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    text, want = xla_dump(lambda x: x.sum(tuple(range(1, x.ndim))), x)
    assert "__ynn_fusion" in text
    assert agreement(text, (x,), want, device="xla-cpu")[0][0] == 1.0
    assert agreement(text, (x,), want, device="xla-cpu", reductions="per-step")[0][0] < 0.9


@measured_host
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_multiply_add_inside_a_fusion_rounds_once_as_xla_cpus(dtype):
    r = np.random.default_rng(4)
    a, b, c = (r.standard_normal(4096).astype(dtype) for _ in range(3))
    text, want = xla_dump(lambda a, b, c: (a * b + c, c - a * b), a, b, c)
    assert all(same == 1.0 for same, _ in agreement(text, (a, b, c), want, device="xla-cpu"))
    assert any(same < 0.9 for same, _ in agreement(text, (a, b, c), want))


def test_compiled_fusions_give_the_op_by_op_bits_under_xla_cpu():
    r = np.random.default_rng(2)
    args = (r.standard_normal((4, 16, 256)).astype(np.float16), (1 + 0.1 * r.standard_normal(256)).astype(np.float16),
            (0.1 * r.standard_normal(256)).astype(np.float16))
    text, _ = xla_dump(rmsnorm_grad, *args)
    op_by_op = flatten(hloexec.load(text, device="xla-cpu", use_numba=False)(*args))
    compiled = flatten(hloexec.load(text, device="xla-cpu", compile="eager")(*args))
    for a, b in zip(op_by_op, compiled):
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16))


def test_vector_width_is_a_profile_rule_detected_from_the_machine(tmp_path):
    from hloexec.errors import ExecutionError
    from hloexec.options.devices import device_profile
    assert machine_vector_width() == (16 if "avx512f" in _FLAGS else 8 if " avx" in _FLAGS else 4)
    bad = tmp_path / "bad.toml"
    bad.write_text('base = "xla-cpu"\nvector_width = 3\n')
    with pytest.raises(ExecutionError, match="vector_width"):
        device_profile(str(bad))
    other = tmp_path / "other.toml"  # (a width the machine does not have: AVX2's 8 on AVX-512, else 16)
    other.write_text(f'base = "xla-cpu"\nvector_width = {8 if machine_vector_width() != 8 else 16}\n')
    x = np.random.default_rng(5).standard_normal((64, 256)).astype(np.float32)
    text, _ = xla_dump(lambda x: x.sum(-1), x)
    mine, theirs = (flatten(hloexec.load(text, device=d)(x))[0] for d in ("xla-cpu", str(other)))
    assert np.mean(mine == theirs) < 0.9       # the lanes change the order, so the bits


@measured_host
def test_a_compiled_loop_contracts_its_fusions_multiply_adds_too():
    r = np.random.default_rng(6)
    a, b = r.standard_normal((2, 512)).astype(np.float16)

    def loop(a, b):
        return jax.lax.fori_loop(0, 20, lambda i, acc: acc * b + a, a)
    text, want = xla_dump(loop, a, b)
    assert "while" in text
    for compile_after in (0, 1):          # 0: the loop compiles whole (kernels/program.py); 1: interpreted first
        got = flatten(hloexec.load(text, device="xla-cpu", compile_after=compile_after)(a, b))[0]
        assert np.array_equal(got.view(np.uint16), want[0].view(np.uint16))
    assert not np.array_equal(flatten(hloexec.load(text)(a, b))[0].view(np.uint16), want[0].view(np.uint16))


@measured_host
def test_a_fused_sum_of_products_adds_each_exact_product_once_rounded():
    r = np.random.default_rng(7)
    x, y = r.standard_normal((2, 16, 512)).astype(np.float16)
    text, want = xla_dump(lambda x, y: jax.lax.reduce(x * y, np.float16(0), jax.lax.add, (0,)), x, y)
    assert agreement(text, (x, y), want, device="xla-cpu", use_numba=False)[0][0] == 1.0
    assert agreement(text, (x, y), want, device="xla-cpu")[0][0] == 1.0
    assert agreement(text, (x, y), want, device="xla-cpu", reductions="per-step")[0][0] == 1.0   # the order is XLA's
    assert agreement(text, (x, y), want, reductions="per-step")[0][0] < 0.9           # the rounding is not


def test_denormals_compare_as_xla_cpu_keeps_or_flushes_them():
    """XLA:CPU keeps the f32 denormals a bitcast makes (no arithmetic) and flushes those its arithmetic makes
    (FTZ): bits_agreement flushes ours only where XLA:CPU's result is zero."""
    ints = np.arange(1, 4097, dtype=np.int32)  # bit patterns of f32 denormals
    text, want = xla_dump(lambda i: jax.lax.bitcast_convert_type(i, jnp.float32), ints)
    assert np.all(want[0] != 0)
    assert agreement(text, (ints,), want, device="xla-cpu")[0] == (1.0, 0.0)
    x = np.full(64, 1e-20, np.float32)
    text, want = xla_dump(lambda x: x * x, x)  # 1e-40: a denormal, flushed by XLA:CPU
    assert np.all(want[0] == 0)
    got = flatten(hloexec.load(text, device="xla-cpu")(x))[0]
    assert np.all(got != 0) and bits_agreement(got, want[0]) == (1.0, 0.0)
