"""Every opcode jax emits, run by hloexec and compared with XLA:CPU (jax's own outputs for the same inputs).

Each program is lowered twice: pre-optimization HLO (`lower().as_text(dialect="hlo")`, one instruction per
op, run by the numpy reference ops) and XLA:CPU post-optimization HLO (`compile().as_text()`, fusions:
run with Numba fused kernels and with `use_numba=False`).

Elementwise families are written as ONE select tree per (family, dtype): row k of an [K, N] output is
op k applied to row k of the inputs (`where(row == k, op_k(x), ...)`), so XLA fuses a whole family into
one loop fusion (one Numba compile instead of K) while every op still sees its own inputs.

Tolerances (ULPs of the result type; 0 = bit-exact):
* ints, pred, data movement, convert, bitcast-convert, compare, select, clamp, sort, gather/scatter: exact;
* f16 / bf16 elementwise: exact except the transcendentals (XLA computes them in f32 with its own
  approximations, then rounds: 1 ULP of the half type when the f32 result straddles a rounding boundary);
* f32 / f64 add, subtract, multiply, divide, sqrt, remainder, max/min, rounding ops: exact (IEEE);
* f32 / f64 transcendentals (and power, atan2): 8 ULP (XLA:CPU uses its own polynomial approximations);
* reductions and dots: |got - want| <= (n + 1) * eps * sum|terms| (any summation order).
"""
from __future__ import annotations

import functools
import zlib

import numpy as np
import pytest

import hloexec
from xla_compare import BF16, assert_close, flatten, is_float, sum_bound

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
from jax import lax  # noqa: E402

jax.config.update("jax_enable_x64", True)

pytestmark = pytest.mark.xla

DTYPES = {"pred": np.bool_, "s8": np.int8, "s32": np.int32, "s64": np.int64, "u8": np.uint8, "u32": np.uint32,
          "f16": np.float16, "bf16": BF16, "f32": np.float32, "f64": np.float64}
FLOATS = ("f16", "bf16", "f32", "f64")
SIGNED = ("s8", "s32", "s64")
UNSIGNED = ("u8", "u32")
INTS = SIGNED + UNSIGNED
MOVEMENT_DTYPES = ("pred", "u8", "bf16", "f32", "s64")     # one per element width (+ pred, + a half float)
N = 64                                                       # elements per row of a family's output

# f32 / f64 transcendentals: measured max against XLA:CPU is 1-5 ULP (64 samples per op, every variant; expm1 f32
# 5 ULP and tanh f64 3 ULP in a clean CI run: XLA's vectorized approximations vary with alignment/tails);
# f16 / bf16: computed in f32 and rounded once (f16 expm1 measured 1 ULP off, the others exact).
TRANSCENDENTAL = {"exponential", "exponential-minus-one", "log", "log-plus-one", "sine", "cosine", "tan", "tanh",
                  "logistic", "erf", "cbrt", "rsqrt", "power", "atan2"}
TRANSCENDENTAL_ULPS = 8
HALF_TRANSCENDENTAL_ULPS = 1


def rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))     # hash() is salted per process


def floats(dtype, shape, r, lo=-4.0, hi=4.0, specials=False):
    x = np.asarray(r.uniform(lo, hi, shape))
    if x.ndim:
        x[..., ::7] = np.round(x[..., ::7] * 2) / 2    # halves: rounding ties
    if specials:
        flat = x.reshape(-1)
        flat[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 2.5]
    return x.astype(dtype)


def ints(dtype, shape, r, edges=True):
    info = np.iinfo(dtype)
    x = r.integers(max(info.min, -100), min(info.max, 100), shape, endpoint=True).astype(dtype)
    if edges and x.size >= 5:
        x.reshape(-1)[:5] = [info.min, info.max, 0, 1, info.max - 1]
    return x


def sample(dt, shape, r, **kw):
    dtype = DTYPES[dt]
    if dt == "pred":
        return r.integers(0, 2, shape).astype(np.bool_)
    if dt in FLOATS:
        return floats(dtype, shape, r, **kw)
    return ints(dtype, shape, r)


def select_tree(ops, *rows_inputs):
    """[K, N] output whose row k is ops[k](*inputs) at row k."""
    row = lax.broadcasted_iota(jnp.int32, rows_inputs[0].shape, 0)
    out = ops[-1](*rows_inputs)
    for k in range(len(ops) - 2, -1, -1):
        out = jnp.where(row == k, ops[k](*rows_inputs), out)
    return out


# -- the programs --------------------------------------------------------------------------------------
class Program:
    """A jax function + inputs: its pre/post-optimization HLO and jax's (XLA:CPU's) outputs."""

    def __init__(self, fn, args, checks):
        self.args = [np.asarray(a) for a in args]
        jitted = jax.jit(fn)
        lowered = jitted.lower(*self.args)
        compiled = lowered.compile()
        self.text = {"pre": lowered.as_text(dialect="hlo"), "opt": compiled.as_text()}
        self.want = [np.asarray(o) for o in jax.tree_util.tree_leaves(compiled(*self.args))]
        self.checks = checks          # per output: list of (label, row or None, tolerance dict)


def float_unary_ops():
    return {"abs": lax.abs, "negate": lax.neg, "sign": lax.sign, "ceil": lax.ceil, "floor": lax.floor,
            "round-nearest-even": lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN),
            "round-nearest-afz": lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO),
            "sqrt": lax.sqrt, "rsqrt": lax.rsqrt, "cbrt": lax.cbrt, "exponential": lax.exp,
            "exponential-minus-one": lax.expm1, "log": lax.log, "log-plus-one": lax.log1p, "sine": lax.sin,
            "cosine": lax.cos, "tan": lax.tan, "tanh": lax.tanh, "logistic": lax.logistic, "erf": lax.erf}


POSITIVE_DOMAIN = {"sqrt", "rsqrt", "log", "log-plus-one", "power"}
EXACT_WITH_SPECIALS = {"abs", "negate", "sign", "ceil", "floor", "round-nearest-even", "round-nearest-afz", "sqrt",
                       "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum"}


def float_tolerance(op, dt):
    if op not in TRANSCENDENTAL:
        return 0
    return HALF_TRANSCENDENTAL_ULPS if dt in ("f16", "bf16") else TRANSCENDENTAL_ULPS


def family_inputs(ops, dt, r, arity):
    dtype = DTYPES[dt]
    rows = []
    for op in ops:
        if op in POSITIVE_DOMAIN:
            rows.append([floats(dtype, (N,), r, 0.05, 8.0) for _ in range(arity)])
        else:
            rows.append([floats(dtype, (N,), r, specials=op in EXACT_WITH_SPECIALS) for _ in range(arity)])
    return [np.stack([row[i] for row in rows]) for i in range(arity)]


def family_program(ops: dict, dt, arity, tolerance):
    names = list(ops)
    fns = list(ops.values())
    args = family_inputs(names, dt, rng("family", dt, *names), arity)
    return Program(lambda *xs: select_tree(fns, *xs), args, [[(n, k, tolerance(n, dt)) for k, n in enumerate(names)]])


def int_binary_ops():
    return {"add": lax.add, "subtract": lax.sub, "multiply": lax.mul, "divide": lax.div, "remainder": lax.rem,
           "maximum": lax.max, "minimum": lax.min, "and": lax.bitwise_and, "or": lax.bitwise_or,
           "xor": lax.bitwise_xor, "shift-left": lax.shift_left, "shift-right-logical": lax.shift_right_logical,
           "shift-right-arithmetic": lax.shift_right_arithmetic}


def int_inputs(dt, r, k):
    dtype = DTYPES[dt]
    x, y = ints(dtype, (k, N), r), ints(dtype, (k, N), r)
    bits = np.iinfo(dtype).bits
    y[:, :3] = np.array([0, -1 if dt in SIGNED else 0, bits], dtype=np.int64).astype(dtype)   # x/0, MIN/-1, shift >= bits
    y[:, 3:8] = r.integers(0, bits, 5).astype(dtype)
    return x, y


def int_binary_program(dt):
    ops = int_binary_ops()
    x, y = int_inputs(dt, rng("ibin", dt), len(ops))
    fns = list(ops.values())
    return Program(lambda a, b: select_tree(fns, a, b), [x, y], [[(n, k, 0) for k, n in enumerate(ops)]])


def int_unary_program(dt):
    ops = {"negate": lax.neg, "not": lax.bitwise_not, "popcnt": lax.population_count,
           "count-leading-zeros": lax.clz}
    if dt in SIGNED:
        ops |= {"abs": lax.abs, "sign": lax.sign}
    x = ints(DTYPES[dt], (len(ops), N), rng("iun", dt))
    fns = list(ops.values())
    return Program(lambda a: select_tree(fns, a), [x], [[(n, k, 0) for k, n in enumerate(ops)]])


def pred_program():
    ops = {"and": lax.bitwise_and, "or": lax.bitwise_or, "xor": lax.bitwise_xor, "not": lambda a, b: ~a,
           "select": lambda a, b: lax.select(a, b, a), "compare": lambda a, b: a == b}
    r = rng("pred")
    x, y = (r.integers(0, 2, (len(ops), N)).astype(bool) for _ in range(2))
    fns = list(ops.values())
    return Program(lambda a, b: select_tree(fns, a, b), [x, y], [[(n, k, 0) for k, n in enumerate(ops)]])


COMPARE = {"EQ": lax.eq, "NE": lax.ne, "LT": lax.lt, "LE": lax.le, "GT": lax.gt, "GE": lax.ge}


def compare_select_clamp_program(dt):
    """compare (6 directions) -> pred rows; select and clamp -> a second output of the input type."""
    r = rng("cmp", dt)
    k = len(COMPARE)
    x = sample(dt, (k, N), r, specials=True) if dt in FLOATS else sample(dt, (k, N), r)
    y = x.copy()
    y.reshape(-1)[::3] = sample(dt, (k * N,), r)[::3]      # ties where y == x
    if dt in FLOATS:
        y.reshape(-1)[7:11] = np.array([np.nan, 0.0, -0.0, np.inf]).astype(x.dtype)
    p = r.integers(0, 2, (2, N)).astype(bool)
    fns = list(COMPARE.values())

    def f(a, b, pred):
        lo = jnp.minimum(b[:2], b[2:4])
        hi = jnp.maximum(b[:2], b[2:4])
        chosen = jnp.stack([lax.select(pred[0], a[0], b[0]), lax.clamp(lo[1], a[1], hi[1])])
        return select_tree(fns, a, b), chosen
    return Program(f, [x, y, p], [[(f"compare-{d}", i, 0) for i, d in enumerate(COMPARE)],
                                  [("select", 0, 0), ("clamp", 1, 0)]])


def convert_program(dst):
    """Row k of the output: convert(x_k) from source dtype k to `dst` (float -> int saturates, NaN -> 0)."""
    sources = [dt for dt in DTYPES if dt != dst]
    r = rng("convert", dst)
    args = []
    for dt in sources:
        if dt in FLOATS:
            x = floats(DTYPES[dt], (N,), r, -300.0, 300.0, specials=True)
            x[6:10] = np.array([1e10, -1e10, 255.5, -128.5]).astype(DTYPES[dt]) if dt != "f16" else x[6:10]
        else:
            x = sample(dt, (N,), r)
        args.append(x)
    target = jnp.dtype(DTYPES[dst])

    def f(*xs):
        return jnp.stack([lax.convert_element_type(x, target) for x in xs])
    return Program(f, args, [[(f"convert-from-{s}", k, 0) for k, s in enumerate(sources)]])


BITCAST_GROUPS = [("s8", "u8"), ("f16", "bf16"), ("s32", "u32", "f32"), ("s64", "f64")]


def bitcast_convert_program(dst):
    group = next(g for g in BITCAST_GROUPS if dst in g)
    sources = [s for s in group if s != dst]
    r = rng("bitcast", dst)
    args = [sample(s, (N,), r) for s in sources]
    target = jnp.dtype(DTYPES[dst])

    def f(*xs):
        return jnp.stack([lax.bitcast_convert_type(x, target) for x in xs])
    return Program(f, args, [[(f"bitcast-convert-from-{s}", k, "bits") for k, s in enumerate(sources)]])


def reduce_precision_program(dt):
    formats = [(5, 10), (8, 7), (5, 2), (4, 3)]
    x = floats(DTYPES[dt], (len(formats), N), rng("rp", dt), -70000.0, 70000.0, specials=True)
    x[:, 10:20] *= 1e-6
    fns = [functools.partial(lax.reduce_precision, exponent_bits=e, mantissa_bits=m) for e, m in formats]
    return Program(lambda a: select_tree(fns, a), [x], [[(f"reduce-precision-e{e}m{m}", k, 0)
                                                          for k, (e, m) in enumerate(formats)]])


def movement_program(dt):
    """iota, broadcast, reshape, transpose, slice, reverse, pad (negative + interior), concatenate,
    dynamic-slice (clamped start), dynamic-update-slice, gather, scatter, copy."""
    r = rng("move", dt)
    x = sample(dt, (4, 6, 5), r)
    upd = sample(dt, (2, 3, 5), r)
    pad_value = sample(dt, (), r)
    perm = r.permutation(6)
    idx = np.concatenate([perm, perm[:1]]).astype(np.int32)
    names = ["iota", "broadcast", "reshape", "transpose", "slice", "reverse", "pad", "concatenate",
             "dynamic-slice", "dynamic-update-slice", "gather", "scatter"]
    dtype = jnp.dtype(DTYPES[dt])

    def f(a, u, pv, i):
        return (lax.convert_element_type(lax.broadcasted_iota(jnp.int32, (3, 7), 1), dtype) if dt != "pred"
                else lax.broadcasted_iota(jnp.int32, (3, 7), 1) % 2 == 0,
                lax.broadcast_in_dim(a[0, :, 0], (3, 6, 2), (1,)),
                a.reshape(5, 24),
                a.transpose(2, 0, 1),
                lax.slice(a, (1, 0, 1), (4, 6, 5), (2, 3, 2)),
                lax.rev(a, (0, 2)),
                lax.pad(a, pv, ((1, -1, 1), (0, 2, 0), (-2, 1, 2))),
                lax.concatenate([a, a[:2], jnp.tile(u, (1, 2, 1))[:1]], 0),
                lax.dynamic_slice(a, (i[0], i[1] + 4, jnp.int32(-1)), (2, 3, 5)),
                lax.dynamic_update_slice(a, u, (i[2], i[3], jnp.int32(0))),
                jnp.take(a, i, axis=1),
                a.at[:, i[:3]].set(jnp.concatenate([u, u], 0)),    # distinct rows: no write order
                )
    return Program(f, [x, upd, pad_value, idx], [[(n, None, 0)] for n in names])


def reduce_program(dt):
    r = rng("reduce", dt)
    if dt == "pred":
        x = r.integers(0, 2, (6, 40)).astype(bool)
        return Program(lambda a: (a.all(1), a.any(0)), [x], [[("reduce-and", None, 0)], [("reduce-or", None, 0)]])
    x = sample(dt, (6, 40), r) if dt not in FLOATS else floats(DTYPES[dt], (6, 40), r, -2.0, 2.0)

    def f(a):
        return (a.sum(1, dtype=a.dtype), a[:, :4].prod(0, dtype=a.dtype), a.max(1), a.min(0),
                jnp.argmax(a, 1).astype(jnp.int32))
    return Program(f, [x], [[("reduce-add", None, "sum")], [("reduce-multiply", None, "prod")],
                            [("reduce-max", None, 0)], [("reduce-min", None, 0)], [("reduce-argmax", None, 0)]])


def dot_program(dt):
    r = rng("dot", dt)
    a, b = sample(dt, (2, 5, 12), r), sample(dt, (2, 12, 7), r)
    if dt in INTS:
        a, b = (np.clip(v, -9, 9).astype(v.dtype) if dt in SIGNED else (v % 10).astype(v.dtype) for v in (a, b))
    if dt in FLOATS:
        a, b = (floats(DTYPES[dt], v.shape, r, -1.0, 1.0) for v in (a, b))
    return Program(lambda x, y: lax.dot_general(x, y, (((2,), (1,)), ((0,), (0,)))), [a, b],
                   [[("dot", None, ("dot", 12))]])


def window_program(dt):
    """reduce-window (max pool, cumulative sum) and select-and-scatter (max-pool gradient)."""
    r = rng("window", dt)
    x = floats(DTYPES[dt], (2, 9, 8), r, -2.0, 2.0)

    def pool(a):
        return lax.reduce_window(a, -jnp.inf, lax.max, (1, 3, 2), (1, 2, 2), "VALID")

    def f(a):
        return pool(a), lax.reduce_window(a, 0.0, lax.add, (1, 1, 3), (1, 1, 1), ((0, 0), (0, 0), (2, 0))), \
            jax.grad(lambda v: pool(v).astype(jnp.float32).sum())(a)
    return Program(f, [x], [[("reduce-window-max", None, 0)], [("reduce-window-add", None, ("window", 3))],
                            [("select-and-scatter", None, 0)]])


def conv_program(dt):
    r = rng("conv", dt)
    x, w = floats(DTYPES[dt], (2, 7, 6, 3), r, -1, 1), floats(DTYPES[dt], (3, 2, 3, 4), r, -1, 1)

    def f(a, k):
        return lax.conv_general_dilated(a, k, (1, 2), ((1, 1), (0, 1)), rhs_dilation=(1, 2),
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return Program(f, [x, w], [[("convolution", None, ("dot", 18))]])


def sort_program(dt):
    r = rng("sort", dt)
    keys = sample(dt, (3, 20), r)
    keys[:, 5:9] = keys[:, :4]                 # ties: stability
    vals = np.arange(60, dtype=np.int32).reshape(3, 20)

    def f(k, v):
        return lax.sort((k, v), dimension=1, is_stable=True, num_keys=1), lax.top_k(k.astype(jnp.float32), 4)
    return Program(f, [keys, vals], [[("sort", None, 0)], [("sort-values", None, 0)], [("topk", None, 0)],
                                     [("topk-indices", None, 0)]])


def control_program(dt):
    """while (fori_loop), conditional (cond and switch), call, tuple / get-tuple-element,
    optimization-barrier."""
    r = rng("control", dt)
    x = sample(dt, (5,), r) if dt not in FLOATS else floats(DTYPES[dt], (5,), r, -1, 1)
    n = np.int32(r.integers(0, 3))

    def f(a, k):
        looped = lax.fori_loop(0, 3, lambda i, c: (c[0] + c[1], c[1][::-1]), (a, a))[0] if dt != "pred" else a
        branched = lax.cond(k > 0, lambda v: v[::-1], lambda v: v, a)
        switched = lax.switch(k, [lambda v: v, lambda v: lax.rev(v, (0,)), lambda v: jnp.roll(v, 1)], a)
        return lax.optimization_barrier((looped, branched, switched))
    return Program(f, [x, n], [[("while", None, 0)], [("conditional", None, 0)], [("conditional-switch", None, 0)]])


def _float_binary(dt):
    ops = {"add": lax.add, "subtract": lax.sub, "multiply": lax.mul, "divide": lax.div, "remainder": lax.rem,
           "maximum": lax.max, "minimum": lax.min, "power": lax.pow, "atan2": lax.atan2}
    return family_program(ops, dt, 2, float_tolerance)


PROGRAMS = {}
for _dt in FLOATS:
    PROGRAMS[f"float-unary-{_dt}"] = functools.partial(family_program, float_unary_ops(), _dt, 1, float_tolerance)
    PROGRAMS[f"float-binary-{_dt}"] = functools.partial(_float_binary, _dt)
    PROGRAMS[f"window-{_dt}"] = functools.partial(window_program, _dt)
for _dt in INTS:
    PROGRAMS[f"int-binary-{_dt}"] = functools.partial(int_binary_program, _dt)
    PROGRAMS[f"int-unary-{_dt}"] = functools.partial(int_unary_program, _dt)
PROGRAMS["pred-logic"] = pred_program
for _dt in DTYPES:
    PROGRAMS[f"compare-select-clamp-{_dt}"] = functools.partial(compare_select_clamp_program, _dt)
    PROGRAMS[f"convert-to-{_dt}"] = functools.partial(convert_program, _dt)
    PROGRAMS[f"reduce-{_dt}"] = functools.partial(reduce_program, _dt)
for _dt in [d for g in BITCAST_GROUPS for d in g]:
    PROGRAMS[f"bitcast-convert-to-{_dt}"] = functools.partial(bitcast_convert_program, _dt)
for _dt in ("f32", "f64"):
    PROGRAMS[f"reduce-precision-{_dt}"] = functools.partial(reduce_precision_program, _dt)
for _dt in MOVEMENT_DTYPES:
    PROGRAMS[f"movement-{_dt}"] = functools.partial(movement_program, _dt)
    PROGRAMS[f"control-{_dt}"] = functools.partial(control_program, _dt)
for _dt in ("s8", "s32", "u8", "f16", "bf16", "f32", "f64"):
    PROGRAMS[f"dot-{_dt}"] = functools.partial(dot_program, _dt)
for _dt in ("f16", "bf16", "f32", "f64"):
    PROGRAMS[f"conv-{_dt}"] = functools.partial(conv_program, _dt)
for _dt in ("s32", "u8", "f16", "bf16", "f32", "f64"):
    PROGRAMS[f"sort-{_dt}"] = functools.partial(sort_program, _dt)


@functools.cache
def program(name) -> Program:
    return PROGRAMS[name]()


def bound_for(kind, got_dtype, args, want):
    """Absolute bound for sums: (n + 1) * eps * sum|terms| with the terms recomputed in f64."""
    tag, n = kind if isinstance(kind, tuple) else (kind, None)
    if tag == "sum":
        return sum_bound(np.abs(args[0].astype(np.float64)).sum(1), args[0].shape[1], got_dtype)
    if tag == "prod":
        return sum_bound(np.abs(want.astype(np.float64)), 4, got_dtype)
    if tag == "dot" and len(args[0].shape) == 3 and args[0].shape[-1] == n:
        terms = np.einsum("bik,bkj->bij", np.abs(args[0].astype(np.float64)), np.abs(args[1].astype(np.float64)))
        return sum_bound(terms, n, got_dtype)
    # convolution / window sums: a loose bound from the output magnitude scale
    scale = np.abs(args[0].astype(np.float64)).max() * (np.abs(args[1].astype(np.float64)).max()
                                                          if len(args) > 1 else 1.0)
    return sum_bound(np.full(want.shape, scale * n), n, got_dtype)


def check_outputs(prog: Program, got, label):
    outs = flatten(got)
    assert len(outs) == len(prog.want), f"{label}: {len(outs)} outputs, jax has {len(prog.want)}"
    for out, want, checks in zip(outs, prog.want, prog.checks):
        for op_name, row, tol in checks:
            g = out if row is None else out[row]
            w = want if row is None else want[row]
            what = f"{label}: {op_name}"
            if tol == "bits":
                assert_close(g, w, flush=False, what=what)
            elif isinstance(tol, (str, tuple)) and is_float(w.dtype):
                assert_close(g, w, bound=bound_for(tol, w.dtype, prog.args, w), what=what)
            else:
                assert_close(g, w, ulps=tol if isinstance(tol, int) else 0, what=what)


VARIANTS = [("pre", True), ("opt", True), ("opt", False)]


@pytest.mark.parametrize("kind,numba", VARIANTS, ids=["pre", "opt-numba", "opt-numpy"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_matches_xla_cpu(name, kind, numba):
    prog = program(name)
    exe = hloexec.load(prog.text[kind], use_numba=numba, compile="eager")
    check_outputs(prog, exe.run(*prog.args), f"{name} [{kind}, numba={numba}]")
