"""Execution-bench workloads: HLO text + inputs, generated with jax (or read from ../shared).

Each workload is written once to `<work dir>/<name>/` as `module.hlo` (or `module_<k>.hlo` for a set of
modules) and `inputs.npz` / `inputs_<k>.npz` (hloexec.tools.xla_cpu.save_arrays, so bf16 survives); the
bench's child processes read those files, so hloexec and XLA:CPU see the same text and inputs.

Large workloads shrink with HLOEXEC_BENCH_SCALE (default 1.0: the sizes of issue 6): the Adam parameter
count and the LayerNorm batch scale linearly with it.
"""
from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("HLOEXEC_SHARED") or ROOT.parent / "shared")
CORPUS = SHARED / "corpus" / "xla"
SEEDS = SHARED / "seeds"

# XLA's CPU benchmark modules hloexec is measured on: the ones XLA:CPU runs (STATUS.tsv) and that fit
# the machine; the huge_hlo ones and gemma2 (10 GB of inputs) are left out.
XLA_CPU_BENCHMARKS = [
    "layer_norm_1x4096x768_bf16", "mean_axis_1x4096x1024_bf16", "sum_axis_1x4096x1024_bf16",
    "mha_block_1x12x128x64_bf16", "depthwise_conv_3x3_1x256x56x56_bf16", "argsort_axis_1024x512_bf16",
    "sort_full_1024x4096_bf16", "bench_scan_N2000_M3", "dynamic_slice_loop_1x2048x768_bf16",
    "in_place_dynamic_update_slice_fusion", "graphsage_tf", "dlrm_keras_jax_f32_test_step",
    "dlrm_keras_jax_f32_train_step", "jax.b380442861", "bench_mass_matrix_35", "diffrax.b380012920",
    "resnet50_keras_jax_f32", "xnn.parallel_dots.optimized", "xnn.sequential_dots.optimized",
    "gemma3_1b_flax_call",
]


def scale() -> float:
    return float(os.environ.get("HLOEXEC_BENCH_SCALE", "1.0"))


def work_dir() -> Path:
    d = os.environ.get("HLOEXEC_BENCH_DIR")
    return Path(d) if d else Path.home() / ".cache" / "hloexec" / "bench"


@dataclass
class Workload:
    name: str
    kind: str                        # "large" | "small" | "many" | "seed" | "xla-bench"
    files: Callable[[], tuple[list[Path], list[Path | None]]]
    # -> (HLO files, one npz of inputs per file or None: hloexec's seeded random inputs, made by each child)
    flops: float = 0.0               # dot flops of one run (GFLOP/s column)
    bytes_moved: float = 0.0         # compulsory bytes of one run: inputs read + outputs written (GB/s column)
    notes: str = ""
    # XLA:CPU cannot re-ingest its own post-optimization text (layouts, custom calls): for an .opt workload
    # XLA runs the pre-optimization module it was compiled from -- the same program, compiled from source.
    xla_files: Callable[[], tuple[list[Path], list[Path | None]]] | None = None


# ----------------------------------------------------------------------------------------- jax side
def _jax():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    return jax


def _write(dirpath: Path, fn, args, *, optimized: bool, stem: str = "module"):
    """Lower `fn(*args)` with jax; write the pre- or post-optimization HLO and the flattened inputs."""
    jax = _jax()
    from hloexec.tools.xla_cpu import save_arrays
    lowered = jax.jit(fn, keep_unused=True).lower(*args)
    text = lowered.compile().as_text() if optimized else lowered.as_text(dialect="hlo")
    dirpath.mkdir(parents=True, exist_ok=True)
    (dirpath / f"{stem}.hlo").write_text(text)
    leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
    save_arrays(str(dirpath / f"inputs{stem[len('module'):]}.npz"), {f"arg{i}": a for i, a in enumerate(leaves)})


@functools.cache
def _examples():
    """examples/make_examples.py as a module, loaded as tests/test_programs.py does: the GPT step, Adam and
    LayerNorm are defined there. It turns jax's x64 mode on for the examples; the workloads are traced
    without it (s32 iotas, f32 constants), so the setting is put back."""
    jax = _jax()
    x64, x64_env = jax.config.jax_enable_x64, os.environ.get("JAX_ENABLE_X64")
    spec = importlib.util.spec_from_file_location("make_examples", ROOT / "examples" / "make_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    jax.config.update("jax_enable_x64", x64)
    if x64_env is None:
        os.environ.pop("JAX_ENABLE_X64", None)
    return module


GPT = dict(vocab=512, d=256, heads=4, seq=128, batch=4, layers=2, ff=1024)


def _gpt_step(matmul_dtype):
    """A GPT train step (embed, attention + softmax, GELU MLP, LayerNorm, cross-entropy, grad, Adam)."""
    return _examples().ex_gpt_step(GPT, matmul_dtype)


def _gpt_flops() -> float:
    """Matmul flops of one train step: 3x the forward (forward + two backward products)."""
    c = GPT
    bt, d, ff, t = c["batch"] * c["seq"], c["d"], c["ff"], c["seq"]
    per_layer = 2 * bt * d * (3 * d + d + 2 * ff) + 2 * 2 * c["batch"] * t * t * d
    return 3.0 * (c["layers"] * per_layer + 2 * bt * d * c["vocab"])


def _adam_step(n_params: int):
    """Adam over `n_params` f32 parameters in 8 tensors (f32 master weights and moments, f16 grads)."""
    r = np.random.default_rng(2)
    sizes = [n_params // 8] * 8
    adam = _examples().adam

    def f(ps, gs, ms, vs, step):
        return [adam(p, g, m, v, step) for p, g, m, v in zip(ps, gs, ms, vs)]

    ps = [r.standard_normal(n, dtype=np.float32) for n in sizes]
    gs = [(r.standard_normal(n, dtype=np.float32) * 0.1).astype(np.float16) for n in sizes]
    ms = [np.zeros(n, np.float32) for n in sizes]
    vs = [np.zeros(n, np.float32) for n in sizes]
    return f, (ps, gs, ms, vs, np.int32(3)), sum(sizes)


MIXED_ADAM_ROWS = 4096      # gradient shapes [rows, 1024] x 2, [1024, 1024], [rows], [1024]: 9.45 M at scale 1


def _mixed_adam_step(rows: int):
    """A mixed-precision Adam step: f16 gradients of a loss scaled by `scale`, f32 master weights and
    moments. The gradients are unscaled in f32; if any f16 gradient is not finite (the all-finite check
    that XLA:CPU turns into reduce-windows over pred) the step is skipped (weights, moments and step count
    kept) and the scale halved, else the update applies and the scale grows by 2 every 4 good steps."""
    import jax.numpy as jnp
    adam = _examples().adam
    shapes = [(rows, 1024), (rows, 1024), (1024, 1024), (rows,), (1024,)]

    def f(ps, gs, ms, vs, step, scale, good_steps):
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in gs]))
        new_p, new_m, new_v = [], [], []
        for p, g, m, v in zip(ps, gs, ms, vs):
            p2, m2, v2 = adam(p, g.astype(jnp.float32) / scale, m, v, step + 1)
            new_p.append(jnp.where(finite, p2, p))
            new_m.append(jnp.where(finite, m2, m))
            new_v.append(jnp.where(finite, v2, v))
        grow = finite & (good_steps + 1 >= 4)
        new_scale = jnp.where(finite, jnp.where(grow, scale * 2, scale), scale / 2)
        new_good = jnp.where(finite & ~grow, good_steps + 1, 0)
        return new_p, new_m, new_v, step + finite.astype(step.dtype), new_scale, new_good

    r = np.random.default_rng(4)
    ps = [r.standard_normal(s, dtype=np.float32) * 0.05 for s in shapes]
    gs = [(r.standard_normal(s, dtype=np.float32) * 0.1 * 1024).astype(np.float16) for s in shapes]
    ms = [np.zeros(s, np.float32) for s in shapes]
    vs = [np.zeros(s, np.float32) for s in shapes]
    n = sum(int(np.prod(s)) for s in shapes)
    return f, (ps, gs, ms, vs, np.int32(3), np.float32(1024), np.int32(1)), n


LAYERNORM_TYPES = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16), "f32": np.dtype(np.float32)}


def _layernorm_bwd(batch: int, dtype):
    r = np.random.default_rng(3)
    shape = (batch, 2048, 4096)
    x = r.standard_normal(shape, dtype=np.float32).astype(dtype)
    dy = r.standard_normal(shape, dtype=np.float32).astype(dtype)
    g = (1 + 0.1 * r.standard_normal(4096, dtype=np.float32)).astype(dtype)
    b = (0.1 * r.standard_normal(4096, dtype=np.float32)).astype(dtype)
    return _examples().layernorm_bwd_fn(), (x, g, b, dy)


def _one_op_functions():
    """(name, fn, args) for the many-small-modules workload: 20 ops x 10 shapes = 200 one-op modules."""
    import jax.numpy as jnp
    from jax import lax
    ops = [
        ("add", lambda x, y: x + y, 2), ("multiply", lambda x, y: x * y, 2), ("subtract", lambda x, y: x - y, 2),
        ("divide", lambda x, y: x / (jnp.abs(y) + 1), 2), ("maximum", jnp.maximum, 2),
        ("exp", jnp.exp, 1), ("tanh", jnp.tanh, 1), ("log", lambda x: jnp.log(jnp.abs(x) + 1), 1),
        ("negate", lambda x: -x, 1), ("sqrt", lambda x: jnp.sqrt(jnp.abs(x)), 1),
        ("reduce_sum", lambda x: x.sum(-1), 1), ("reduce_max", lambda x: x.max(0), 1),
        ("transpose", lambda x: x.T, 1), ("reshape", lambda x: x.reshape(-1), 1),
        ("broadcast", lambda x: jnp.broadcast_to(x[None], (4,) + x.shape), 1),
        ("slice", lambda x: x[1:, ::2], 1), ("concatenate", lambda x, y: jnp.concatenate([x, y], 0), 2),
        ("dot", lambda x, y: x @ y.T, 2), ("convert", lambda x: x.astype(jnp.float16), 1),
        ("compare_select", lambda x, y: lax.select(x > y, x, y), 2),
    ]
    r = np.random.default_rng(7)
    for k in range(10):
        shape = (2 + 3 * k, 8 + 5 * k)
        for name, fn, arity in ops:
            args = tuple(r.standard_normal(shape, dtype=np.float32) for _ in range(arity))
            yield f"{name}_{k}", fn, args


# --------------------------------------------------------------------------------------- the list
def _generated(name: str, make) -> Path:
    """Directory of a generated workload, made on first use (keyed by name, so scaled ones differ)."""
    d = work_dir() / name
    if not (d / "done").exists():
        make(d)
        (d / "done").write_text("1")
    return d


def _one(name: str, make):
    def files():
        d = _generated(name, make)
        return [d / "module.hlo"], [d / "inputs.npz"]
    return files


def _many(name: str, make):
    def files():
        d = _generated(name, make)
        mods = sorted(d.glob("module_*.hlo"))
        return mods, [d / f"inputs_{m.stem[len('module_'):]}.npz" for m in mods]
    return files


def _shared(path: Path):
    return lambda: ([path], [None])


def workloads() -> list[Workload]:
    s = scale()
    out = []
    for dt_name in ("f32", "bf16"):
        for stage in ("pre", "opt"):
            name = f"gpt_step_d{GPT['d']}_{dt_name}_{stage}"

            def make(d, dt_name=dt_name, stage=stage):
                import jax.numpy as jnp
                fn, args = _gpt_step(jnp.float32 if dt_name == "f32" else jnp.bfloat16)
                _write(d, fn, args, optimized=stage == "opt")
            pre = out[-1].files if stage == "opt" else None
            out.append(Workload(name, "large", _one(name, make), flops=_gpt_flops(), xla_files=pre))

    n_adam = int(100_000_000 * s) // 8 * 8
    name = f"adam_{n_adam // 1_000_000}M"

    def make_adam(d):
        fn, args, _ = _adam_step(n_adam)
        _write(d, fn, args, optimized=False)
    # read p, g(f16), m, v; write p, m, v
    out.append(Workload(name, "large", _one(name, make_adam), bytes_moved=n_adam * (4 * 3 + 2 + 4 * 3)))

    rows = max(32, round(MIXED_ADAM_ROWS * s) // 32 * 32)
    n_mixed = 2 * rows * 1024 + 1024 * 1024 + rows + 1024
    for stage in ("pre", "opt"):
        name = f"adam_mixed_{n_mixed / 1e6:.1f}M_{stage}"

        def make_mixed(d, stage=stage):
            fn, args, _ = _mixed_adam_step(rows)
            _write(d, fn, args, optimized=stage == "opt")
        pre = out[-1].files if stage == "opt" else None
        # read p, g (f16), m, v; write p, m, v
        out.append(Workload(name, "large", _one(name, make_mixed), bytes_moved=n_mixed * (4 * 3 + 2 + 4 * 3),
                            xla_files=pre))

    batch = max(1, round(8 * s))
    n = batch * 2048 * 4096
    for dt_name, dtype in LAYERNORM_TYPES.items():
        name = f"layernorm_bwd_{batch}x2048x4096_{dt_name}"

        def make_ln(d, dtype=dtype):
            fn, args = _layernorm_bwd(batch, dtype)
            _write(d, fn, args, optimized=False)
        # read x, dy; write dx; gamma/beta tiny
        out.append(Workload(name, "large", _one(name, make_ln), bytes_moved=n * dtype.itemsize * 3))

    def make_many(d):
        for k, (_, fn, args) in enumerate(_one_op_functions()):
            _write(d, fn, args, optimized=False, stem=f"module_{k:03d}")
    out.append(Workload("one_op_x200", "many", _many("one_op_x200", make_many)))

    examples = ROOT / "examples"
    for ex in ("gpt_step", "adam", "layernorm_bwd"):
        def files(stage, ex=ex):
            return lambda: ([examples / f"{ex}.{stage}.hlo"], [examples / f"{ex}.inputs.npz"])
        if (examples / f"{ex}.opt.hlo").exists():
            out.append(Workload(f"small:{ex}.opt", "small", files("opt"), xla_files=files("pre")))

    for bench in XLA_CPU_BENCHMARKS:
        path = CORPUS / f"xla__backends__cpu__benchmarks__hlo__{bench}.hlo"
        if path.exists():
            out.append(Workload(f"xla:{bench}", "xla-bench", _shared(path)))

    llama = SEEDS / "llama_train_step_pipeshard_mesh1.hlo"
    if llama.exists():
        out.append(Workload("seed:llama_pipeshard_stage", "seed", _shared(llama)))
    gpt16 = SEEDS / "gpt_train_step_shard_parallel_16dev.hlo"
    if gpt16.exists():
        out.append(Workload("seed:gpt_16dev_participant0", "seed", _shared(gpt16),
                            notes="one participant, collectives mirrored"))
    return out


def by_name() -> dict[str, Workload]:
    return {w.name: w for w in workloads()}

