"""Random small programs for the verdict's soundness search (tests/test_verdict_soundness.py), and numpy
emulations of what devices compute for them, written from the devices' documented rules
(docs/device-numerics.md), not from hloexec's code.

A program is a list of `Op`s over 2-D values (parameters, elementwise chains, select on a compare, converts
between f16 / bf16 / f32, sum and max reductions broadcast back, transposes, dots with precision configs and
algorithms) printed as HLO text; `emulate(program, device, order, rng)` evaluates it in numpy under one device's
rules:

- elementwise ops: 16-bit operands widened to f32, the op computed, the result rounded to the type (XLA widens
  f16/bf16 elementwise ops to f32 on every backend); f32 arithmetic correctly rounded; f32 transcendentals off
  by up to 2 f32 ulps (CUDA's documented maximum for expf, tanhf, rsqrtf; logf's is 1), as a GPU's would be.
  `excess` (tpu, a100: `--xla_allow_excess_precision`): 16-bit elementwise results stay f32 until a value
  leaves the chain (an output, a dot's operand, an explicit convert).
- sums: `reference` / tpu / a100 accumulate 16-bit terms in f32 and round once, in `order` (sequential,
  reversed, pairwise, 8 lanes); `xla-cpu`: every step rounded to the type, in windows of 32 and then over the
  windows' sums (TreeReductionRewriter, window 32), f32 sums in 8 lanes; `fma` (xla-cpu): a multiply feeding an
  add rounds once; `flush` (xla-cpu: FTZ and DAZ, tsl::port::ScopedFlushDenormal around every XLA:CPU run): f32 and
  bf16 arithmetic (elementwise ops, compares, max, sums, dots: every step) reads operands below f32's smallest
  normal as 0 and makes results below it 0; negate, abs, selects and converts keep them; a divide by a broadcast
  (xla-cpu: XLA's algebraic simplifier) is a multiply by the reciprocal, computed in f32 (rounded to f16 for f16);
  an f16 / f32 divide of divides is its HandleDivide rewrite ((A / B) / C => A / (B * C)...: `divide_of_divides`),
  exp(A) / exp(B) is exp(A - B) (`exp_of_differences`).
- dots: products of the algorithm's operands (exact in f32) accumulated in f32 in `order`; f32 operands cut per
  the algorithm: tpu DEFAULT / HIGH / HIGHEST one / three / six bf16 passes (hi = the f32's top 16 bits, lo =
  bf16(x - hi)), f32 for a matrix-vector dot; a100 DEFAULT / HIGH TF32 (10 stored bits, to nearest), HIGHEST
  f32; an explicit `algorithm=` as it says (xla-cpu ignores it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16
DTYPES = {"f16": np.dtype(np.float16), "bf16": np.dtype(BF16), "f32": np.dtype(np.float32)}
UNARY = {
    "exponential": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "negate": np.negative,
    "abs": np.abs,
}
TRANSCENDENTAL = {"exponential", "log", "tanh", "rsqrt"}
BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide, "maximum": np.maximum}
DEVICES = ("reference", "tpu", "a100", "xla-cpu")
ORDERS = ("sequential", "reversed", "pairwise", "lanes")
ALGORITHMS = ("dot_bf16_bf16_f32", "dot_bf16_bf16_f32_x3", "dot_tf32_tf32_f32", "dot_f32_f32_f32")
RUNS = {
    "tpu": {"dot_bf16_bf16_f32", "dot_bf16_bf16_f32_x3", "dot_f32_f32_f32"}
}  # algorithm_util.cc: the TPU runs no TF32


@dataclass
class Op:
    name: str
    kind: str  # param, unary, binary, select, convert, reduce, broadcast, transpose, dot
    dtype: str
    shape: tuple
    operands: tuple = ()
    attr: dict = field(default_factory=dict)


@dataclass
class Program:
    ops: list
    outputs: list
    inputs: list
    seed: int = 0
    notes: str = ""

    def by_name(self) -> dict:
        return {o.name: o for o in self.ops}

    def text(self) -> str:
        return hlo_text(self)


def _shape(dtype: str, shape) -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


def hlo_text(p: Program) -> str:
    comps = sorted({(o.attr["reducer"], o.dtype) for o in p.ops if o.kind == "reduce"})
    lines = ["HloModule sound"]
    for reducer, t in comps:
        lines.append(
            f"{reducer}_{t} {{ a = {t}[] parameter(0)  b = {t}[] parameter(1)  ROOT r = {t}[] {reducer}(a, b) }}"
        )
    body = []
    ops = p.by_name()
    for o in p.ops:
        s, args = _shape(o.dtype, o.shape), ", ".join(o.operands)
        if o.kind == "param":
            body.append(f"{o.name} = {s} parameter({o.attr['index']})")
        elif o.kind in ("unary", "binary"):
            body.append(f"{o.name} = {s} {o.attr['op']}({args})")
        elif o.kind == "select":
            a, b, x, y = o.operands
            body.append(f"{o.name}.c = {_shape('pred', o.shape)} compare({a}, {b}), direction={o.attr['direction']}")
            body.append(f"{o.name} = {s} select({o.name}.c, {x}, {y})")
        elif o.kind == "convert":
            body.append(f"{o.name} = {s} convert({args})")
        elif o.kind == "reduce":
            init = "0" if o.attr["reducer"] == "add" else "-inf"
            body.append(f"{o.name}.init = {o.dtype}[] constant({init})")
            body.append(
                f"{o.name} = {s} reduce({args}, {o.name}.init), dimensions={{{o.attr['dim']}}}, "
                f"to_apply={o.attr['reducer']}_{o.dtype}"
            )
        elif o.kind == "broadcast":
            body.append(f"{o.name} = {s} broadcast({args}), dimensions={{{o.attr['dim']}}}")
        elif o.kind == "transpose":
            body.append(f"{o.name} = {s} transpose({args}), dimensions={{1,0}}")
        elif o.kind == "dot":
            extra = ""
            if o.attr.get("precision"):
                extra += f", operand_precision={{{o.attr['precision']},{o.attr['precision']}}}"
            if o.attr.get("algorithm"):
                extra += f", algorithm={o.attr['algorithm']}"
            body.append(
                f"{o.name} = {s} dot({args}), lhs_contracting_dims={{1}}, "
                f"rhs_contracting_dims={{{o.attr['rhs_contracting']}}}{extra}"
            )
    outs = [ops[n] for n in p.outputs]
    root = f"ROOT out = ({', '.join(_shape(o.dtype, o.shape) for o in outs)}) tuple({', '.join(p.outputs)})"
    lines.append("ENTRY main {\n  " + "\n  ".join(body + [root]) + "\n}")
    return "\n".join(lines)


# ---- inputs ---------------------------------------------------------------------------------------------------

SCALES = ("normal", "large", "tiny", "zeros", "repeated", "cancel", "positive")


def input_array(rng, dtype: str, shape, scale: str) -> np.ndarray:
    """Values of one scale: `large` near the type's overflow (f16: products and exp overflow), `tiny` subnormal
    (or nearly), `zeros` a third exact zeros, `repeated` one value (a sum's roundings repeat), `cancel` rows
    whose halves nearly cancel."""
    x = rng.standard_normal(shape)
    big = {"f16": 2e4, "bf16": 1e37, "f32": 1e37}[dtype]
    small = {"f16": 2e-6, "bf16": 1e-39, "f32": 1e-39}[dtype]
    if scale == "large":
        x = x * big / 4
    elif scale == "tiny":
        x = x * small
    elif scale == "zeros":
        x = np.where(rng.random(shape) < 0.33, 0.0, x)
    elif scale == "repeated":
        x = np.full(shape, 0.1) * rng.choice([1, -1, 3])
    elif scale == "cancel":
        half = x[..., : shape[-1] // 2]
        x[..., shape[-1] - half.shape[-1] :] = -half[..., ::-1] * (1 + 1e-3 * rng.standard_normal(half.shape))
    elif scale == "positive":
        x = np.abs(x) + 0.5
    return x.astype(np.float32).astype(DTYPES[dtype])


# ---- the generator --------------------------------------------------------------------------------------------

LENGTHS = (1, 2, 3, 17, 64, 255, 1000, 4096, 30000, 100000)


def generate(seed: int) -> Program:
    """A random program: 1-2 parameters of one [M, N] shape, 2-7 ops on them, its last values the outputs."""
    rng = np.random.default_rng(seed)
    t = str(rng.choice(["f16", "bf16", "f32"]))
    n = int(rng.choice(LENGTHS))
    m = int(rng.choice([1, 2, 3, 8])) if n <= 4096 else int(rng.choice([1, 2]))
    ops: list[Op] = []
    inputs: list[np.ndarray] = []
    scales = []

    def new(kind, dtype, shape, operands=(), **attr) -> Op:
        o = Op(f"v{len(ops)}", kind, dtype, tuple(shape), tuple(operands), attr)
        ops.append(o)
        return o

    def param(dtype, shape) -> Op:
        scale = str(rng.choice(SCALES))
        scales.append(scale)
        inputs.append(input_array(rng, dtype, shape, scale))
        return new("param", dtype, shape, index=len(inputs) - 1)

    pool = [param(t, (m, n))]
    if rng.random() < 0.6:
        pool.append(param(t, (m, n)))
    for _ in range(int(rng.integers(2, 8))):
        a = pool[int(rng.integers(len(pool)))] if rng.random() < 0.5 else pool[-1]
        partners = [p for p in pool if p.shape == a.shape and p.dtype == a.dtype]
        b = partners[int(rng.integers(len(partners)))]
        kind = str(rng.choice(["unary", "binary", "binary", "select", "convert", "reduce", "transpose", "dot"]))
        if kind == "unary":
            op = str(rng.choice(list(UNARY)))
            if op in ("log", "rsqrt"):  # of |a|: a NaN would make everything after it unjudged
                a = new("unary", a.dtype, a.shape, (a.name,), op="abs")
            pool.append(new("unary", a.dtype, a.shape, (a.name,), op=op))
        elif kind == "binary":
            pool.append(new("binary", a.dtype, a.shape, (a.name, b.name), op=str(rng.choice(list(BINARY)))))
        elif kind == "select":
            c = partners[int(rng.integers(len(partners)))]
            pool.append(
                new(
                    "select",
                    a.dtype,
                    a.shape,
                    (a.name, b.name, c.name, a.name),
                    direction=str(rng.choice(["GT", "LT", "GE"])),
                )
            )
        elif kind == "convert":
            pool.append(new("convert", str(rng.choice([d for d in DTYPES if d != a.dtype])), a.shape, (a.name,)))
        elif kind == "reduce" and len(a.shape) == 2:
            dim = int(rng.integers(2))
            r = new(
                "reduce",
                a.dtype,
                a.shape[1 - dim : 2 - dim],
                (a.name,),
                dim=dim,
                reducer=str(rng.choice(["add", "add", "maximum"])),
            )
            if rng.random() < 0.5:
                pool.append(r)  # an output of its own
            else:  # broadcast back and combined: x - mean(x), x / sum(x)
                back = new("broadcast", a.dtype, a.shape, (r.name,), dim=1 - dim)
                pool.append(
                    new(
                        "binary",
                        a.dtype,
                        a.shape,
                        (a.name, back.name),
                        op=str(rng.choice(["subtract", "divide", "add"])),
                    )
                )
        elif kind == "transpose" and len(a.shape) == 2:
            pool.append(new("transpose", a.dtype, a.shape[::-1], (a.name,)))
        elif kind == "dot" and len(a.shape) == 2 and a.shape[1] <= 4096:
            k, cols = a.shape[1], int(rng.choice([1, 4, 16]))
            transposed = bool(rng.random() < 0.5)
            w = param(a.dtype, (cols, k) if transposed else (k, cols))
            out = a.dtype if a.dtype == "f32" or rng.random() < 0.5 else "f32"
            attr = {"rhs_contracting": 1 if transposed else 0}
            if a.dtype == "f32" and rng.random() < 0.7:
                if rng.random() < 0.5:
                    attr["precision"] = str(rng.choice(["default", "high", "highest"]))
                else:
                    attr["algorithm"] = str(rng.choice(ALGORITHMS))
            pool.append(new("dot", out, (a.shape[0], cols), (a.name, w.name), **attr))
    outs = list(dict.fromkeys(o.name for o in pool[-int(rng.integers(1, 4)) :] if o.kind != "param"))
    if not outs:
        outs = [new("unary", pool[-1].dtype, pool[-1].shape, (pool[-1].name,), op="negate").name]
    return Program(ops, outs, inputs, seed, f"{t}[{m},{n}] inputs {', '.join(scales)}")


# ---- the emulations -------------------------------------------------------------------------------------------


def rounded(x, dtype: str) -> np.ndarray:
    """`x` (f32 or f64) rounded to nearest even in `dtype` (16-bit types from f32, as a device's convert)."""
    with np.errstate(over="ignore"):  # (past the type's largest value: its infinity, as a device's)
        x = np.asarray(x).astype(np.float32)
        return x if dtype == "f32" else x.astype(DTYPES[dtype])


def bf16_high(x: np.ndarray) -> np.ndarray:
    """An f32's top 16 bits (dot_algorithm_rewriter.cc: the high part of the multi-pass bf16 recipes)."""
    return (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def tf32(x: np.ndarray) -> np.ndarray:
    """f32 -> TF32 (10 stored significand bits), to nearest even."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    keep = ((b + 0xFFF + ((b >> 13) & 1)) & 0xFFFFE000).astype(np.uint32)
    return np.where(np.isfinite(x), keep.view(np.float32), x).astype(np.float32)


def _algorithm(device: str, op: Op, m: int, n: int) -> str:
    if op.attr.get("algorithm") and device != "xla-cpu":
        return op.attr["algorithm"]
    if device == "tpu" and min(m, n) > 1:
        return {"high": "dot_bf16_bf16_f32_x3", "highest": "dot_bf16_bf16_f32_x6"}.get(
            op.attr.get("precision", "default"), "dot_bf16_bf16_f32"
        )
    if device == "a100" and op.attr.get("precision", "default") != "highest":
        return "dot_tf32_tf32_f32"
    return "dot_f32_f32_f32"


def _matmul(a: np.ndarray, b: np.ndarray, order: str, flush: bool = False) -> np.ndarray:
    """a [M,K] @ b [K,N], f32 operands whose products are exact in f32 (unless below its normals, then rounded, or
    with `flush` 0), accumulated in f32 in `order`."""
    a, b = ftz(a.astype(np.float32), flush), ftz(b.astype(np.float32), flush)
    if order == "pairwise" and not flush:
        return np.matmul(a, b)
    products = a[:, :, None] * b[None, :, :]  # [M,K,N]
    return _sum_f32(products, 1, order, flush)


def ftz(x: np.ndarray, flush: bool = True) -> np.ndarray:
    """An f32 or bf16 value as a device that flushes subnormals (FTZ, DAZ: MXCSR's, XLA:CPU's) reads or makes it:
    magnitudes below f32's smallest normal 0 of their sign (others, or `flush` false: as it is)."""
    x = np.asarray(x)
    if not flush or x.dtype not in (np.dtype(np.float32), np.dtype(BF16)):
        return x
    return np.where(np.abs(x.astype(np.float32)) < np.finfo(np.float32).tiny, np.copysign(np.zeros((), x.dtype), x), x)


def stays_divide(ops: dict, name: str) -> bool:
    """Whether `name` is a divide XLA's HandleDivide (algebraic_simplifier.cc) still sees as one when it tries its
    divide-of-divides rules: before them, A / broadcast(B) (on CPU), A / exp(B) and A / rsqrt(B) become multiplies."""
    o = ops[name]
    if o.kind != "binary" or o.attr["op"] != "divide":
        return False
    d = ops[o.operands[1]]
    return d.kind != "broadcast" and not (d.kind == "unary" and d.attr["op"] in ("exponential", "rsqrt"))


def divide_of_divides(ops: dict, values: dict, o: Op, flush: bool) -> tuple[np.ndarray, np.ndarray]:
    """The (numerator, denominator) XLA:CPU divides for divide `o` (HandleDivide: (A / B) / (C / D) => (A * D) /
    (B * C), else (A / B) / C => A / (B * C), else A / (B / C) => (A * C) / B), each product rounded to `o`'s type
    (f16: the exact f32 product rounded; f32: flushed, FTZ and DAZ); the operands as they are where none applies."""
    p, q = o.operands
    inner = {n: ops[n].operands for n in (p, q) if stays_divide(ops, n)}
    if p in inner and q in inner:
        sides = ((inner[p][0], inner[q][1]), (inner[p][1], inner[q][0]))
    elif p in inner:
        sides = ((inner[p][0],), (inner[p][1], q))
    elif q in inner:
        sides = ((p, inner[q][1]), (inner[q][0],))
    else:
        sides = ((p,), (q,))

    def product(names):
        x = ftz(values[names[0]], flush)
        if len(names) == 1:
            return x.astype(np.float64)
        y = x.astype(np.float32) * ftz(values[names[1]], flush).astype(np.float32)  # (f16 x f16: exact in f32)
        return (ftz(y, flush) if o.dtype == "f32" else rounded(y, o.dtype)).astype(np.float64)

    return product(sides[0]), product(sides[1])


def _sum_f32(x: np.ndarray, axis: int, order: str, flush: bool = False) -> np.ndarray:
    """An f32 sum along `axis` in `order`: every step rounded to f32 (and with `flush`, flushed)."""
    x = ftz(np.moveaxis(np.asarray(x, np.float32), axis, 0), flush)
    if order == "pairwise" and flush and x.shape[0] > 1:
        h = x.shape[0] // 2
        return ftz(_sum_f32(x[:h], 0, order, flush) + _sum_f32(x[h:], 0, order, flush))
    if order == "pairwise" or x.shape[0] == 0:
        return np.add.reduce(x, axis=0, dtype=np.float32)
    if order == "lanes":  # 8 accumulators over the strided terms, then added in order
        lanes = [_sum_f32(x[k::8], 0, "sequential", flush) for k in range(min(8, x.shape[0]))]
        return _sum_f32(np.stack(lanes), 0, "sequential", flush)
    terms = x[::-1] if order == "reversed" else x
    acc = np.zeros(x.shape[1:], np.float32)
    for t in terms:
        acc = ftz(acc + t, flush)
    return acc


def _sum_per_step(x: np.ndarray, axis: int, dtype: str, window: int = 32, flush: bool = False) -> np.ndarray:
    """XLA:CPU's 16-bit sum: every step rounded to the type, in windows of `window` and then over the windows'
    sums (TreeReductionRewriter on a dim longer than the window); `flush`: f32 steps flushed (bf16's)."""
    x = np.moveaxis(np.asarray(x), axis, 0)
    if x.shape[0] > window:
        pad = -x.shape[0] % window
        x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
        parts = x.reshape((-1, window) + x.shape[1:])
        sums = np.stack([_sum_per_step(p, 0, dtype, window, flush) for p in parts])
        return _sum_per_step(sums, 0, dtype, window, flush)
    acc = np.zeros(x.shape[1:], DTYPES[dtype])
    for t in x:
        acc = rounded(ftz(ftz(acc.astype(np.float32), flush) + ftz(t.astype(np.float32), flush), flush), dtype)
    return acc


def _dot(device: str, op: Op, a: np.ndarray, b: np.ndarray, order: str) -> np.ndarray:
    if op.attr["rhs_contracting"] == 1:
        b = b.T
    m, n = a.shape[0], b.shape[1]
    flush = device == "xla-cpu"
    if a.dtype != np.float32:  # 16-bit operands: exact products, f32 accumulation, one rounding
        return rounded(_matmul(a, b, order, flush), op.dtype)
    alg = _algorithm(device, op, m, n)
    if alg == "dot_bf16_bf16_f32":
        return _matmul(rounded(a, "bf16"), rounded(b, "bf16"), order)
    if alg == "dot_tf32_tf32_f32":
        return _matmul(tf32(a), tf32(b), order)
    if alg in ("dot_bf16_bf16_f32_x3", "dot_bf16_bf16_f32_x6"):

        def parts(x, count):
            out, rest = [], x.astype(np.float32)
            for _ in range(count - 1):
                out.append(bf16_high(rest))
                rest = (rest - out[-1]).astype(np.float32)
            return out + [rounded(rest, "bf16").astype(np.float32)]

        if alg.endswith("x3"):
            (ah, al), (bh, bl) = parts(a, 2), parts(b, 2)
            low = _matmul(al, bh, order) + _matmul(ah, bl, order)
            return (low + _matmul(ah, bh, order)).astype(np.float32)
        (ah, am, al), (bh, bm, bl) = parts(a, 3), parts(b, 3)
        low = _matmul(am, bm, order)
        for x, y in ((ah, bl), (al, bh), (ah, bm), (am, bh)):
            low = low + _matmul(x, y, order)
        low = np.where(np.isnan(low), np.float32(0), low)
        return (low + _matmul(ah, bh, order)).astype(np.float32)
    # f32: products rounded to f32, f32 accumulation
    a64, b64 = ftz(a, flush).astype(np.float64), ftz(b, flush).astype(np.float64)
    products = (a64[:, :, None] * b64[None, :, :]).astype(np.float32)
    if order == "pairwise" and not flush:
        return np.add.reduce(products, axis=1, dtype=np.float32)
    return _sum_f32(products, 1, order, flush)


def _transcendental(op: str, x32: np.ndarray, rng, device: str) -> np.ndarray:
    """f32 `op` correctly rounded (from f64), then, on a GPU or TPU, moved by up to 2 f32 ulps."""
    with np.errstate(all="ignore"):
        y = UNARY[op](x32.astype(np.float64)).astype(np.float32)
    if device in ("tpu", "a100"):
        steps = rng.integers(-2, 3, y.shape)
        y = np.where(np.isfinite(y) & (y != 0), y + steps * np.spacing(np.abs(y)).astype(np.float32), y)
    return y.astype(np.float32)


def emulate(p: Program, device: str, order: str, seed: int = 0) -> list[np.ndarray]:
    """`p`'s outputs as `device` computes them (module docstring), sums and dots in `order`."""
    rng = np.random.default_rng(seed)
    excess = device in ("tpu", "a100")
    flush = device == "xla-cpu"  # FTZ and DAZ (DeviceProfile.flush_subnormals: XLA:CPU's MXCSR)
    values: dict[str, np.ndarray] = {}  # name -> the value held (f32 where excess precision keeps it)
    ops = p.by_name()
    fused_product = {}  # xla-cpu: an f32 multiply's exact product, for an add that consumes it

    def held(name: str) -> np.ndarray:
        """The value as stored in its type (what leaves a chain)."""
        return rounded(values[name], ops[name].dtype) if values[name].dtype != DTYPES[ops[name].dtype] else values[name]

    def result(x32: np.ndarray, dtype: str) -> np.ndarray:
        return x32.astype(np.float32) if excess and dtype != "f32" else rounded(x32, dtype)

    with np.errstate(all="ignore"):
        for o in p.ops:
            xs = [values[n] for n in o.operands]
            if o.kind == "param":
                values[o.name] = p.inputs[o.attr["index"]]
            elif o.kind == "unary":
                x = xs[0].astype(np.float32)
                if o.attr["op"] in TRANSCENDENTAL:  # (negate and abs: sign bits, never flushed)
                    y = _transcendental(o.attr["op"], ftz(xs[0], flush).astype(np.float32), rng, device)
                    values[o.name] = result(ftz(y, flush), o.dtype)
                else:
                    values[o.name] = result(UNARY[o.attr["op"]](x), o.dtype)
            elif o.kind == "binary":
                a, b = (ftz(x, flush).astype(np.float64) for x in xs)
                if device == "xla-cpu" and o.dtype == "f32" and o.attr["op"] in ("add", "subtract"):
                    a = fused_product.get(o.operands[0], a)  # FMA: the product unrounded
                    b = fused_product.get(o.operands[1], b)
                if device == "xla-cpu" and o.dtype != "bf16" and stays_divide(ops, o.name):
                    a, b = divide_of_divides(ops, values, o, flush)  # XLA's rewrite: the products in the type
                exps = [
                    ops[n].operands[0]
                    for n in o.operands
                    if ops[n].kind == "unary" and ops[n].attr["op"] == "exponential"
                ]
                if device == "xla-cpu" and o.dtype != "bf16" and o.attr["op"] == "divide" and len(exps) == 2:
                    # XLA's HandleDivide: exp(A) / exp(B) => exp(A - B), the difference rounded to the type
                    d = [ftz(values[n], flush).astype(np.float64) for n in exps]
                    d32 = ftz(rounded(d[0] - d[1], o.dtype), flush).astype(np.float32)
                    values[o.name] = result(ftz(_transcendental("exponential", d32, rng, device), flush), o.dtype)
                    continue
                if device == "xla-cpu" and o.attr["op"] == "divide" and ops[o.operands[1]].kind == "broadcast":
                    # XLA's algebraic simplifier: x * broadcast(1 / m), the reciprocal in f32 (rounded to f16 for f16)
                    reciprocal = ftz(np.float32(1) / b.astype(np.float32), flush)
                    exact = a * (reciprocal.astype(np.float16) if o.dtype == "f16" else reciprocal).astype(np.float64)
                else:
                    exact = BINARY[o.attr["op"]](a, b)
                if o.attr["op"] == "multiply" and o.dtype == "f32":
                    fused_product[o.name] = exact
                if flush:  # (f32 arithmetic: its result flushed before a 16-bit type's rounding)
                    exact = ftz(exact.astype(np.float32))
                values[o.name] = result(exact.astype(np.float32) if o.dtype != "f32" else exact, o.dtype)
            elif o.kind == "select":
                a, b, x, y = xs
                cmp = {"GT": np.greater, "LT": np.less, "GE": np.greater_equal}[o.attr["direction"]]
                values[o.name] = np.where(cmp(ftz(a, flush).astype(np.float32), ftz(b, flush).astype(np.float32)), x, y)
            elif o.kind == "convert":
                values[o.name] = rounded(xs[0].astype(np.float32), o.dtype)
            elif o.kind == "reduce":
                x = held(o.operands[0]) if not excess else xs[0]
                if o.attr["reducer"] == "maximum":
                    values[o.name] = np.max(ftz(x, flush), axis=o.attr["dim"]).astype(x.dtype)
                elif device == "xla-cpu" and o.dtype != "f32":
                    values[o.name] = _sum_per_step(x, o.attr["dim"], o.dtype, flush=flush)
                else:
                    x32 = x.astype(np.float32)
                    s = _sum_f32(x32, o.attr["dim"], "lanes" if device == "xla-cpu" else order, flush)
                    values[o.name] = rounded(s, o.dtype)
            elif o.kind == "broadcast":
                x = xs[0]
                values[o.name] = np.broadcast_to(np.expand_dims(x, 1 - o.attr["dim"]), o.shape).copy()
            elif o.kind == "transpose":
                values[o.name] = xs[0].T.copy()
            elif o.kind == "dot":
                a, b = held(o.operands[0]), held(o.operands[1])
                values[o.name] = rounded(_dot(device, o, a, b, order), o.dtype)
    return [held(n) for n in p.outputs]


# ---- the search -----------------------------------------------------------------------------------------------

PLANTED = 4.0  # a planted change: this many times the element's allowance's base, max(bound, ulp)


@dataclass
class Finding:
    """A false alarm (`kind` "false alarm": a device's correct result judged not consistent) or a missed change
    ("missed": a result with one element moved PLANTED x its bound judged consistent)."""

    seed: int
    kind: str
    device: str
    candidate: str
    output: int
    index: tuple
    ratio: float | None
    detail: str = ""


def candidates(p: Program, rng) -> dict[str, tuple[str, list]]:
    """name -> (the device whose arithmetic made it, its outputs): each device's emulation in two orders of
    its sums (reference: all four)."""
    algorithms = {o.attr.get("algorithm") for o in p.ops}
    out = {}
    for device in DEVICES:
        if device in RUNS and not algorithms - {None} <= RUNS[device]:
            continue  # the device does not run the program's algorithm (the profile refuses it)
        orders = ORDERS if device == "reference" else rng.choice(ORDERS, 2, replace=False)
        for order in orders:
            out[f"{device}/{order}"] = (device, emulate(p, device, str(order), int(rng.integers(1 << 30))))
    return out


def ulp(x: np.ndarray, dtype) -> np.ndarray:
    """The spacing of `dtype` at |x| (its smallest subnormal below the normals)."""
    f = ml_dtypes.finfo(dtype)
    mag = np.maximum(np.abs(np.asarray(x, np.float64)), float(f.tiny))
    return np.exp2(np.floor(np.log2(mag)) - f.nmant)


def planted(outputs: list, shadow: list, bounds, decided, rng) -> list[tuple[int, tuple, list]]:
    """Per output, `outputs` with one judged element (the largest bound's, and a random one) moved PLANTED x
    max(its bound, an ulp) away from the exact value: (output, index, the changed outputs)."""
    out = []
    for i, (c, s, b, d) in enumerate(zip(outputs, shadow, bounds, decided)):
        if b is None:
            continue
        c, s = np.asarray(c), np.asarray(s, np.float64)
        judged = ~np.asarray(d) & np.isfinite(b) & np.isfinite(s) & np.isfinite(c.astype(np.float64))
        step = PLANTED * np.maximum(b, ulp(s, c.dtype))
        judged &= np.abs(s) + step < float(ml_dtypes.finfo(c.dtype).max)
        flat = np.flatnonzero(judged)
        if not flat.size:
            continue
        for k in {int(flat[np.argmax(np.ravel(b)[flat])]), int(rng.choice(flat))}:
            index = np.unravel_index(k, c.shape)
            sign = 1.0 if c[index].astype(np.float64) >= s[index] else -1.0
            moved = [np.array(o, copy=True) for o in outputs]
            moved[i][index] = np.asarray(s[index] + sign * step[index]).astype(c.dtype)
            out.append((i, tuple(int(j) for j in index), moved))
    return out


def search(seed: int, with_xla: bool = True) -> list[Finding]:
    """Judge every emulation of program `seed` (and XLA:CPU's result) under its device's arithmetic: each must
    be consistent, and each with one element moved PLANTED x its bound must not be."""
    return judge_program(generate(seed), with_xla)


def judge_program(p: Program, with_xla: bool = True) -> list[Finding]:
    """search's judgement of a program `p` (its seed: the emulations' and planted changes' draws)."""
    import hloexec
    from hloexec.tools.numerics import baseline_executable, flatten, judge_run, xla_cpu_arithmetic
    from hloexec.tools.verdict import judge

    seed = p.seed
    rng = np.random.default_rng(seed + 1)
    made = candidates(p, rng)
    if with_xla:
        from hloexec.tools.xla_cpu import XlaCpuError, run_on_xla_cpu

        try:
            made["XLA:CPU"] = ("xla-cpu", run_on_xla_cpu(p.text(), p.inputs))
        except XlaCpuError as e:  # XLA:CPU's DotThunk runs no bf16 x bf16 -> f32 dot: nothing of its to judge
            if "Unsupported element type for DotThunk" not in str(e):
                raise
    exe = hloexec.load(p.text())
    xla = xla_cpu_arithmetic()
    profiles = sorted({d for d, _ in made.values() if d != "xla-cpu"} | {"reference"})
    known = {n: xla for n, (d, _) in made.items() if d == "xla-cpu"}
    verdict, run = judge_run(exe, p.inputs, {n: o for n, (_, o) in made.items()}, devices=profiles, known=known)
    by_device = verdict.by_device or {verdict.device: verdict}
    baseline = flatten(baseline_executable(exe).run(*p.inputs))
    findings = []
    for name, (device, outs) in made.items():
        judged_by = xla.name if device == "xla-cpu" else device
        v = by_device["reference" if device == "xla-cpu" else device]
        for o in v.outputs:
            c = next(c for c in o.candidates if c.name == name)
            if not c.consistent:
                w = c.worst[0] if c.worst else None
                nan_only = name == "XLA:CPU" and all("non-finite" in r for r in c.reasons)
                findings.append(
                    Finding(
                        seed,
                        "XLA:CPU's NaN" if nan_only else "false alarm",
                        judged_by,
                        name,
                        o.index,
                        w.index if w else (),
                        w.ratio if w else None,
                        "; ".join(c.reasons),
                    )
                )
        if any(f.candidate == name for f in findings):
            continue
        b = run.bounds[judged_by]
        for i, index, moved in planted(outs, run.shadow, b.bounds, b.decided, rng):
            pv = judge(run.shadow, baseline, {name: moved}, bounds=b)
            if pv.consistent(name):
                findings.append(
                    Finding(
                        seed,
                        "missed",
                        judged_by,
                        name,
                        i,
                        index,
                        None,
                        f"moved {PLANTED:g}x its bound, judged consistent",
                    )
                )
    return findings


if __name__ == "__main__":  # a campaign: python tests/sound_programs.py FIRST COUNT
    import sys
    import time

    first, count = int(sys.argv[1]), int(sys.argv[2])
    for s in range(first, first + count):
        t0 = time.time()
        try:
            found = search(s)
        except Exception as e:  # a campaign goes on; the error is the finding
            found = [Finding(s, "error", "", "", -1, (), None, f"{type(e).__name__}: {e}"[:300])]
        print(s, generate(s).notes, f"{time.time() - t0:.1f}s", flush=True)
        for f in found:
            print("  ", f, flush=True)
