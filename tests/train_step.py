"""A small bf16 transformer block trained by a hand-written Adam over f32 master weights: issue 33's main example,
shared by the tests of inputs, the pytest plugin, the verdict and the localizing tools.

    step, state, batch = train_step()            # the first step: zero moments, t = 0
    step, state, batch = train_step(warmup=3)    # a later one: state after 3 steps jax ran
    loss, new_state = step(state, batch)

`step` is `jax.jit`ted (`keep_unused=True`); `state` = {"params", "m", "v", "t"}: 10 f32 parameter arrays
(LayerNorm gains and biases, attention q/k/v/o, gelu MLP in/out), Adam's two moments of the same shapes, the
step count (int32 scalar); `batch` = (x, y), bf16 [B, T, D] activations and regression targets. The forward
pass runs in bf16 (weights cast from the f32 masters), the loss and Adam in f32. Flat (jax orders a dict's keys),
the step has 33 inputs: m 0-9, params 10-19, t 20, v 21-30 (each 10 sorted by name: SHAPES' keys sorted), x 31,
y 32; and 32 outputs: the loss 0, then the new state in the same order (m 1-10, params 11-20, t 21, v 22-31).

Importing this module imports jax.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

B, T, D, H, F = 2, 16, 32, 2, 64          # batch, sequence, model width, heads, MLP width
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8

SHAPES = {"ln1_g": (D,), "ln1_b": (D,), "wq": (D, D), "wk": (D, D), "wv": (D, D), "wo": (D, D),
          "ln2_g": (D,), "ln2_b": (D,), "w1": (D, F), "w2": (F, D)}


def _layernorm(x, g, b):
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = ((x32 - mean) ** 2).mean(-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + 1e-5)).astype(jnp.bfloat16) * g + b


def _block(p, x):
    """One pre-LayerNorm transformer block in bf16: causal self-attention, then a gelu MLP."""
    p = {k: w.astype(jnp.bfloat16) for k, w in p.items()}
    h = _layernorm(x, p["ln1_g"], p["ln1_b"])
    q, k, v = [(h @ p[n]).reshape(B, T, H, D // H) for n in ("wq", "wk", "wv")]
    scores = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(jnp.bfloat16(D // H))
    scores = jnp.where(jnp.tril(jnp.ones((T, T), bool)), scores, jnp.bfloat16(-1e4))
    attention = jax.nn.softmax(scores.astype(jnp.float32), -1).astype(jnp.bfloat16)
    x = x + jnp.einsum("bhts,bshd->bthd", attention, v).reshape(B, T, D) @ p["wo"]
    return x + jax.nn.gelu(_layernorm(x, p["ln2_g"], p["ln2_b"]) @ p["w1"]) @ p["w2"]


def _loss(params, batch):
    x, y = batch
    return jnp.mean((_block(params, x).astype(jnp.float32) - y.astype(jnp.float32)) ** 2)


def _step(state, batch):
    loss, grads = jax.value_and_grad(_loss)(state["params"], batch)
    t = state["t"] + 1
    m = jax.tree_util.tree_map(lambda m, g: BETA1 * m + (1 - BETA1) * g, state["m"], grads)
    v = jax.tree_util.tree_map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, state["v"], grads)
    tf = t.astype(jnp.float32)
    scale = LR * jnp.sqrt(1 - BETA2 ** tf) / (1 - BETA1 ** tf)
    params = jax.tree_util.tree_map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + EPS), state["params"], m, v)
    return loss, {"params": params, "m": m, "v": v, "t": t}


def initial_state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    params = {k: (np.ones(s, np.float32) if k.endswith("_g") else
                  np.zeros(s, np.float32) if k.endswith("_b") else
                  (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)) for k, s in SHAPES.items()}
    zeros = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    return {"params": params, "m": zeros, "v": dict(zeros), "t": np.int32(0)}


def make_batch(seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((B, T, D)).astype(jnp.bfloat16)
    y = (0.5 * rng.standard_normal((B, T, D))).astype(jnp.bfloat16)
    return x, y


def train_step(warmup: int = 0, seed: int = 0):
    """(step, state, batch): the jitted step, the training state after `warmup` steps (run by jax on the same
    batch; 0: the first step's state, moments zero), and the batch. All numpy / ml_dtypes arrays."""
    step = jax.jit(_step, keep_unused=True)
    state, batch = initial_state(seed), make_batch(seed)
    for _ in range(warmup):
        state = jax.tree_util.tree_map(np.asarray, step(state, batch)[1])
    return step, state, batch
