"""The programs users validate, end to end against XLA:CPU.

* The bundled examples (examples/<name>.{pre,opt}.hlo against <name>.expected.npz; no jax needed).
* Adam (f32 master weights, f16 grads), LayerNorm backward (f32, f16, bf16) and a GPT-style train step,
  built by examples/make_examples.py's own functions, generated with jax here on fresh inputs, run
  pre- and post-optimization, Numba on and off, matched against jax's outputs.
* `excess_precision=True` runs: reported (max |diff| / ULP), checked only loosely, since skipping the
  per-op f16 / bf16 rounding is meant to differ from XLA.

Tolerances: integer outputs exact; f16 / bf16 outputs within 1 ULP of the type (a differently ordered
f32 sum inside can flip one rounding); f32 outputs within rtol 2e-5 of the value or 2e-6 of the
output's scale (a few f32 ULP through dots, reductions, and XLA:CPU's exp / log / tanh approximations).
"""
from __future__ import annotations

import functools
import importlib.util

import numpy as np
import pytest

import hloexec
import hloexec.exec.tiering as tiering
from conftest import EXAMPLES
from hloexec.tools.xla_cpu import load_arrays
from xla_compare import BF16, flatten, flush_denormals, is_float, max_ulp

EXAMPLE_NAMES = sorted(p.name[:-len(".pre.hlo")] for p in EXAMPLES.glob("*.pre.hlo"))
F32_RTOL, F32_ATOL_SCALE = 2e-5, 2e-6
# gpt_step's Adam update at step 1 is ~lr * g / (|g| + eps): for gradients near eps (1e-8) a few-ULP
# difference in g moves the update by a sizeable fraction of lr, so its outputs get 5e-3 of their scale.
ATOL_SCALE = {"gpt_step": 5e-3}
HALF_ULPS = 1


def assert_program_close(got, want, what, atol_scale=F32_ATOL_SCALE):
    """Integers exact, f16 / bf16 within HALF_ULPS, f32 / f64 within rtol / a fraction of the output scale."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    if not is_float(got.dtype):
        assert np.array_equal(got, want), f"{what}: integer outputs differ"
        return
    if got.dtype in (np.float16, BF16):
        worst = max_ulp(got, want)
        assert worst <= HALF_ULPS, f"{what}: {worst:g} ULP from XLA:CPU"
        return
    g, w = flush_denormals(got).astype(np.float64), want.astype(np.float64)
    scale = np.abs(w).max(initial=0.0)
    ok = (np.abs(g - w) <= F32_RTOL * np.abs(w) + atol_scale * scale) | (np.isnan(g) & np.isnan(w))
    assert ok.all(), (f"{what}: {(~ok).sum()} of {g.size} elements off; max |diff| "
                      f"{np.nanmax(np.abs(g - w)):.3g} (output scale {scale:.3g})")


def check_all(outs, wants, label, name):
    outs = flatten(outs)
    assert len(outs) == len(wants), f"{label}: {len(outs)} outputs, want {len(wants)}"
    for k, (g, w) in enumerate(zip(outs, wants)):
        assert_program_close(g, w, f"{label} out{k}", ATOL_SCALE.get(name, F32_ATOL_SCALE))


# -- the bundled examples (no jax) -------------------------------------------------------------------
@functools.cache
def example_arrays(name):
    return (list(load_arrays(str(EXAMPLES / f"{name}.inputs.npz")).values()),
            list(load_arrays(str(EXAMPLES / f"{name}.expected.npz")).values()))


# pre-fused: the pre-optimization module with every producer/consumer group compiled (exec/fuse.py),
# however small (the examples are below the size where grouping pays).
KINDS = pytest.mark.parametrize("kind,numba", [("pre", False), ("pre", True), ("opt", True), ("opt", False)],
                                ids=["pre", "pre-fused", "opt-numba", "opt-numpy"])


def compile_every_group(monkeypatch, kind, numba):
    if kind == "pre" and numba:
        monkeypatch.setattr(tiering, "MIN_COMPILED_BYTES", 0)


@KINDS
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_matches_expected(name, kind, numba, monkeypatch):
    compile_every_group(monkeypatch, kind, numba)
    inputs, expected = example_arrays(name)
    exe = hloexec.load(EXAMPLES / f"{name}.{kind}.hlo", use_numba=numba, compile="eager")
    check_all(exe.run(*inputs), expected, f"{name}.{kind} numba={numba}", name)


# -- programs generated with jax ----------------------------------------------------------------------
@functools.cache
def make_examples():
    """examples/make_examples.py as a module: the program definitions the examples were made from."""
    spec = importlib.util.spec_from_file_location("make_examples", EXAMPLES / "make_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fresh_inputs(args, seed):
    """Same pytree, new values: floats scaled elementwise by 1 + 0.1 * noise (signs, zeros and the
    non-negativity of Adam's second moments kept), integers unchanged."""
    import jax
    r = np.random.default_rng(seed)

    def resample(a):
        a = np.asarray(a)
        if not is_float(a.dtype) or a.ndim == 0:
            return a
        return (a.astype(np.float32) * (1 + 0.1 * r.standard_normal(a.shape, dtype=np.float32))).astype(a.dtype)
    return jax.tree_util.tree_map(resample, args)


def layernorm_bwd_f16():
    ex = make_examples()
    fn, args = ex.ex_layernorm_bwd()
    return fn, tuple(a.astype(np.float16) for a in args)


PROGRAMS = {
    "adam": lambda: make_examples().ex_adam(),
    "layernorm_bwd_f32": lambda: make_examples().ex_layernorm_bwd(),
    "layernorm_bwd_f16": layernorm_bwd_f16,
    "layernorm_bwd_bf16": lambda: make_examples().ex_layernorm_bwd_bf16(),
    "gpt_step": lambda: make_examples().ex_gpt_step(),
}


class JaxProgram:
    def __init__(self, name):
        import jax
        fn, args = PROGRAMS[name]()
        args = fresh_inputs(args, seed=len(name))
        lowered = jax.jit(fn, keep_unused=True).lower(*args)
        compiled = lowered.compile()
        self.text = {"pre": lowered.as_text(dialect="hlo"), "opt": compiled.as_text()}
        self.inputs = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
        self.want = [np.asarray(o) for o in jax.tree_util.tree_leaves(compiled(*args))]


@functools.cache
def jax_program(name) -> JaxProgram:
    return JaxProgram(name)


@functools.cache
def executable(name, kind, numba, excess_precision=False):
    return hloexec.load(jax_program(name).text[kind], use_numba=numba, excess_precision=excess_precision,
                        compile="eager")


@pytest.mark.xla
@KINDS
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_matches_jax(name, kind, numba, monkeypatch):
    compile_every_group(monkeypatch, kind, numba)
    prog = jax_program(name)
    check_all(executable(name, kind, numba).run(*prog.inputs), prog.want, f"{name}.{kind} numba={numba}", name)


@pytest.mark.xla
@pytest.mark.parametrize("name", ["adam", "layernorm_bwd_f16", "layernorm_bwd_bf16"])
def test_excess_precision_reported(name, record_property):
    """Excess precision skips the per-op f16 / bf16 rounding inside fusions: not bit-exact by design.
    Reported per output (max ULP / max |diff|); asserted only to stay within 1% of the output scale."""
    prog = jax_program(name)
    outs = flatten(executable(name, "opt", True, excess_precision=True).run(*prog.inputs))
    report = []
    for k, (g, w) in enumerate(zip(outs, prog.want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        if not is_float(w.dtype):
            continue
        diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
        scale = np.abs(w.astype(np.float64)).max(initial=0.0)
        report.append(f"out{k} {w.dtype}: max {max_ulp(g, w):g} ULP, max |diff| {diff.max(initial=0):.3g}")
        assert diff.max(initial=0) <= 1e-2 * scale + 1e-6, f"{name} out{k}: {report[-1]}"
    record_property("excess_precision", "; ".join(report))
    print(f"\n{name} excess_precision: " + "; ".join(report))

