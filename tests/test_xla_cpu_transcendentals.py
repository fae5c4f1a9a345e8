"""`transcendentals = "xla-cpu"` (the xla-cpu profile): f32 exp, log, log1p, expm1, tanh, erf and logistic compute
XLA:CPU's own approximations bit for bit, in every tier; the default profile's (to the nearest f32) measurably
differ. XLA:CPU through jaxlib is the reference: the same op compiled by it, on a sweep of inputs."""

from __future__ import annotations

import os

import numpy as np
import pytest

from xla_compare import bits_agreement

os.environ.setdefault("JAX_PLATFORMS", "cpu")
jax = pytest.importorskip("jax")
jnp = jax.numpy

import hloexec  # noqa: E402
from hloexec.kernels import numpy_form  # noqa: E402

_FLAGS = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
# The approximations were read off XLA:CPU's code for x86-64 with FMA: elsewhere LLVM contracts differently.
x86_fma = pytest.mark.skipif(" fma" not in _FLAGS, reason="XLA:CPU's approximations were read on x86-64 with FMA")
# On AVX2 (AMD Zen 3, 2026-11-30) XLA:CPU's f32 cbrt matched the correctly rounded default everywhere: the default
# profile differs from it only where XLA:CPU's code is the AVX-512 machine's (Intel Xeon)
_DEFAULT_IS_XLAS = {"cbrt"} if "avx512f" not in _FLAGS else set()

OPS = {
    "exponential": jnp.exp,
    "log": jnp.log,
    "log-plus-one": jnp.log1p,
    "exponential-minus-one": jnp.expm1,
    "tanh": jnp.tanh,
    "erf": jax.lax.erf,
    "logistic": jax.nn.sigmoid,
    "rsqrt": jax.lax.rsqrt,
    "sine": jnp.sin,
    "cosine": jnp.cos,
    "tan": jnp.tan,
    "cbrt": jnp.cbrt,
}
BINARY = {"atan2": jnp.arctan2, "power": jnp.power}
_TINY = np.finfo(np.float32).tiny


def sweep(opcode: str, n: int = 20000) -> np.ndarray:
    """f32 inputs over each op's range, its cut-over points and specials; no subnormals (XLA:CPU flushes them)."""
    r = np.random.default_rng(len(opcode))
    parts = [
        r.uniform(-1, 1, n),
        r.uniform(-10, 10, n),
        r.uniform(-90, 90, n),
        1e-3 * r.standard_normal(n),
        np.exp(r.uniform(-85, 85, n)),
        [
            0.0,
            -0.0,
            np.inf,
            -np.inf,
            np.nan,
            88.7,
            88.8,
            -87.3,
            -87.8,
            -88.0,
            20.0,
            -20.0,
            0.5,
            -0.5,
            3.832,
            4e-4,
            0.41421,
            -0.41421,
            -1.0,
            1.0,
        ],
    ]
    x = np.concatenate([np.asarray(p, np.float64) for p in parts]).astype(np.float32)
    if opcode in ("log", "log-plus-one", "rsqrt"):
        x = np.concatenate([x, np.abs(x)])
    return x[(np.abs(x) >= _TINY) | (x == 0) | ~np.isfinite(x)]


def xla(fn, x):
    jitted = jax.jit(fn)
    return jitted.lower(x).compile().as_text(), np.asarray(jitted(x))


@x86_fma
@pytest.mark.parametrize("opcode", list(OPS))
def test_f32_transcendentals_have_xla_cpus_bits_in_every_tier(opcode):
    x = sweep(opcode)
    text, want = xla(OPS[opcode], x)
    for tier in ({"use_numba": False}, {"compile": "eager"}):
        got = hloexec.load(text, device="xla-cpu", **tier)(x)
        assert bits_agreement(got, want) == (1.0, 0.0), (opcode, tier)


@x86_fma
@pytest.mark.parametrize("opcode", list(BINARY))
def test_binary_ones_call_the_c_librarys_function_as_xla_cpu(opcode):
    x, y = sweep(opcode), sweep(opcode)[::-1].copy()
    if opcode == "power":
        x = np.abs(x)
    jitted = jax.jit(BINARY[opcode])
    text, want = jitted.lower(x, y).compile().as_text(), np.asarray(jitted(x, y))
    for tier in ({"use_numba": False}, {"compile": "eager"}):
        assert bits_agreement(hloexec.load(text, device="xla-cpu", **tier)(x, y), want) == (1.0, 0.0), tier


@x86_fma
@pytest.mark.parametrize("opcode", ["exponential", "log", "tanh", "erf", "rsqrt", "sine", "cbrt"])
def test_the_default_profile_is_not_xla_cpus(opcode):
    if opcode in _DEFAULT_IS_XLAS:
        pytest.skip(f"XLA:CPU's f32 {opcode} is correctly rounded on this machine (no AVX-512)")
    x = sweep(opcode)
    text, want = xla(OPS[opcode], x)
    same, _ = bits_agreement(hloexec.load(text, use_numba=False)(x), want)
    assert same < 0.99


@x86_fma
def test_inside_a_fusion_and_a_compiled_loop():
    def f(x):
        def body(i, acc):
            return jnp.tanh(acc) * 1.5 + jnp.exp(-acc * acc) - jnp.log1p(jnp.abs(acc))

        return jax.lax.fori_loop(0, 5, body, x)

    x = np.random.default_rng(1).uniform(-3, 3, 1024).astype(np.float32)
    text, want = xla(f, x)
    for tier in ({"use_numba": False}, {"compile": "eager"}):
        assert bits_agreement(hloexec.load(text, device="xla-cpu", **tier)(x), want)[0] == 1.0, tier


def test_the_f32_fma_of_both_forms_rounds_once():
    from hloexec.kernels.scalar import fma_f32
    from numba import njit

    @njit
    def fused(a, b, c):
        out = np.empty_like(a)
        for i in range(a.size):
            out[i] = fma_f32(a[i], b[i], c[i])
        return out

    r = np.random.default_rng(3)
    a, b = (r.standard_normal(100000).astype(np.float32) for _ in range(2))
    c = r.standard_normal(100000).astype(np.float32)
    # a * b = 1 + 2**-11 + 2**-24 is the midpoint of two f32 values; + 2**-100 is above it, but the float64 sum
    # drops it: rounding through float64 (ties to even) gets 1 + 2**-11, one rounding 1 + 2**-11 + 2**-23
    a[:2] = b[:2] = np.float32(1 + 2**-12)
    c[:2] = np.float32(2**-100), np.float32(-(2**-100))
    want = fused(a, b, c)
    assert want[0] == np.float32(1 + 2**-11 + 2**-23) and want[1] == np.float32(1 + 2**-11)
    got = numpy_form._np_fma32(a, b, c)
    assert np.array_equal(got.view(np.int32), want.view(np.int32))


def test_a_profile_rule_that_other_profiles_can_take(tmp_path):
    from hloexec.errors import ExecutionError
    from hloexec.options.devices import device_profile

    assert device_profile("xla-cpu").transcendentals == "xla-cpu"
    assert device_profile("reference").transcendentals == "accurate"
    bad = tmp_path / "bad.toml"
    bad.write_text('base = "xla-cpu"\ntranscendentals = "fast"\n')
    with pytest.raises(ExecutionError, match="transcendentals"):
        device_profile(str(bad))
