"""XLA dump directories made by jax in a child process (XLA reads XLA_FLAGS once per process), for the tests of
dump directories, diff, bisect, extract and minimize (tests/test_localize.py).

Each program is a small jax script; `make_dump(directory, program, *flags)` runs it with
`--xla_dump_to=directory` and the given dump flags, CPU only. The scripts also save the inputs they ran with
(`inputs.npz`, keys arg0..) where a test needs them.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

PRELUDE = """
import numpy as np, jax, jax.numpy as jnp
from hloexec.tools.xla_cpu import save_arrays
"""

PROGRAMS = {
    # issue 13's example: jax.grad of sum(layernorm(x)**2), f16; XLA:CPU splits its f16 reductions
    "layernorm_grad_f16": """
def layernorm(x, g, b):
    m = jnp.mean(x, axis=-1, keepdims=True)
    v = jnp.mean((x - m) ** 2, axis=-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-5) * g + b

def loss(x, g, b):
    return jnp.sum(layernorm(x, g, b) ** 2)

rng = np.random.default_rng(0)
x = rng.standard_normal((8, 128, 256)).astype(np.float16)
g = (1 + 0.1 * rng.standard_normal(256)).astype(np.float16)
b = (0.1 * rng.standard_normal(256)).astype(np.float16)
jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, g, b)
""",
    # the gradient of a broadcast add is an f16 reduce of 1024 rows: only tree_reduction_rewriter changes values
    "row_sum_grad_f16": """
def loss(b, x):
    return jnp.sum(jnp.cos(x + b).astype(jnp.float32))

x = np.random.default_rng(0).standard_normal((1024, 256)).astype(np.float16)
b = np.zeros(256, np.float16)
jax.jit(jax.grad(loss))(b, x)
""",
    # an f32 MLP step: its snapshot holds real inputs and XLA:CPU's result
    "mlp_f32": """
def f(x, w1, w2):
    return jnp.tanh(jnp.tanh(x @ w1) @ w2)

rng = np.random.default_rng(0)
args = [rng.standard_normal(s).astype(np.float32) for s in ((16, 32), (32, 32), (32, 8))]
save_arrays("inputs.npz", {f"arg{i}": a for i, a in enumerate(args)})
jax.jit(f)(*args)
""",
    # a 64-element constant: text dumps elide it as {...}, the .hlo.pb twin has it
    "arange_f32": """
jax.jit(lambda x: x * np.arange(64, dtype=np.float32) + np.float32(1))(np.ones(64, np.float32))
""",
    # a one-layer GPT train step in bf16 (embedding, attention, MLP, layernorm, cross-entropy, SGD)
    "gpt_step_bf16": """
V, D, T, B, H = 128, 64, 16, 2, 4

def layernorm(x, g):
    m = x.mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * g

def model(p, tokens):
    x = p["emb"][tokens] + p["pos"]
    h = layernorm(x, p["g1"])
    q, k, v = [(h @ p[n]).reshape(B, T, H, D // H) for n in ("wq", "wk", "wv")]
    att = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(D // H)
    att = jnp.where(jnp.tril(jnp.ones((T, T), bool)), att, -1e4)
    out = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(att, -1), v).reshape(B, T, D)
    x = x + out @ p["wo"]
    x = x + jax.nn.gelu(layernorm(x, p["g2"]) @ p["w1"]) @ p["w2"]
    return layernorm(x, p["g3"]) @ p["emb"].T

def loss(p, tokens, targets):
    logits = model(p, tokens).astype(jnp.float32)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1))

def step(p, tokens, targets):
    g = jax.grad(loss)(p, tokens, targets)
    return jax.tree_util.tree_map(lambda w, d: w - jnp.asarray(0.1, w.dtype) * d, p, g)

rng = np.random.default_rng(0)
shapes = {"emb": (V, D), "pos": (T, D), "wq": (D, D), "wk": (D, D), "wv": (D, D), "wo": (D, D),
          "w1": (D, 4 * D), "w2": (4 * D, D), "g1": (D,), "g2": (D,), "g3": (D,)}
p = {k: jnp.asarray((1.0 if k[0] == "g" else 0.05) * (rng.standard_normal(s) if k[0] != "g" else np.ones(s)),
                    jnp.bfloat16) for k, s in shapes.items()}
tokens = rng.integers(0, V, (B, T)).astype(np.int32)
jax.jit(step)(p, tokens, np.roll(tokens, -1, 1))
""",
}

PASSES = "--xla_dump_hlo_pass_re=.*"
SNAPSHOTS = "--xla_dump_hlo_snapshots"
TEXT = "--xla_dump_hlo_as_text"
PROTO = "--xla_dump_hlo_as_proto"


def make_dump(directory, program: str, *flags: str) -> None:
    """Run PROGRAMS[program] in a child process with XLA dumping into `directory` (its working directory)."""
    directory = os.path.abspath(directory)       # the child runs in it: a relative path would dump into itself
    os.makedirs(directory, exist_ok=True)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=" ".join([f"--xla_dump_to={directory}", *flags]))
    code = PRELUDE + textwrap.dedent(PROGRAMS[program])
    done = subprocess.run([sys.executable, "-c", code], cwd=directory, env=env, capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"dumping {program} failed:\n{done.stderr[-3000:]}")


if __name__ == "__main__":     # python tests/xla_dumps.py PROGRAM DIR [XLA dump flags...]   (README examples)
    make_dump(sys.argv[2], sys.argv[1], *(sys.argv[3:] or [TEXT, PASSES]))
