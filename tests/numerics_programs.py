"""The low-precision programs numerical validation is judged on, generated with jax (tests and README).

* `layernorm_grad_f16`: the issue's program: jax.grad of sum(layernorm(x)**2) wrt x f16[8,128,256], g, b f16[256].
* `adam_f16` / `adam_bf16`: an Adam step with f32 master weights and moments stored in f16 / bf16 (computed in
  f32: the mixed f16/f32 converts of a memory-saving optimizer).
* `train_step_bf16`: a bf16 MLP regression step (bf16 weights and activations, an f32 loss, SGD in bf16)
  returning the loss, the gradients and the new weights; square [64,64] layers so that a reduction over the
  wrong dimension keeps the shapes.
* `layernorm_grad_bf16`, `rmsnorm_grad_f16` / `_bf16`, `softmax_xent_grad_f16` / `_bf16`: more f16/bf16
  gradients (x [16,64,256]; logits [256,512] against one-hot labels) for XLA:CPU's bits (BITS_PROGRAMS).
* `masked_softmax_overflow`: an attention-style softmax with an intentional -inf mask and a real f16
  overflow (exp of unscaled logits), for the NaN/Inf origin report.

`dump(name)` returns a `Dump`: the pre-optimization HLO (what `XLA_FLAGS=--xla_dump_hlo_as_text` writes as
`*.before_optimizations.txt`), XLA:CPU's optimized HLO, the inputs and XLA:CPU's outputs.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")


@dataclass
class Dump:
    pre: str
    opt: str
    inputs: list
    xla: list


def _layernorm(x, g, b, eps=1e-5):
    from jax import lax
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps) * g + b


def layernorm_grad_f16():
    import jax
    import jax.numpy as jnp

    def loss(x, g, b):
        return jnp.sum(_layernorm(x, g, b) ** 2)
    r = np.random.default_rng(0)
    x = r.standard_normal((8, 128, 256)).astype(np.float16)
    g = (1 + 0.1 * r.standard_normal(256)).astype(np.float16)
    b = (0.1 * r.standard_normal(256)).astype(np.float16)
    return jax.grad(loss, argnums=(0, 1, 2)), (x, g, b)


def _adam(dtype):
    import jax.numpy as jnp
    import ml_dtypes
    low = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]

    def step(p, g, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
        g32 = g.astype(jnp.float32)
        m32 = b1 * m.astype(jnp.float32) + (1 - b1) * g32
        v32 = b2 * v.astype(jnp.float32) + (1 - b2) * g32 * g32
        t = t.astype(jnp.float32)
        update = lr * (m32 / (1 - b1 ** t)) / (jnp.sqrt(v32 / (1 - b2 ** t)) + eps)
        return p - update, m32.astype(low), v32.astype(low)
    r = np.random.default_rng(1)
    n = (256, 512)
    p = r.standard_normal(n).astype(np.float32)
    g = (1e-2 * r.standard_normal(n)).astype(low)
    m = (1e-3 * r.standard_normal(n)).astype(low)
    v = (1e-4 * r.random(n)).astype(low)
    return step, (p, g, m, v, np.int32(10))


def adam_f16():
    return _adam("f16")


def adam_bf16():
    return _adam("bf16")


def train_step_bf16():
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    bf16 = ml_dtypes.bfloat16

    def loss(params, x, y):
        h = x
        for w, b in params[:-1]:
            h = jax.nn.gelu(h @ w + b)
        w, b = params[-1]
        out = (h @ w + b).astype(jnp.float32)
        return jnp.mean((out - y.astype(jnp.float32)) ** 2)

    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return value, grads, jax.tree_util.tree_map(lambda p, g: p - jnp.asarray(0.05, bf16) * g, params, grads)
    r = np.random.default_rng(2)
    d = 64
    params = [((r.standard_normal((d, d)) / np.sqrt(d)).astype(bf16), (0.1 * r.standard_normal(d)).astype(bf16))
              for _ in range(3)]
    x = r.standard_normal((d, d)).astype(bf16)
    y = r.standard_normal((d, d)).astype(bf16)
    return step, (params, x, y)


def masked_softmax_overflow():
    import jax
    import jax.numpy as jnp

    def f(q, k):
        s = q @ k.T                                           # f16 logits, no 1/sqrt(d) scaling: they overflow exp
        mask = jnp.tril(jnp.ones(s.shape, bool))
        s = jnp.where(mask, s, -jnp.inf)                      # the intentional -inf
        e = jnp.exp(s)                                         # unstabilised softmax: exp(large) = inf in f16
        return e / e.sum(-1, keepdims=True)
    r = np.random.default_rng(3)
    q = (3 * r.standard_normal((16, 32))).astype(np.float16)
    k = (3 * r.standard_normal((16, 32))).astype(np.float16)
    return f, (q, k)


def _norm_grad(dtype, norm):
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    low = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]

    def loss(x, g, b):
        return jnp.sum(norm(x, g, b) ** 2)
    r = np.random.default_rng(4)
    x = r.standard_normal((16, 64, 256)).astype(low)
    g = (1 + 0.1 * r.standard_normal(256)).astype(low)
    b = (0.1 * r.standard_normal(256)).astype(low)
    return jax.grad(loss, argnums=(0, 1, 2)), (x, g, b)


def _rmsnorm(x, g, b, eps=1e-6):
    from jax import lax
    return x * lax.rsqrt((x * x).mean(-1, keepdims=True) + eps) * g + b


def layernorm_grad_bf16():
    return _norm_grad("bf16", _layernorm)


def rmsnorm_grad_f16():
    return _norm_grad("f16", _rmsnorm)


def rmsnorm_grad_bf16():
    return _norm_grad("bf16", _rmsnorm)


def _softmax_xent_grad(dtype):
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    low = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]

    def loss(logits, labels):
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.sum(labels * logp, axis=-1))
    r = np.random.default_rng(5)
    logits = (2 * r.standard_normal((256, 512))).astype(low)
    labels = jax.nn.one_hot(r.integers(0, 512, 256), 512, dtype=low)
    return jax.grad(loss), (logits, np.asarray(labels))


def softmax_xent_grad_f16():
    return _softmax_xent_grad("f16")


def softmax_xent_grad_bf16():
    return _softmax_xent_grad("bf16")


PROGRAMS = {f.__name__: f for f in (layernorm_grad_f16, adam_f16, adam_bf16, train_step_bf16, masked_softmax_overflow,
                                    layernorm_grad_bf16, rmsnorm_grad_f16, rmsnorm_grad_bf16, softmax_xent_grad_f16,
                                    softmax_xent_grad_bf16)}
# the f16/bf16 programs `device="xla-cpu"` is measured on (bench/bench_xla_cpu_bits.py, tests/test_xla_cpu_bits.py)
BITS_PROGRAMS = ("layernorm_grad_f16", "layernorm_grad_bf16", "rmsnorm_grad_f16", "rmsnorm_grad_bf16",
                 "softmax_xent_grad_f16", "softmax_xent_grad_bf16", "adam_f16", "adam_bf16", "train_step_bf16")


@functools.cache
def dump(name: str) -> Dump:
    import jax
    fn, args = PROGRAMS[name]()
    lowered = jax.jit(fn, keep_unused=True).lower(*args)
    compiled = lowered.compile()
    inputs = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
    xla = [np.asarray(o) for o in jax.tree_util.tree_leaves(compiled(*args))]
    return Dump(lowered.as_text(dialect="hlo"), compiled.as_text(), inputs, xla)
