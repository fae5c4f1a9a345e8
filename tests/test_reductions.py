"""The `reductions` option: "accumulate" (f16/bf16 add/multiply reductions in f32, rounded once) and "per-step"
(every application of the reducer rounded to the type, in row-major order of the reduced elements).

* per-step is what the HLO says: the vectorized reduce / reduce-window give the bits of the reducer computation
  applied element by element (hloexec's general path, which calls it as written), windows with padding and
  dilations included;
* every tier gives the same per-step bits: the op-by-op fold, the fused kernel (row sums, interchanged column
  reductions) and the compiled while loop;
* against XLA:CPU: per-step reproduces its optimized modules' f16 reduces and reduce-windows (tests marked xla;
  see test_per_step_matches_xla_cpu and test_layernorm_gradient_against_xla_cpu for what depends on the host).
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import hloexec
import hloexec.exec.executor as executor
import hloexec.ops.reduction as reduction
from hloexec.kernels import fusion
from hloexec.kernels.program import compile_program
from xla_compare import flatten, ulp_distance

BF16 = np.dtype(ml_dtypes.bfloat16)
TYPES = {"f16": np.dtype(np.float16), "bf16": BF16, "f32": np.dtype(np.float32), "f64": np.dtype(np.float64)}


def bits(a) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def reducer(name: str, et: str, kind: str, opaque: bool = False) -> str:
    """A reducer computation; `opaque` adds a copy at its root so hloexec cannot vectorize it and calls it
    per element (the general path: the HLO's semantics, literally)."""
    if opaque:
        return (f"{name} {{ a = {et}[] parameter(0)\n b = {et}[] parameter(1)\n s = {et}[] {kind}(a, b)\n"
                f" ROOT c = {et}[] copy(s) }}\n")
    return f"{name} {{ a = {et}[] parameter(0)\n b = {et}[] parameter(1)\n ROOT s = {et}[] {kind}(a, b) }}\n"


def dims_text(dims) -> str:
    return ",".join(map(str, dims))


def values(rng, dims, et: str, kind: str, specials: bool) -> np.ndarray:
    x = rng.standard_normal(dims)
    x = 1 + x / 8 if kind == "multiply" else x * 3
    x = x.astype(TYPES[et])
    if specials and x.size:
        flat = x.reshape(-1)
        flat[rng.integers(0, x.size, 2)] = [np.inf, -np.inf]
        flat[rng.integers(0, x.size)] = -0.0
    return x


def init_value(kind: str) -> str:
    return "0.75" if kind == "add" else "1.25"


# -- per-step is the reducer applied element by element -----------------------------------------------------
@st.composite
def reduce_cases(draw, max_size=256):
    rank = draw(st.integers(1, 3))
    dims = draw(st.lists(st.sampled_from([1, 2, 3, 5, 8, 17]), min_size=rank, max_size=rank))
    if math.prod(dims) > max_size:
        dims = [min(d, 5) for d in dims]
    rdims = sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1)))
    return (draw(st.sampled_from(sorted(TYPES))), draw(st.sampled_from(["add", "multiply"])), dims, rdims,
            draw(st.integers(0, 2 ** 16)), draw(st.booleans()))


def reduce_module(et, kind, dims, rdims, opaque=False) -> str:
    out = [d for i, d in enumerate(dims) if i not in rdims]
    return (f"HloModule r\n{reducer('red', et, kind, opaque)}"
            f"ENTRY e {{ x = {et}[{dims_text(dims)}] parameter(0)\n z = {et}[] constant({init_value(kind)})\n"
            f" ROOT r = {et}[{dims_text(out)}] reduce(x, z), dimensions={{{dims_text(rdims)}}}, to_apply=red }}\n")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reduce_cases())
def test_per_step_reduce_is_the_reducer_applied_in_order(case):
    et, kind, dims, rdims, seed, specials = case
    x = values(np.random.default_rng(seed), dims, et, kind, specials)
    literal = hloexec.load(reduce_module(et, kind, dims, rdims, opaque=True), use_numba=False).run(x)
    for slices_min in (1, 1 << 30):        # both strategies of fold_in_order
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(reduction, "FOLD_SLICES_MIN", slices_min)
            got = hloexec.load(reduce_module(et, kind, dims, rdims), use_numba=False, reductions="per-step").run(x)
        assert bits(got) == bits(literal), (case, got, literal)


@st.composite
def window_cases(draw):
    rank = draw(st.integers(1, 3))
    dims = draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank))
    win = [(draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(0, 2)), draw(st.integers(0, 2)),
            draw(st.integers(1, 2)), draw(st.integers(1, 2))) for _ in range(rank)]
    return (draw(st.sampled_from(sorted(TYPES))), draw(st.sampled_from(["add", "multiply"])), dims, win,
            draw(st.integers(0, 2 ** 16)), draw(st.booleans()))


def window_module(et, kind, dims, win, opaque=False) -> str:
    out = []
    for n, (size, stride, lo, hi, base, wdil) in zip(dims, win):
        padded = (n - 1) * base + 1 + lo + hi
        extent = (size - 1) * wdil + 1
        out.append(0 if padded < extent else (padded - extent) // stride + 1)
    field = lambda k: "x".join(str(w[k]) for w in win)    # noqa: E731
    window = (f"size={field(0)} stride={field(1)} pad={'x'.join(f'{w[2]}_{w[3]}' for w in win)} "
              f"lhs_dilate={field(4)} rhs_dilate={field(5)}")
    return (f"HloModule w\n{reducer('red', et, kind, opaque)}"
            f"ENTRY e {{ x = {et}[{dims_text(dims)}] parameter(0)\n z = {et}[] constant({init_value(kind)})\n"
            f" ROOT r = {et}[{dims_text(out)}] reduce-window(x, z), window={{{window}}}, to_apply=red }}\n")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(window_cases())
def test_per_step_reduce_window_is_the_reducer_applied_in_order(case):
    """Padding and base-dilation holes are skipped by the general path and hold the reducer's exact identity
    (-0 for a float sum) in the vectorized one: the same bits, -0 sums included."""
    et, kind, dims, win, seed, specials = case
    x = values(np.random.default_rng(seed), dims, et, kind, specials)
    literal = hloexec.load(window_module(et, kind, dims, win, opaque=True), use_numba=False).run(x)
    got = hloexec.load(window_module(et, kind, dims, win), use_numba=False, reductions="per-step").run(x)
    assert bits(got) == bits(literal), (case, got, literal)


def test_per_step_rounds_every_step_and_accumulate_once():
    """2048 + 1 is a tie in f16 (spacing 2 there) that rounds to even, 2048: adding ones one at a time after
    2048 never moves the sum, while ones first add up exactly. In f32, every order gives 2048 + 64."""
    ones = np.ones(64, np.float16)
    big_first = np.concatenate([[np.float16(2048)], ones])
    big_last = np.concatenate([ones, [np.float16(2048)]])
    text = reduce_module("f16", "add", [65], [0]).replace("constant(0.75)", "constant(0)")
    for numba in (False, True):
        per_step = hloexec.load(text, use_numba=numba, compile_after=0, reductions="per-step")
        accumulate = hloexec.load(text, use_numba=numba, compile_after=0)
        assert per_step.run(big_first) == 2048 and per_step.run(big_last) == 2048 + 64
        assert accumulate.run(big_first) == accumulate.run(big_last) == 2048 + 64


def test_unknown_reductions_mode_is_refused():
    with pytest.raises(ValueError, match="per-step"):
        hloexec.load(reduce_module("f16", "add", [4], [0]), reductions="pairwise")


# -- every tier gives the per-step bits ---------------------------------------------------------------------
def fused_module(et, kind, dims, rdims) -> str:
    """out = reduce(p0 * p1) as one fusion (kInput)."""
    d, out = dims_text(dims), dims_text([n for i, n in enumerate(dims) if i not in rdims])
    return (f"HloModule f\n{reducer('red', et, kind)}"
            f"fused {{ p0 = {et}[{d}] parameter(0)\n p1 = {et}[{d}] parameter(1)\n m = {et}[{d}] multiply(p0, p1)\n"
            f" z = {et}[] constant({init_value(kind)})\n"
            f" ROOT r = {et}[{out}] reduce(m, z), dimensions={{{dims_text(rdims)}}}, to_apply=red }}\n"
            f"ENTRY e {{ a = {et}[{d}] parameter(0)\n b = {et}[{d}] parameter(1)\n"
            f" ROOT f = {et}[{out}] fusion(a, b), kind=kInput, calls=fused }}\n")


def loop_module(et, kind, dims, rdims) -> str:
    """Two steps of a while loop whose body reduces the carried x and adds it to the carried sum."""
    d, out = dims_text(dims), dims_text([n for i, n in enumerate(dims) if i not in rdims])
    state = f"(s32[], {et}[{out}], {et}[{d}])"
    return (f"HloModule l\n{reducer('red', et, kind)}"
            f"cond {{ s = {state} parameter(0)\n i = s32[] get-tuple-element(s), index=0\n n = s32[] constant(2)\n"
            f" ROOT c = pred[] compare(i, n), direction=LT }}\n"
            f"body {{ s = {state} parameter(0)\n i = s32[] get-tuple-element(s), index=0\n"
            f" acc = {et}[{out}] get-tuple-element(s), index=1\n x = {et}[{d}] get-tuple-element(s), index=2\n"
            f" one = s32[] constant(1)\n j = s32[] add(i, one)\n z = {et}[] constant({init_value(kind)})\n"
            f" r = {et}[{out}] reduce(x, z), dimensions={{{dims_text(rdims)}}}, to_apply=red\n"
            f" acc2 = {et}[{out}] add(acc, r)\n ROOT t = {state} tuple(j, acc2, x) }}\n"
            f"ENTRY e {{ acc = {et}[{out}] parameter(0)\n x = {et}[{d}] parameter(1)\n zero = s32[] constant(0)\n"
            f" t = {state} tuple(zero, acc, x)\n w = {state} while(t), condition=cond, body=body\n"
            f" ROOT r = {et}[{out}] get-tuple-element(w), index=1 }}\n")


# the generators' special paths: a row sum LANES-eligible under "accumulate" (64 floats along the minor dim),
# reductions keeping the minor dims (loops interchanged), size-1 reduced dims only, several reduced dims
TIER_CASES = [([8, 64], [1]), ([4, 16, 32], [0, 1]), ([6, 1, 5], [1]), ([3, 5, 7], [0, 2]), ([96], [0])]


def computation(exe, name):
    (comp,) = [c for c in exe.module.computations if c.name == name]
    return comp


def check_tiers(et, kind, dims, rdims, seed, monkeypatch):
    monkeypatch.setattr(executor, "MIN_COMPILED_BYTES", 0)
    rng = np.random.default_rng(seed)
    a, b = (values(rng, dims, et, kind, specials=False) for _ in range(2))
    text = fused_module(et, kind, dims, rdims)
    compiled = hloexec.load(text, compile_after=0, reductions="per-step")
    assert fusion.generate_source(computation(compiled, "fused"), reductions="per-step") is not None
    op_by_op = hloexec.load(text, use_numba=False, reductions="per-step").run(a, b)
    assert bits(compiled.run(a, b)) == bits(op_by_op)
    out = [n for i, n in enumerate(dims) if i not in rdims]
    acc = values(rng, out, et, "add", specials=False)
    text = loop_module(et, kind, dims, rdims)
    loop = hloexec.load(text, compile_after=0, reductions="per-step")
    (w,) = [i for i in computation(loop, "e").instructions if i.opcode == "while"]
    assert compile_program(w, reductions="per-step") is not None
    interpreted = hloexec.load(text, use_numba=False, reductions="per-step").run(acc, a)
    assert bits(loop.run(acc, a)) == bits(interpreted)


@pytest.mark.parametrize("et", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("dims,rdims", TIER_CASES, ids=[f"{d}-{r}" for d, r in TIER_CASES])
def test_tiers_agree_bit_for_bit_per_step(et, dims, rdims, monkeypatch):
    check_tiers(et, "add", dims, rdims, seed=len(dims), monkeypatch=monkeypatch)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(case=reduce_cases(max_size=2048))
def test_tiers_agree_bit_for_bit_per_step_random(case, monkeypatch):
    et, kind, dims, rdims, seed, _ = case
    check_tiers(et, kind, dims, rdims, seed, monkeypatch)
