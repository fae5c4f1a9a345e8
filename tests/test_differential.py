"""Differential tests: random small jax programs, run by hloexec and by XLA:CPU (jax itself).

hypothesis draws a program -- a composition of lax ops over a few inputs of one element type, with
conversions to other types, compares and masks (select), reductions (empty ones too: shapes may have a 0
dimension), data movement, and control flow (cond, fori_loop, while_loop, scan) -- and its inputs. The program
is lowered by jax before XLA optimizes it (`jit(f).lower(*args).as_text(dialect="hlo")`) and after
(`.compile().as_text()`); hloexec runs both texts and must give XLA:CPU's outputs (`compiled(*args)`).

Element types: f32, f64, f16, bf16, fp8 (e4m3fn, e5m2), f4e2m1fn, s32, s8, u8, u32, s4, u4, c64, pred.
Integers and pred must match exactly; floats within a few units of their type's precision of the output's
scale (XLA:CPU contracts multiply-adds into FMAs, uses its own exp / log / sin approximations, sums in its own
order and may keep f16 / bf16 values in f32 between ops); NaN where XLA has NaN, the same infinities.
XLA:CPU flushes f32 / f64 denormals to zero: hloexec's outputs are flushed before comparing.

The default run draws EXAMPLES programs (fixed by hypothesis' derandomize: the same ones every run); the slow job
(`pytest -m slow tests/test_differential.py`) draws SLOW_EXAMPLES more and also runs every program with its
fusions and loops compiled before their first call (`compile="eager"`) and op by op (`use_numba=False`).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings, strategies as st

import hloexec
from xla_compare import flatten, flush_denormals

jax = pytest.importorskip("jax", reason="jax (XLA:CPU) is the reference here: pip install jax")
jnp = jax.numpy
lax = jax.lax
jax.config.update("jax_enable_x64", True)      # f64 and u32 / s32 inputs stay as they are

pytestmark = pytest.mark.xla

EXAMPLES = 80
SLOW_EXAMPLES = 400

FLOATS = ["f32", "f64", "f16", "bf16", "f8e4m3fn", "f8e5m2", "f4e2m1fn"]
INTS = ["s32", "s8", "u8", "u32", "s4", "u4"]
DTYPES = FLOATS + INTS + ["c64", "pred"]
NP = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
      "f8e4m3fn": ml_dtypes.float8_e4m3fn, "f8e5m2": ml_dtypes.float8_e5m2, "f4e2m1fn": ml_dtypes.float4_e2m1fn,
      "s32": np.int32, "s8": np.int8, "u8": np.uint8, "u32": np.uint32, "s4": ml_dtypes.int4,
      "u4": ml_dtypes.uint4, "c64": np.complex64, "pred": np.bool_}
# Relative precision a float output is compared to (of its largest magnitude too): a few units of the type.
PRECISION = {"f32": 1e-5, "f64": 1e-12, "f16": 4e-3, "bf16": 3e-2, "f8e4m3fn": 0.25, "f8e5m2": 0.5, "f4e2m1fn": 1.0,
             "c64": 1e-5}
SUB_BYTE = ("s4", "u4", "f4e2m1fn")


def kind(t: str) -> str:
    return "float" if t in FLOATS else "int" if t in INTS else t


class Expr:
    """A node of a generated program: `fn(env)` computes it from the inputs `env`; `text` says what it is."""

    def __init__(self, fn, dtype: str, text: str):
        self.fn, self.dtype, self.text = fn, dtype, text

    def __call__(self, env):
        return self.fn(env)


def _unary(data, x: Expr) -> Expr:
    t = x.dtype
    k = kind(t)
    if k == "pred":
        return Expr(lambda e: ~x(e), t, f"not({x.text})")
    if t == "c64":
        name = data.draw(st.sampled_from(["neg", "exp_small", "conj"]))
        fns = {"neg": lambda v: -v, "exp_small": lambda v: jnp.exp(v * jnp.complex64(0.25)), "conj": jnp.conj}
        return Expr(lambda e: fns[name](x(e)), t, f"{name}({x.text})")
    if k == "int":
        names = ["neg", "not"] + ([] if t in SUB_BYTE else ["abs", "popcnt", "clz"])   # (jax: not on s4 / u4)
        name = data.draw(st.sampled_from(names))
        fns = {"neg": lambda v: -v, "not": lambda v: ~v, "abs": lambda v: lax.abs(v) if t[0] == "s" else v,
               "popcnt": lax.population_count, "clz": lax.clz}
        return Expr(lambda e: fns[name](x(e)), t, f"{name}({x.text})")
    names = ["neg", "abs", "floor", "ceil", "round", "sign", "sqrt_abs", "tanh", "sin", "exp_tanh", "log1p_abs",
             "logistic"]
    name = data.draw(st.sampled_from(names))
    fns = {"neg": lambda v: -v, "abs": jnp.abs, "floor": jnp.floor, "ceil": jnp.ceil, "round": lax.round,
           "sign": jnp.sign, "sqrt_abs": lambda v: jnp.sqrt(jnp.abs(v)), "tanh": jnp.tanh, "sin": jnp.sin,
           "exp_tanh": lambda v: jnp.exp(jnp.tanh(v)), "log1p_abs": lambda v: jnp.log1p(jnp.abs(v)),
           "logistic": jax.nn.sigmoid}
    return Expr(lambda e: fns[name](x(e)), t, f"{name}({x.text})")


def _binary(data, x: Expr, y: Expr) -> Expr:
    t = x.dtype
    k = kind(t)
    if k == "pred":
        names = ["and", "or", "xor"]
    elif t == "c64":
        names = ["add", "sub", "mul"]
    elif k == "int":
        names = ["add", "sub", "mul", "max", "min", "and", "or", "xor", "div", "rem", "shl", "shr_a", "shr_l"]
    else:
        names = ["add", "sub", "mul", "div", "max", "min", "atan2"]
    name = data.draw(st.sampled_from(names))
    fns = {"and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
           "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "max": lax.max, "min": lax.min, "div": lax.div, "rem": lax.rem, "atan2": lax.atan2,
           "shl": lax.shift_left, "shr_a": lax.shift_right_arithmetic, "shr_l": lax.shift_right_logical}
    if k == "float" and name == "div":
        fns["div"] = lambda a, b: a / b
    return Expr(lambda e: fns[name](x(e), y(e)), t, f"{name}({x.text}, {y.text})")


def _other_type(data, t: str) -> str:
    return data.draw(st.sampled_from([u for u in DTYPES if u != t and not (u == "c64" and t == "pred")]))


def _converted(x: Expr, t: str) -> Expr:
    """x converted to element type t (a complex value's real part to a real type)."""
    if x.dtype == t:
        return x
    jt = jnp.dtype(NP[t])
    if x.dtype == "c64":
        return Expr(lambda e: jnp.real(x(e)).astype(jt), t, f"convert(real({x.text}), {t})")
    return Expr(lambda e: x(e).astype(jt), t, f"convert({x.text}, {t})")


def expr(data, t: str, shape: tuple, inputs: str, n_inputs: int, depth: int, top: bool = False) -> Expr:
    """A value of element type `t` and `shape` computed from the inputs (of element type `inputs`, `shape`)."""
    k = data.draw(st.integers(0, n_inputs - 1))
    leaf = _converted(Expr(lambda e: e[k], inputs, f"x{k}"), t)
    if depth <= 0:
        return leaf
    choices = ["unary", "binary", "binary", "convert", "select", "reduce", "movement", "cond", "loop", "scan",
               "while"] + ([] if top else ["leaf"])
    choice = data.draw(st.sampled_from(choices))
    sub = lambda tt=t, d=depth - 1: expr(data, tt, shape, inputs, n_inputs, d)      # noqa: E731
    if choice == "leaf":
        return leaf
    if choice == "unary":
        return _unary(data, sub())
    if choice == "binary":
        return _binary(data, sub(), sub())
    if choice == "convert":                                     # through another type (wrapping, saturating...)
        return _converted(sub(_other_type(data, t)), t)
    if choice == "select":                                      # a mask from a compare (or a pred value)
        ct = data.draw(st.sampled_from([u for u in DTYPES if u != "c64"]))
        a, b = sub(ct), sub(ct)
        direction = data.draw(st.sampled_from(["lt", "le", "eq", "ne"]))
        cmp = {"lt": lambda p, q: p < q, "le": lambda p, q: p <= q, "eq": lambda p, q: p == q,
               "ne": lambda p, q: p != q}[direction]
        x, y = sub(), sub()
        return Expr(lambda e: jnp.where(cmp(a(e), b(e)), x(e), y(e)), t,
                    f"where({direction}({a.text}, {b.text}), {x.text}, {y.text})")
    if choice == "reduce" and shape and t not in ("s4", "u4", "c64"):
        axis = data.draw(st.integers(0, len(shape) - 1))
        how = data.draw(st.sampled_from(["sum", "max", "min"] if t != "pred" else ["any", "all"]))
        fn = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min, "any": jnp.any, "all": jnp.all}[how]
        x = sub()
        if how in ("max", "min") and kind(t) == "float" and shape[axis] == 0:
            how = "sum"          # jnp.max of an empty float axis raises in jax; sum is the empty reduction
            fn = jnp.sum
        if how in ("max", "min") and shape[axis] == 0:
            return x
        jt = jnp.dtype(NP[t])
        return Expr(lambda e: jnp.broadcast_to(fn(x(e), axis=axis, keepdims=True).astype(jt), shape), t,
                    f"{how}({x.text}, axis={axis})")
    if choice == "movement" and shape:
        axis = data.draw(st.integers(0, len(shape) - 1))
        how = data.draw(st.sampled_from(["flip", "roll", "pad_slice", "transpose"]))
        x = sub()
        if how == "transpose" and len(shape) >= 2 and shape[-1] == shape[-2]:
            return Expr(lambda e: jnp.swapaxes(x(e), -1, -2), t, f"transpose({x.text})")
        if how == "roll":
            return Expr(lambda e: jnp.roll(x(e), 1, axis=axis), t, f"roll({x.text}, axis={axis})")
        if how == "pad_slice":
            def pad_slice(v):
                padded = lax.pad(v, jnp.zeros((), v.dtype), [(1, 0, 0) if d == axis else (0, 0, 0)
                                                            for d in range(len(shape))])
                return lax.slice_in_dim(padded, 0, shape[axis], axis=axis)
            return Expr(lambda e: pad_slice(x(e)), t, f"shift_in_zero({x.text}, axis={axis})")
        return Expr(lambda e: jnp.flip(x(e), axis=axis), t, f"flip({x.text}, axis={axis})")
    if choice == "cond":
        x, y, p = sub(), sub(), sub("pred" if t != "pred" else t)
        f1, f2 = _unary(data, Expr(lambda v: v, t, "c")), _unary(data, Expr(lambda v: v, t, "c"))
        return Expr(lambda e: lax.cond(jnp.any(p(e)), lambda c: f1(c[0]), lambda c: f2(c[1]), (x(e), y(e))), t,
                    f"cond(any({p.text}), {f1.text}, {f2.text}, {x.text}, {y.text})")
    if choice in ("loop", "while"):
        trips = data.draw(st.integers(0, 4))
        x, y = sub(), sub()
        step = _binary(data, Expr(lambda c: c[0], t, "carry"), Expr(lambda c: c[1], t, "y"))
        if choice == "loop":
            return Expr(lambda e: lax.fori_loop(0, trips, lambda i, c: (step(c), c[0]), (x(e), y(e)))[0], t,
                        f"fori_loop({trips}, carry, y = {step.text}, carry; {x.text}, {y.text})")
        return Expr(lambda e: lax.while_loop(lambda c: c[2] < trips, lambda c: (step(c), c[0], c[2] + 1),
                                             (x(e), y(e), jnp.int32(0)))[0], t,
                    f"while({trips}, carry, y = {step.text}, carry; {x.text}, {y.text})")
    if choice == "scan" and shape and shape[0]:
        x, init = sub(), sub()
        step = _binary(data, Expr(lambda c: c[0], t, "carry"), Expr(lambda c: c[1], t, "row"))

        def scanned(e):
            first = init(e)[0]
            carry, ys = lax.scan(lambda c, row: (step((c, row)), c), first, x(e))
            return ys
        return Expr(scanned, t, f"scan(carry, row: {step.text}; {init.text}[0] over {x.text})")
    return leaf


def values(t: str, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    dt = np.dtype(NP[t])
    if t == "pred":
        return rng.integers(0, 2, shape).astype(bool)
    if t == "c64":
        with np.errstate(invalid="ignore"):
            return (values("f32", shape, rng) + 1j * values("f32", shape, rng)).astype(dt)
    if kind(t) == "int":
        info = ml_dtypes.iinfo(dt)
        wide = rng.integers(int(info.min), int(info.max), shape, dtype=np.int64, endpoint=True)
        small = rng.integers(-3, 4, shape)
        return np.where(rng.random(shape) < 0.5, small, wide).astype(dt)
    x = rng.integers(-8, 9, shape) / rng.choice([1, 2, 4], shape)
    special = rng.choice(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 0.1, 1e3]), shape)
    with np.errstate(over="ignore"):
        return np.where(rng.random(shape) < 0.1, special, x).astype(dt)


class _Drawer:
    """`data.draw` for expr(): st.composite's `draw` behind the same interface as st.data()."""

    def __init__(self, draw):
        self.draw = draw


@st.composite
def program(draw):
    """(the program's output expression, its inputs)."""
    t = draw(st.sampled_from(DTYPES))
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.sampled_from([2, 3, 5, 1, 0]), min_size=rank, max_size=rank)))
    n_inputs = draw(st.integers(1, 3))
    body = expr(_Drawer(draw), t, shape, t, n_inputs, draw(st.integers(2, 4)), top=True)
    seed = draw(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    inputs = [values(t, shape, rng) for _ in range(n_inputs)]
    return body, inputs


def close(got, want, dtype: str, what: str):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: {got.dtype}{list(got.shape)}, XLA:CPU {want.dtype}{list(want.shape)}"
    if want.dtype.kind in "biu" or want.dtype in (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)):
        bad = got.astype(np.int64) != want.astype(np.int64)
        assert not bad.any(), f"{what}: {bad.sum()} of {want.size} differ: got {got[bad][:5]}, XLA:CPU {want[bad][:5]}"
        return
    tol = PRECISION[dtype if want.dtype.kind != "c" else "c64"]
    for part in ((np.real, np.imag) if want.dtype.kind == "c" else (lambda v: v,)):
        g = flush_denormals(part(got).astype(np.float64))
        w = flush_denormals(part(want).astype(np.float64))
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        finite = np.isfinite(g) & np.isfinite(w)
        scale = np.abs(w[np.isfinite(w)]).max(initial=0.0)
        with np.errstate(invalid="ignore"):
            near = finite & (np.abs(g - w) <= tol * np.maximum(np.abs(w), scale))
        bad = ~(same | near)
        assert not bad.any(), (f"{what}: {bad.sum()} of {want.size} elements off (tolerance {tol:g} of the output's "
                               f"scale {scale:g}): got {g[bad][:5]}, XLA:CPU {w[bad][:5]}")


def check_program(body: Expr, inputs: list, options_list, described=note):
    dtype = body.dtype

    def f(*xs):
        return body(xs)
    described(f"program ({dtype}{list(inputs[0].shape)}): {body.text}")
    lowered = jax.jit(f, keep_unused=True).lower(*inputs)
    compiled = lowered.compile()
    want = [np.asarray(w) for w in flatten(compiled(*inputs))]
    for kind_, text in (("pre", lowered.as_text(dialect="hlo")), ("opt", compiled.as_text())):
        for options in options_list:
            got = flatten(hloexec.load(text, **options).run(*inputs))
            assert len(got) == len(want)
            for k, (g, w) in enumerate(zip(got, want)):
                close(g, w, dtype, f"{kind_} {options or 'defaults'} out{k} of {body.text}")


SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(program())
def test_random_programs_match_xla(case):
    check_program(*case, [{}])


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES, **SETTINGS)
@given(program())
def test_many_random_programs_match_xla_in_every_tier(case):
    check_program(*case, [{}, {"compile": "eager"}, {"use_numba": False}])


SUB_BYTE_PROGRAMS = {
    "sort": lambda a: jnp.sort(a, axis=1),
    "sort_descending": lambda a: -jnp.sort(-a, axis=1),
    "max_reduce": lambda a: lax.reduce(a, np.array(ml_dtypes.iinfo(a.dtype).min, a.dtype), lax.max, (1,)),
    "sum_reduce": lambda a: lax.reduce(a, np.array(0, a.dtype), lax.add, (1,)),
    "cummax": lambda a: lax.cummax(a, 1),
    "scatter_add": lambda a: a.at[np.array([0, 0, 1])].add(a),
    "argmax": lambda a: jnp.argmax(a, axis=1),
    "mul_shift": lambda a: lax.shift_right_arithmetic(a * a, a),
}


@pytest.mark.parametrize("t", ["s4", "u4"])
@pytest.mark.parametrize("name", sorted(SUB_BYTE_PROGRAMS))
def test_sub_byte_programs_match_xla(name, t):
    """Sort keys, reductions and scatter of 4-bit integers (the ops the generated programs leave out for them:
    jax's jnp.sum refuses s4). Their sort keys were read as unsigned bytes and ml_dtypes has no reduce loop."""
    x = values(t, (3, 5), np.random.default_rng(len(name)))
    body = Expr(lambda e: SUB_BYTE_PROGRAMS[name](e[0]), t, name)
    check_program(body, [x], [{}], described=print)
