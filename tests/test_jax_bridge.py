"""hloexec.jax: the programs the other tests build by hand (Adam, LayerNorm backward, a GPT train step, the
8-device SPMD programs) in one call each; dumps as XLA writes them; a real mismatch reported as a table.

This file is also a subprocess of its SPMD test: `python tests/test_jax_bridge.py` checks test_spmd's programs
on 8 host devices (XLA_FLAGS must be set before jax starts)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import hloexec
from hloexec.tools.xla_cpu import load_arrays

pytestmark = pytest.mark.xla
BRIDGE_PROGRAMS = ["adam", "layernorm_bwd_f16", "layernorm_bwd_bf16", "gpt_step"]


@pytest.fixture(scope="module")
def programs():
    from test_programs import PROGRAMS
    return PROGRAMS


# gpt_step's optimized stage under -m slow (39 s in `pytest -n 2` at load average 15 on 2 cores; tests/test_programs.py
# runs it against jax in CI, and the other programs take the bridge's opt stage)
@pytest.mark.parametrize("name, stage", [
    pytest.param(name, stage, id=f"{name}-{stage}",
                 marks=[pytest.mark.slow] if (name, stage) == ("gpt_step", "opt") else [])
    for name in BRIDGE_PROGRAMS for stage in ("pre", "opt")])
def test_check_runs_the_programs_users_validate(programs, name, stage):
    """One call: lowered by jax, run by hloexec, compared with XLA:CPU; the outputs keep fn's pytree."""
    import jax
    import hloexec.jax
    fn, args = programs[name]()
    # gpt_step's Adam update of near-zero gradients amplifies f32 ULPs (see test_programs.ATOL_SCALE)
    tolerance = {"atol": 5e-3, "rtol": 5e-3} if name == "gpt_step" else {}
    ours = hloexec.jax.check(fn, *args, stage=stage, **tolerance)
    want = jax.jit(fn)(*args)
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(want)
    for got, w in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(want)):
        assert isinstance(got, np.ndarray) and got.dtype == np.asarray(w).dtype and got.shape == w.shape


def test_check_reports_a_real_difference_as_the_compare_table():
    """XLA:CPU's tanh is its own polynomial, hloexec's numpy's: within f32's default tolerance they agree, at zero
    tolerance the last-bit differences are reported as compare's table, naming the output that differs."""
    import jax.numpy as jnp
    import hloexec.jax
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    def f(x):
        return x * 2, jnp.tanh(x)
    hloexec.jax.check(f, x)
    with pytest.raises(AssertionError) as failure:
        hloexec.jax.check(f, x, atol=0, rtol=0)
    report = str(failure.value)
    assert "output 1: worst elements" in report and "FAIL: 1 of 2 outputs differ" in report, report


def test_run_handles_static_and_unused_arguments():
    import jax
    import jax.numpy as jnp
    import hloexec.jax
    def f(x, n, unused, y):
        return {"scaled": x * n + y, "total": (jnp.sum(x), y)}
    args = (np.arange(6, dtype=np.float32).reshape(2, 3), 3, np.ones(5, np.int32), np.float32(0.5))
    for stage in ("pre", "opt"):
        got = hloexec.jax.run(f, *args, stage=stage, static_argnums=1)
        want = jax.jit(f, static_argnums=1)(*args)
        assert np.array_equal(got["scaled"], want["scaled"]) and np.array_equal(got["total"][0], want["total"][0])
    # an already jitted function whose unused argument XLA's module left out
    jitted = jax.jit(lambda x, unused: x + 1)
    assert np.array_equal(hloexec.jax.run(jitted, np.ones(3, np.float32), np.ones(2)), np.full(3, 2, np.float32))


def test_dump_writes_what_xla_dump_to_writes(tmp_path):
    """The files of --xla_dump_to (before/after optimization, per pass on request) plus inputs and XLA:CPU's
    outputs, which replay: the optimized module on the saved inputs gives the saved outputs."""
    import jax.numpy as jnp
    import hloexec.jax
    def f(x, w):
        return jnp.tanh(x @ w).sum(axis=0)
    x = np.random.default_rng(1).standard_normal((8, 16), dtype=np.float32)
    w = np.random.default_rng(2).standard_normal((16, 4), dtype=np.float32)
    paths = hloexec.jax.dump(f, x, w, to=tmp_path, passes=True)
    assert paths["before"].name.endswith(".before_optimizations.txt")
    assert paths["after"].name.endswith(".cpu_after_optimizations.txt")
    assert len(paths["passes"]) > 10 and all(p.parent == tmp_path for p in paths["passes"])
    inputs = list(load_arrays(str(paths["inputs"])).values())
    outputs = list(load_arrays(str(paths["outputs"])).values())
    assert [a.shape for a in inputs] == [(8, 16), (16, 4)]
    for stage in ("before", "after"):
        got = hloexec.load(paths[stage]).run(*inputs)
        np.testing.assert_allclose(got, outputs[0], rtol=1e-5, atol=1e-6)


def test_check_runs_every_participant_of_sharded_programs():
    """The 8-device programs of test_spmd.py with sharded arguments, pre-optimization (the global program) and
    XLA's partitioned module (every participant, inputs split and outputs assembled by their shardings)."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(__file__))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.split() == [f"{name}:{stage}" for name in
                                   ("collectives", "data_parallel", "model_parallel", "sequence_parallel",
                                    "mesh_sequence_parallel") for stage in ("pre", "opt")]


def _check_spmd_programs():
    import hloexec.jax
    from test_spmd import programs
    for name, (jitted, arrays, _mesh) in programs().items():
        for stage in ("pre", "opt"):
            # partial sums all-reduced in another order than one device's dot (docs/spmd.md: the bounds of
            # its sharded-vs-unsharded example); the gradients of sum(x**2) reach ~1e2
            hloexec.jax.check(jitted, *arrays, stage=stage, atol=0.05, rtol=1e-3)
            print(f"{name}:{stage}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    _check_spmd_programs()


@pytest.mark.parametrize("name", ["layernorm_bwd_f16", "adam"])
def test_check_against_the_shadow_judges_both_by_the_precision(programs, name):
    """reference="shadow": XLA:CPU's and hloexec's f16 gradients differ beyond compare's f16 tolerance yet both
    are as close to exact as f16 allows; a result 3% off is not."""
    import jax
    import hloexec.jax
    fn, args = programs[name]()
    ours = hloexec.jax.check(fn, *args, reference="shadow")
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(jax.jit(fn)(*args))

    original = hloexec.jax.lower

    def miscompiled(*a, **k):     # XLA:CPU's outputs, every float scaled by 1.03: a wrong program's
        lowered = original(*a, **k)
        compiled = lowered.jax_lowered.compile()
        lowered.compiled = lambda *xs: jax.tree_util.tree_map(
            lambda y: np.asarray(y) * np.asarray(1.03, np.asarray(y).dtype) if np.issubdtype(np.asarray(y).dtype,
                                                                                            np.inexact) else y,
            compiled(*xs))
        return lowered
    hloexec.jax.lower = miscompiled
    try:
        with pytest.raises(AssertionError) as failure:
            hloexec.jax.check(fn, *args, reference="shadow")
    finally:
        hloexec.jax.lower = original
    assert "XLA:CPU" in str(failure.value) and "NOT consistent" in str(failure.value), str(failure.value)


def test_check_against_the_shadow_takes_no_tolerance():
    import hloexec.jax
    with pytest.raises(ValueError, match="precision"):
        hloexec.jax.check(lambda x: x, np.ones(3, np.float32), reference="shadow", atol=1e-3)
