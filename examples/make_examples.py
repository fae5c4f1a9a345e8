#!/usr/bin/env python
"""Regenerate the example HLO programs in examples/ (needs jax; run by developers).

    python examples/make_examples.py            # all examples
    python examples/make_examples.py mlp adam   # a subset

For each example <name> it writes:

    <name>.pre.hlo       jax.jit(f).lower(*args).as_text(dialect="hlo")   (pre-optimization)
    <name>.opt.hlo       jax.jit(f).lower(*args).compile().as_text()      (XLA:CPU post-optimization)
    <name>.inputs.npz    arg0..argN in entry-parameter order (pytree leaves, keep_unused=True)
    <name>.expected.npz  out0..outM: XLA:CPU's outputs for those inputs (flattened tuple order)

npz files are written with hloexec.tools.xla_cpu.save_arrays: bf16/fp8 arrays are
stored as raw uint bytes with their dtype name in the extra key "__dtypes__";
read them with hloexec.tools.xla_cpu.load_arrays.
"""
from __future__ import annotations

import functools
import os
import sys

os.environ.setdefault("JAX_ENABLE_X64", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# load the harness by path: only needs numpy/ml_dtypes, not the rest of hloexec
def _load_harness():
    import importlib.util

    path = os.path.join(os.path.dirname(HERE), "hloexec", "tools", "xla_cpu.py")
    spec = importlib.util.spec_from_file_location("_hloexec_xla_cpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


save_arrays = _load_harness().save_arrays

jax.config.update("jax_enable_x64", True)


def _rng(seed):
    return np.random.default_rng(seed)


def _f32(r, *shape, scale=1.0):
    return (r.standard_normal(shape) * scale).astype(np.float32)


# --------------------------------------------------------------------- mlp
def ex_mlp():
    """2-layer MLP forward (f32): relu(x@w1+b1)@w2+b2."""

    def f(x, w1, b1, w2, b2):
        h = jnp.maximum(x @ w1 + b1, 0.0)
        return h @ w2 + b2

    r = _rng(1)
    args = (_f32(r, 8, 16), _f32(r, 16, 32, scale=0.25), _f32(r, 32, scale=0.1),
            _f32(r, 32, 10, scale=0.2), _f32(r, 10, scale=0.1))
    return f, args


# --------------------------------------------------------------------- adam
def adam(p, g, m, v, step, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    g = g.astype(jnp.float32)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    t = step.astype(jnp.float32)
    mhat = m / (1 - b1 ** t)
    vhat = v / (1 - b2 ** t)
    return p - lr * mhat / (jnp.sqrt(vhat) + eps), m, v


def ex_adam():
    """Adam update: f32 master weights / moments, f16 grads, s32 step."""

    def f(w, b, gw, gb, mw, mb, vw, vb, step):
        w2, mw2, vw2 = adam(w, gw, mw, vw, step)
        b2, mb2, vb2 = adam(b, gb, mb, vb, step)
        return w2, b2, mw2, mb2, vw2, vb2

    r = _rng(2)
    w, b = _f32(r, 64, 32), _f32(r, 32)
    gw, gb = _f32(r, 64, 32, scale=0.1).astype(np.float16), _f32(r, 32, scale=0.1).astype(np.float16)
    mw, mb = _f32(r, 64, 32, scale=0.01), _f32(r, 32, scale=0.01)
    vw, vb = np.abs(_f32(r, 64, 32, scale=1e-3)), np.abs(_f32(r, 32, scale=1e-3))
    return f, (w, b, gw, gb, mw, mb, vw, vb, np.int32(7))


# ------------------------------------------------------------ layernorm bwd
def layernorm(x, g, b, eps=1e-5):
    xf = x.astype(jnp.float32)
    mu = xf.mean(-1, keepdims=True)
    var = ((xf - mu) ** 2).mean(-1, keepdims=True)
    y = (xf - mu) * lax.rsqrt(var + eps)
    return (y * g.astype(jnp.float32) + b.astype(jnp.float32)).astype(x.dtype)


def layernorm_bwd_fn():
    def loss(x, g, b, dy):
        return jnp.sum(layernorm(x, g, b).astype(jnp.float32) * dy.astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1, 2))


def ex_layernorm_bwd():
    """LayerNorm backward (f32) via jax.grad wrt x, gamma, beta."""
    r = _rng(3)
    args = (_f32(r, 16, 48), 1 + _f32(r, 48, scale=0.1), _f32(r, 48, scale=0.1), _f32(r, 16, 48))
    return layernorm_bwd_fn(), args


def ex_layernorm_bwd_bf16():
    """LayerNorm backward, bf16 inputs/outputs (f32 statistics inside)."""
    r = _rng(4)
    bf = ml_dtypes.bfloat16
    args = (_f32(r, 16, 48).astype(bf), (1 + _f32(r, 48, scale=0.1)).astype(bf),
            _f32(r, 48, scale=0.1).astype(bf), _f32(r, 16, 48).astype(bf))
    return layernorm_bwd_fn(), args


# ----------------------------------------------------------------- gpt step
# 1 layer: with 2 layers the post-optimization text is ~620 KB (~400 KB without
# metadata), over the 200 KB per-module budget.
GPT = dict(vocab=64, d=32, heads=2, seq=16, batch=2, layers=1, ff=128)


def _gpt_init(r, config):
    d, ff = config["d"], config["ff"]
    p = {"wte": _f32(r, config["vocab"], d, scale=0.02), "wpe": _f32(r, config["seq"], d, scale=0.01),
         "lnf_g": np.ones(d, np.float32), "lnf_b": np.zeros(d, np.float32)}
    for i in range(config["layers"]):
        p[f"h{i}"] = {
            "ln1_g": np.ones(d, np.float32), "ln1_b": np.zeros(d, np.float32),
            "qkv": _f32(r, d, 3 * d, scale=0.02), "qkv_b": np.zeros(3 * d, np.float32),
            "proj": _f32(r, d, d, scale=0.02), "proj_b": np.zeros(d, np.float32),
            "ln2_g": np.ones(d, np.float32), "ln2_b": np.zeros(d, np.float32),
            "fc": _f32(r, d, ff, scale=0.02), "fc_b": np.zeros(ff, np.float32),
            "fc2": _f32(r, ff, d, scale=0.02), "fc2_b": np.zeros(d, np.float32),
        }
    return p


def _gpt_loss(p, tokens, targets, config, matmul_dtype):
    def mm(a, b):
        if matmul_dtype is None:
            return a @ b
        return jnp.matmul(a.astype(matmul_dtype), b.astype(matmul_dtype), preferred_element_type=jnp.float32)

    B, T, D, H = tokens.shape[0], tokens.shape[1], config["d"], config["heads"]
    x = p["wte"][tokens] + p["wpe"][None, :T]
    mask = jnp.tril(jnp.ones((T, T), bool))
    for i in range(config["layers"]):
        h = p[f"h{i}"]
        a = layernorm(x, h["ln1_g"], h["ln1_b"])
        qkv = mm(a, h["qkv"]) + h["qkv_b"]
        q, k, v = jnp.split(qkv, 3, axis=-1)
        q, k, v = (t.reshape(B, T, H, D // H).transpose(0, 2, 1, 3) for t in (q, k, v))
        s = mm(q, k.transpose(0, 1, 3, 2)) / np.sqrt(D // H).astype(np.float32)
        s = jnp.where(mask, s, -1e9)
        att = jax.nn.softmax(s, axis=-1)
        o = mm(att, v).transpose(0, 2, 1, 3).reshape(B, T, D)
        x = x + mm(o, h["proj"]) + h["proj_b"]
        m = layernorm(x, h["ln2_g"], h["ln2_b"])
        m = jax.nn.gelu(mm(m, h["fc"]) + h["fc_b"], approximate=True)
        x = x + mm(m, h["fc2"]) + h["fc2_b"]
    x = layernorm(x, p["lnf_g"], p["lnf_b"])
    logits = mm(x, p["wte"].T)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return nll.mean()


# bench/workloads.py makes its larger GPT workloads here too, with its own `config` and a `matmul_dtype`
# (the matmuls' operand type, accumulating in f32; None: `@` on the f32 values, as the example).
def ex_gpt_step(config=GPT, matmul_dtype=None):
    """Tiny GPT train step: embed, 1x(attn+softmax+GELU MLP+LN), xent, grad, Adam."""
    loss_fn = functools.partial(_gpt_loss, config=config, matmul_dtype=matmul_dtype)

    def step_fn(params, m, v, tokens, targets, step):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        flat = jax.tree_util.tree_map(lambda p_, g, m_, v_: adam(p_, g, m_, v_, step),
                                      params, grads, m, v)
        treedef = jax.tree_util.tree_structure(params)
        leaves = jax.tree_util.tree_leaves(flat, is_leaf=lambda t: isinstance(t, tuple))
        new_p = jax.tree_util.tree_unflatten(treedef, [t[0] for t in leaves])
        new_m = jax.tree_util.tree_unflatten(treedef, [t[1] for t in leaves])
        new_v = jax.tree_util.tree_unflatten(treedef, [t[2] for t in leaves])
        return loss, new_p, new_m, new_v

    r = _rng(5)
    p = _gpt_init(r, config)
    zeros = jax.tree_util.tree_map(lambda a: np.zeros_like(a), p)
    tokens = r.integers(0, config["vocab"], (config["batch"], config["seq"])).astype(np.int32)
    targets = np.roll(tokens, -1, axis=1)
    return step_fn, (p, zeros, zeros, tokens, targets, np.int32(1))


# ---------------------------------------------------------------------- conv
def ex_conv():
    """conv2d NHWC/HWIO forward + grads wrt input and kernel (loss = sum(y^2)/2)."""

    def f(x, w):
        def fwd(x, w):
            return lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

        def loss(x, w):
            return 0.5 * jnp.sum(fwd(x, w) ** 2)

        gx, gw = jax.grad(loss, argnums=(0, 1))(x, w)
        return fwd(x, w), gx, gw

    r = _rng(6)
    return f, (_f32(r, 2, 8, 8, 3), _f32(r, 3, 3, 3, 4, scale=0.3))


# ----------------------------------------------------------------- scan loop
def ex_scan_loop():
    """lax.scan RNN over 12 steps + fori_loop power iteration (both -> while)."""

    def f(h0, xs, w, u, a):
        def cell(h, x):
            h = jnp.tanh(h @ w + x @ u)
            return h, h.sum(-1)

        h, ys = lax.scan(cell, h0, xs)

        def body(i, vec):
            vec = a @ vec
            return vec / jnp.linalg.norm(vec)

        vec = lax.fori_loop(0, 20, body, jnp.ones(a.shape[0], a.dtype))
        return h, ys, vec

    r = _rng(7)
    a = _f32(r, 8, 8)
    return f, (_f32(r, 4, 16), _f32(r, 12, 4, 8), _f32(r, 16, 16, scale=0.25),
               _f32(r, 8, 16, scale=0.3), (a @ a.T).astype(np.float32))


# ----------------------------------------------------------------- sort/topk
def ex_sort_topk():
    """argsort (stable), sort of s32 keys, lax.top_k along the last axis."""

    def f(x, k):
        idx = jnp.argsort(x, axis=-1, stable=True)
        vals, ti = lax.top_k(x, 5)
        return idx, jnp.sort(k, axis=0), vals, ti

    r = _rng(8)
    x = _f32(r, 6, 32)
    x[0, :4] = x[0, 4]  # ties
    return f, (x, r.integers(-100, 100, (20, 3)).astype(np.int32))


# ------------------------------------------------------------ gather/scatter
def ex_gather_scatter():
    """take_along_axis gather, x.at[idx].add scatter (with duplicates), row take."""

    def f(x, idx, rows, upd):
        g = jnp.take_along_axis(x, idx, axis=1)
        s = x.at[rows].add(upd)
        t = jnp.take(x, rows, axis=0)
        return g, s, t

    r = _rng(9)
    x = _f32(r, 10, 12)
    idx = r.integers(0, 12, (10, 5)).astype(np.int32)
    rows = np.array([0, 3, 3, 9, 1, 3], np.int32)  # duplicates
    return f, (x, idx, rows, _f32(r, 6, 12))


EXAMPLES = {
    "mlp": ex_mlp,
    "adam": ex_adam,
    "layernorm_bwd": ex_layernorm_bwd,
    "layernorm_bwd_bf16": ex_layernorm_bwd_bf16,
    "gpt_step": ex_gpt_step,
    "conv": ex_conv,
    "scan_loop": ex_scan_loop,
    "sort_topk": ex_sort_topk,
    "gather_scatter": ex_gather_scatter,
}


MAX_MODULE_BYTES = 200_000


def make(name, outdir=HERE):
    f, args = EXAMPLES[name]()
    jf = jax.jit(f, keep_unused=True)
    lowered = jf.lower(*args)
    compiled = lowered.compile()
    pre = lowered.as_text(dialect="hlo")
    opt = compiled.as_text()
    if len(opt) > MAX_MODULE_BYTES:
        # same module printed without metadata={...} (semantics unchanged)
        from jax._src.lib import xla_client as xc

        po = xc.hlo.HloPrintOptions()
        po.print_metadata = False
        opt = compiled.runtime_executable().hlo_modules()[0].to_string(po)
        print(f"  {name}: .opt.hlo printed without metadata ({len(opt)} B)")
    if len(opt) > MAX_MODULE_BYTES or len(pre) > MAX_MODULE_BYTES:
        print(f"  WARNING {name}: module over {MAX_MODULE_BYTES} B")
    leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
    outs = [np.asarray(o) for o in jax.tree_util.tree_leaves(compiled(*args))]
    for suffix, text in (("pre.hlo", pre), ("opt.hlo", opt)):
        with open(os.path.join(outdir, f"{name}.{suffix}"), "w") as fh:
            fh.write(text)
    save_arrays(os.path.join(outdir, f"{name}.inputs.npz"), {f"arg{i}": a for i, a in enumerate(leaves)},
                compress=True)
    save_arrays(os.path.join(outdir, f"{name}.expected.npz"), {f"out{i}": a for i, a in enumerate(outs)},
                compress=True)
    doc = (EXAMPLES[name].__doc__ or "").strip()
    print(f"{name:20s} params={len(leaves):3d} outs={len(outs):3d} pre={len(pre):7d}B opt={len(opt):7d}B  {doc}")
    return doc


def main(argv):
    names = argv or list(EXAMPLES)
    import jaxlib

    print(f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, numpy {np.__version__}")
    for n in names:
        make(n)


if __name__ == "__main__":
    main(sys.argv[1:])
