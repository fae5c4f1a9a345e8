"""While loops compiled whole into one Numba function (hloexec/kernels/program.py).

Programs fix their integer dtypes: another test may have switched on jax's x64 mode in this process.

Each jax program below puts one family of ops inside a loop body -- carried-state updates
(dynamic-update-slice), scatter, gather, dot, reductions and reduce-windows (variadic too), conditionals, nested loops,
movement ops, integer bit tricks, f16 / bf16 -- and runs it three ways: XLA:CPU (jax itself), hloexec with
the loop compiled (`compile="eager"`), hloexec interpreted step by step (`use_numba=False`). Data are
small integers wherever sums are involved, so every order of summation gives the same bits and the
comparisons can be exact.
"""
from __future__ import annotations

import numpy as np
import pytest

import hloexec
from hloexec.errors import TierUnsupported
from hloexec.exec.tiering import LOOP_COMPILE_WORK, TieredLoop
from hloexec.kernels.program import compile_program
from xla_compare import flatten, max_ulp

jax = pytest.importorskip("jax", reason="jax (XLA:CPU) is the reference here: pip install jax")
jnp = jax.numpy
lax = jax.lax


def _ints(shape, lo=-4, hi=5, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).integers(lo, hi, size=shape).astype(dtype)


def scan_rows(xs):
    def step(carry, x):
        carry = carry * 2 + x
        return carry, carry - 1
    return lax.scan(step, jnp.ones(xs.shape[1], xs.dtype), xs)


def int_bits(seed):
    def body(i, s):
        s = s ^ (s << 13) ^ (s >> 7)
        s = s + lax.rem(s, jnp.uint32(97) + i.astype(jnp.uint32)) + (s // jnp.uint32(3))
        return s
    return lax.fori_loop(0, 200, body, seed)


def collatz(n):
    def cond(c):
        return c[0] != 1

    def body(c):
        x, steps = c
        return jnp.where(x % 2 == 0, x // 2, 3 * x + 1), steps + 1
    return lax.while_loop(cond, body, (n, jnp.int32(0)))


def scatter_gather(table, idx):
    def body(i, t):
        j = idx[i % idx.shape[0]]
        t = t.at[j].add(t[(j + 1) % t.shape[0]])             # gather a row, scatter-add it
        return t.at[jnp.array([j, 0])].max(jnp.take(t, jnp.array([1, 2]), axis=0))
    return lax.fori_loop(0, 12, body, table)


def dots(m, v):
    def body(i, c):
        v, acc = c
        v = jnp.clip(m @ v, -50, 50)
        return v, acc + jnp.dot(v, v)                          # matrix-vector and vector-vector (scalar)
    return lax.fori_loop(0, 6, body, (v, jnp.float32(0)))


def reductions(x):
    def body(i, c):
        x, idx, tot = c
        x = jnp.roll(x, 1, axis=1) + 1
        return x, idx + jnp.argmax(x, axis=1).astype(idx.dtype), tot + jnp.sum(x, axis=0) - jnp.max(x)
    return lax.fori_loop(0, 5, body, (x, jnp.zeros(x.shape[0], jnp.int32), jnp.zeros(x.shape[1], x.dtype)))


def branches(x):
    def body(i, x):
        x = lax.cond(i % 3 == 0, lambda x: x * 2, lambda x: x - 1, x)
        return lax.switch(i % 4, [lambda x: x + 1, lambda x: -x, lambda x: x[::-1], lambda x: x], x)
    return lax.fori_loop(0, 11, body, x)


def nested(x):
    def outer(i, x):
        return lax.fori_loop(0, i + 1, lambda j, y: y + j * x[0], x) * 0.5
    return lax.fori_loop(0, 4, outer, x)


def movement(x):
    def body(i, x):
        y = jnp.concatenate([x[1:], x[:1]], axis=0).T.T
        y = jnp.pad(y, ((1, 0), (0, 1)))[:-1, 1:]
        return y + jnp.broadcast_to(jnp.arange(x.shape[1], dtype=x.dtype), x.shape) + lax.dynamic_slice(
            x, (i % 2, 0), (x.shape[0], x.shape[1])) * 0
    return lax.fori_loop(0, 7, body, x)


def half(x16, xb16):
    def body(i, c):
        a, b = c
        return a * a.dtype.type(0.75) + jnp.sin(a), jnp.tanh(b) * b.dtype.type(1.5) + b
    return lax.fori_loop(0, 9, body, (x16, xb16))


def swap_and_alias(x):
    def body(i, c):
        a, b, c_ = c
        return b, a.at[0].set(i.astype(a.dtype)), b         # swapped carries; one value carried twice
    return lax.fori_loop(0, 5, body, (x, x + 1, x))


def invariant(x):
    def body(i, s):
        big = jnp.sum(jnp.arange(4096, dtype=jnp.int32) % 7, dtype=jnp.int32)  # does not depend on the carry
        return s + big + i.astype(s.dtype)
    return lax.fori_loop(0, 3000, body, x)


def windows(x):
    """reduce-window in a loop body: a max with SAME padding, a strided sum over a padded, base-dilated
    operand, and a variadic (value, index) argmax."""
    idx = lax.broadcasted_iota(jnp.int32, x.shape, 1)

    def argmax(a, b):
        (av, ai), (bv, bi) = a, b
        pick = av >= bv
        return jnp.where(pick, av, bv), jnp.where(pick, ai, bi)

    def body(i, c):
        x, total, where = c
        peak = lax.reduce_window(x, low, lax.max, (3, 2), (1, 1), "SAME")
        total = total + lax.reduce_window(x, zero, lax.add, (2, 3), (2, 1), ((1, 0), (1, 1)), base_dilation=(1, 2))
        _, arg = lax.reduce_window((x, idx), (low, jnp.int32(0)), argmax, (2, 2), (1, 1), "VALID")
        return peak - 1, total, where + arg
    low, zero = jnp.float32(-jnp.inf), jnp.float32(0)
    total0 = lax.reduce_window(x, zero, lax.add, (2, 3), (2, 1), ((1, 0), (1, 1)), base_dilation=(1, 2)) * 0
    return lax.fori_loop(0, 4, body, (x, total0, jnp.zeros((x.shape[0] - 1, x.shape[1] - 1), jnp.int32)))


PROGRAMS = {
    "scan_rows": (scan_rows, (_ints((9, 4)),)),
    "int_bits": (int_bits, (np.arange(1, 9, dtype=np.uint32) * np.uint32(2654435761),)),
    "collatz": (collatz, (np.int32(27),)),
    "scatter_gather": (scatter_gather, (_ints((6, 3)), np.array([3, 1, 5, 5, 0, 7, -2], np.int32))),
    "dots": (dots, (_ints((5, 5), -1, 2), _ints((5,)))),
    "reductions": (reductions, (_ints((3, 6)),)),
    "branches": (branches, (_ints((5,)),)),
    "nested": (nested, (_ints((4,)),)),
    "movement": (movement, (_ints((4, 5)),)),
    "half": (half, (_ints((7,), dtype=np.float16) / 8, _ints((7,), dtype=jnp.bfloat16) / 4)),
    "swap_and_alias": (swap_and_alias, (_ints((4,)),)),
    "invariant": (invariant, (np.int32(5),)),
    "windows": (windows, (_ints((5, 6)),)),
}


def _text(name):
    fn, args = PROGRAMS[name]
    return jax.jit(fn).lower(*args).as_text(dialect="hlo")


def _assert_same(got, want, what, ulps=0):
    got, want = flatten(got), flatten(want)
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what} out{k}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        if ulps and g.dtype.kind not in "iub":
            assert max_ulp(g, w) <= ulps, f"{what} out{k}: {max_ulp(g, w)} ULP"
        else:
            assert np.array_equal(g, w, equal_nan=g.dtype.kind == "f"), f"{what} out{k}:\n{g}\n{w}"


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_compiled_loop_matches_xla_and_the_interpreter(name):
    fn, args = PROGRAMS[name]
    text = _text(name)
    exe = hloexec.load(text, compile="eager")
    loops = [s.kernel for s in exe.plan.steps if s.inst.opcode == "while"]
    assert loops and all(isinstance(k, TieredLoop) and k.compile_work == 0 for k in loops), \
        "the loop cannot compile"
    got = exe.run(*args)
    assert all(k.compiled is not None for k in loops), "the loop did not compile"
    ulps = 1 if name == "half" else 0       # sin / tanh: libm here, XLA's own approximations there
    _assert_same(got, jax.jit(fn)(*args), f"{name} vs XLA:CPU", ulps)
    _assert_same(got, hloexec.load(text, use_numba=False).run(*args), f"{name} vs interpreted", ulps)


def test_read_only_and_writable_operands_share_one_compiled_loop():
    """A read-only operand (here the caller's input) does not make Numba compile the loop a second time."""
    text = _text("scan_rows")
    xs = PROGRAMS["scan_rows"][1][0]
    frozen = xs.copy()
    frozen.flags.writeable = False
    exe = hloexec.load(text, compile="eager")
    (loop,) = [s.kernel for s in exe.plan.steps if s.inst.opcode == "while"]
    want = exe.run(xs)
    _assert_same(exe.run(frozen), want, "read-only input vs writable")
    _assert_same(exe.run(xs), want, "writable input after the read-only one")
    assert len(loop.compiled.fn.overloads) == 1, loop.compiled.fn.signatures


def test_step_buffers_are_written_in_place_and_allocated_once():
    """scan's stacked output is written into the carried buffer (no copy per step), and the values of a
    step are allocated before the loop: inside it, only the new carry is allocated."""
    module = hloexec.parse(_text("scan_rows"))[0]
    (loop,) = [i for c in module.computations for i in c.instructions if i.opcode == "while"]
    source = compile_program(loop).source
    inside = source[source.index("while True:"):]
    assert "[:] =" not in inside and ".copy()" not in inside
    assert inside.count("np.empty") <= 2, inside


def test_invariants_are_computed_once():
    module = hloexec.parse(_text("invariant"))[0]
    (loop,) = [i for c in module.computations for i in c.instructions if i.opcode == "while"]
    source = compile_program(loop).source
    assert "range(4096)" in source[:source.index("while True:")]
    assert "range(4096)" not in source[source.index("while True:"):]


def test_long_loop_compiles_mid_run_and_gives_the_interpreted_bits():
    """Interpreted until LOOP_COMPILE_WORK instructions have run, then compiled from the state reached."""
    text = _text("invariant")
    exe = hloexec.load(text, compile="eager", compile_after=1)     # the loop switches at a fixed step
    (loop,) = [s.kernel for s in exe.plan.steps if s.inst.opcode == "while"]
    assert loop.compiled is None
    got = exe.run(np.int32(5))
    assert loop.compiled is not None and 0 < loop.work[0] < 3000 * loop.step_work
    assert loop.work[0] >= loop.compile_work >= LOOP_COMPILE_WORK
    _assert_same(got, hloexec.load(text, use_numba=False).run(np.int32(5)), "tiered vs interpreted")


def test_short_loop_stays_interpreted():
    exe = hloexec.load(_text("branches"), compile="eager", compile_after=1)
    (loop,) = [s.kernel for s in exe.plan.steps if s.inst.opcode == "while"]
    exe.run(*PROGRAMS["branches"][1])
    assert loop.compiled is None and loop.kernel is not None


def test_loop_with_an_op_the_generator_lacks_runs_interpreted():
    def f(x):
        return lax.fori_loop(0, 3, lambda i, x: jnp.sort(x * -1), x)
    x = _ints((6,))
    text = jax.jit(f).lower(x).as_text(dialect="hlo")
    module = hloexec.parse(text)[0]
    (loop,) = [i for c in module.computations for i in c.instructions if i.opcode == "while"]
    with pytest.raises(TierUnsupported, match="opcode sort"):
        compile_program(loop)
    exe = hloexec.load(text, compile="eager")
    assert exe.context.tier_report.to_dict()["loop"]["reasons"] == {"opcode sort": [loop.name]}
    _assert_same(exe.run(x), jax.jit(f)(x), "sort loop vs XLA:CPU")


def test_nested_loops_compile_with_their_outer_loop_only():
    exe = hloexec.load(_text("nested"))
    loops = {id(s.inst): s.kernel for plan in exe.plans for s in plan.steps if s.inst.opcode == "while"}
    (outer,) = [s.kernel for s in exe.plan.steps if s.inst.opcode == "while"]
    inner = [k for k in loops.values() if k is not outer]
    assert outer.kernel is not None and outer.compile_work < float("inf")
    assert inner and all(k.kernel is None and k.compile_work == float("inf") for k in inner)


def test_a_loop_that_does_not_compile_runs_interpreted_with_a_warning(monkeypatch):
    from hloexec.errors import CompileWarning
    from hloexec.kernels.program import ProgramKernel

    def broken(self):
        raise RuntimeError("generated code does not compile")
    monkeypatch.setattr(ProgramKernel, "compile", broken)
    fn, args = PROGRAMS["scan_rows"]
    exe = hloexec.load(_text("scan_rows"), compile="eager")
    with pytest.warns(CompileWarning, match="does not compile"):
        got = exe.run(*args)
    _assert_same(got, jax.jit(fn)(*args), "interpreted fallback vs XLA:CPU")
    (loop,) = [s.kernel for s in exe.plan.steps if s.inst.opcode == "while"]
    assert loop.compiled is None and loop.compile_work == float("inf")
    _assert_same(exe.run(*args), got, "second run")           # no second attempt, no second warning


def split_keys(key):
    """jax.random.split in a fori_loop inside a scan: nested loops whose u32 key state is carried in parallel
    (issue 12: the compiled loop returned wrong keys once the scan ran long enough to compile mid-run)."""
    def step(k, _):
        def inner(i, c):
            k, acc = c
            k, sub = jax.random.split(k)
            return k, acc + jax.random.uniform(sub, (3,), jnp.float32)
        k, acc = lax.fori_loop(0, 3, inner, (k, jnp.zeros(3, jnp.float32)))
        k, sub = jax.random.split(k)
        return k, (sub, acc)
    return lax.scan(step, key, None, length=3000)


@pytest.mark.slow         # XLA's optimized threefry makes loops of 300-1200 generated lines: ~1-4 min of Numba
def test_scan_of_random_split_after_the_switch_to_compiled():
    """The bug class is covered fast by tests/test_tiers.py (nested loops, generated loop programs)."""
    key = np.asarray(jax.random.PRNGKey(0))
    text = jax.jit(split_keys).lower(key).compile().as_text()
    want = jax.jit(split_keys)(key)
    for options in ({"compile": "eager", "compile_after": 1}, {"compile": "eager"}):
        exe = hloexec.load(text, **options)
        _assert_same(exe.run(key), want, f"scan of random.split {options}")
        assert any(k.compiled is not None for k in _tier_loops(exe)), "no loop compiled"


def _tier_loops(exe):
    return [s.kernel for plan in exe.plans for s in plan.steps if isinstance(s.kernel, TieredLoop)]
