"""Calls whose name fixes their meaning: XLA's xla_builder.* composites and Transformer Engine's softmax.

`xla_builder.<lib>.<Function>` is what XLA's builder library emits for one of its functions (math.h,
matrix.h, tridiagonal.h, prng.h) when asked to keep it as a call; XLA's `test-only-xla-builder` pass
expands it into that function's HLO in a called computation. The rule here: a call that carries that
computation (`called_computations`) runs it -- the body is the meaning, bit for bit what XLA runs; a call
without one runs the function by its name, as below.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ..common import contig, is_low_float
from ..contraction import finish, to_compute
from ..rng import philox4x32
from .registry import PREFIXED_CALLS, backend_config, custom_call, field, target_of

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
XLA_BUILDER = "xla_builder."


def _body(inst):
    comps = inst.called.get("called_computations") or inst.called.get("to_apply")
    if isinstance(comps, list):
        comps = comps[0] if len(comps) == 1 else None
    return comps


def run_body(inst, ctx):
    """The call's value is its called computation's (checked against the call's shape)."""
    comp = _body(inst)
    root = comp.root.shape
    if root.to_text(False) != inst.shape.to_text(False):
        raise UnsupportedError(
            f"{target_of(inst)}: its body returns {root.to_text(False)}, the call {inst.shape.to_text(False)}", inst
        )
    return ctx.computation(comp)


def builder_call(name: str, **form):
    """Register the body-less meaning of xla_builder.<name>; a call carrying its body runs the body. `form`:
    the call's operands and result, as for custom_call."""

    def deco(prepare):
        def prepare_builder_call(inst, ctx):
            return run_body(inst, ctx) if _body(inst) is not None else prepare(inst, ctx)

        prepare_builder_call.__doc__ = prepare.__doc__
        custom_call(XLA_BUILDER + name, **form)(prepare_builder_call)
        return prepare

    return deco


def has_body(inst) -> bool:
    return _body(inst) is not None


PREFIXED_CALLS[XLA_BUILDER] = (has_body, run_body)  # any other xla_builder.* call that carries its body


def _work(dtype):
    """The type a function is evaluated in: f32 for f16/bf16/fp8 (rounded once after), else the type."""
    dtype = np.dtype(dtype)
    return _F32 if is_low_float(dtype) else dtype


def _elementwise(inst, fn, arity: int):
    """kernel(*xs) -> fn(*xs in the compute type), rounded once to the result type."""
    if len(inst.operands) != arity or inst.shape.is_tuple:
        raise UnsupportedError(f"{target_of(inst)} takes {arity} array operand(s)", inst)
    out_dtype = inst.shape.dtype
    work = _work(out_dtype)

    def kernel(*xs):
        with np.errstate(all="ignore"):
            r = fn(*(to_compute(np.asarray(x), work) for x in xs))
        return finish(np.broadcast_to(r, inst.shape.dims), out_dtype)

    return kernel


def _special(name, via_f64=True):
    """A scipy.special function evaluated in f64 (complex128 for complex) and rounded to the type."""

    def fn(*xs):
        from scipy import special

        f = getattr(special, name)
        wide = [x.astype(np.complex128 if x.dtype.kind == "c" else _F64) for x in xs]
        return f(*wide).astype(xs[0].dtype) if via_f64 else f(*xs)

    return fn


_UNARY = {
    "Acos": np.arccos,
    "Asin": np.arcsin,
    "Atan": np.arctan,
    "Cosh": np.cosh,
    "Asinh": np.arcsinh,
    "Acosh": np.arccosh,
}


def _math_unary(name):
    def prepare(inst, ctx):
        return _elementwise(inst, _UNARY[name], 1)

    prepare.__doc__ = (
        f"xla_builder.math.{name} without a body: numpy's {_UNARY[name].__name__} in the type "
        "(f32 for f16/bf16, complex for complex), rounded once; XLA's own formula differs in the "
        "last bits (run the body when the call carries it)."
    )
    return prepare


def polygamma(n, x):
    """polygamma(n, x) for a non-negative integer n (digamma for 0), NaN for any other n, as XLA's Polygamma."""
    from scipy import special

    n64, x64 = n.astype(_F64), x.astype(_F64)
    ok = (n64 >= 0) & (n64 == np.floor(n64))
    r = special.polygamma(np.where(ok, n64, 0).astype(np.int64), x64)
    return np.where(ok, r, np.nan).astype(x.dtype)


def igamma_grad_a(a, x):
    """d/da of the regularized lower incomplete gamma P(a, x), in f64: Richardson-extrapolated central
    differences of scipy's gammainc (relative error ~1e-10: f32 results are exact to rounding)."""
    from scipy import special

    a64, x64 = np.broadcast_arrays(a.astype(_F64), x.astype(_F64))
    h = 1e-3 * np.maximum(np.minimum(a64, 1.0), 1e-6)

    def d(step):
        return (special.gammainc(a64 + step, x64) - special.gammainc(a64 - step, x64)) / (2 * step)

    return ((4 * d(h / 2) - d(h)) / 3).astype(a.dtype)


def random_gamma_grad(a, x):
    """The derivative of a Gamma(a) sample x with respect to a (implicit reparameterization):
    -(dP(a, x)/da) / (dP(a, x)/dx), dP/dx the Gamma(a) density at x."""
    from scipy import special

    a64, x64 = a.astype(_F64), x.astype(_F64)
    density = np.exp((a64 - 1) * np.log(x64) - x64 - special.gammaln(a64))
    return (-igamma_grad_a(a64, x64) / density).astype(a.dtype)


def next_after(x, y):
    """The next representable value after x toward y, by XLA's bit algorithm (NextAfter in math.cc): NaN if
    either is NaN, y if they are equal, the smallest denormal with y's sign from a zero x, else x's bits
    one step up or down in magnitude; on types without -0 (fnuz) a step down from the smallest negative
    denormal gives 0, not the NaN pattern."""
    dt = x.dtype
    bits = np.dtype(f"u{dt.itemsize}")
    width = dt.itemsize * 8
    ux, uy = contig(x).view(bits), contig(y).view(bits)
    sign = bits.type(1 << (width - 1))
    with np.errstate(invalid="ignore"):
        nan = np.isnan(x.astype(_F32)) | np.isnan(y.astype(_F32))
    nan_bits = np.array(np.nan, _F32).astype(dt).view(bits)
    no_negative_zero = np.array(-0.0, _F32).astype(dt).view(bits) == 0
    ax, ay = ux & ~sign, uy & ~sign
    sx, sy = ux & sign, uy & sign
    with np.errstate(over="ignore"):
        step = np.where((ax > ay) | (sx != sy), bits.type(-1 % (1 << width)), bits.type(1))
        r = (ux + step).astype(bits)
    if no_negative_zero:
        r = np.where((ux == (sign | bits.type(1))) & (sy == 0), bits.type(0), r)
    r = np.where(ax == 0, np.where(ay == 0, uy, sy | bits.type(1)), r)
    r = np.where(ux == uy, uy, r)
    r = np.where(nan, nan_bits, r).astype(bits)
    return r.view(dt)


@builder_call("math.NextAfter", operands=2, returns="array")
def xla_next_after(inst, ctx):
    """xla_builder.math.NextAfter(from, to) without a body: XLA's bit algorithm (next_after), exact in every
    float type."""
    if len(inst.operands) != 2:
        raise UnsupportedError("NextAfter takes (from, to)", inst)
    out_dtype = inst.shape.dtype

    def kernel(x, y):
        x, y = np.broadcast_arrays(np.asarray(x, out_dtype), np.asarray(y, out_dtype))
        return contig(next_after(x, y))

    return kernel


_MATH2 = {
    "Polygamma": (
        polygamma,
        2,
        "polygamma(n, x) for a non-negative integer n (NaN otherwise), scipy in f64, rounded once",
    ),
    "IgammaGradA": (
        igamma_grad_a,
        2,
        "d/da of the regularized lower incomplete gamma P(a, x): Richardson-"
        "extrapolated central differences of scipy's gammainc in f64 (~1e-10 "
        "relative), rounded once",
    ),
    "RandomGammaGrad": (
        random_gamma_grad,
        2,
        "d(sample)/d(alpha) of a Gamma(alpha) sample x: -(dP/da) / (dP/dx), in f64, rounded once",
    ),
    "RegularizedIncompleteBeta": (
        _special("betainc"),
        3,
        "I_x(a, b) with operands (a, b, x): scipy's betainc in f64, rounded once",
    ),
}


def _math_special(name):
    fn, arity, notes = _MATH2[name]

    def prepare(inst, ctx):
        return _elementwise(inst, fn, arity)

    prepare.__doc__ = f"xla_builder.math.{name} without a body: {notes}."
    return prepare


# -- matrix, tridiagonal, prng -------------------------------------------------------------------------
def einsum(config: str, operands, out_dtype):
    """XLA's Einsum config on 1 or 2 operands (numpy's subscripts; an output label repeated puts the values
    on that diagonal with zeros elsewhere), computed in the compute type and rounded once."""
    inputs, out = config.replace(" ", "").split("->")
    unique = "".join(dict.fromkeys(out))
    work = _work(out_dtype) if np.dtype(out_dtype).kind != "c" else np.dtype(out_dtype)
    r = np.einsum(f"{inputs}->{unique}", *(to_compute(np.asarray(o), work) for o in operands))
    if unique != out:  # "i,ij->ii": embed along the repeated labels' diagonal
        full = np.zeros([r.shape[unique.index(c)] for c in out], r.dtype)
        grid = np.indices(r.shape)
        full[tuple(grid[unique.index(c)] for c in out)] = r
        r = full
    return finish(r, out_dtype)


@builder_call("matrix.Einsum", operands=range(1, 3), returns="array")
def xla_einsum(inst, ctx):
    """xla_builder.matrix.Einsum(x[, y]) without a body: the einsum of backend_config (e.g. "ij,jk->ik";
    repeated input labels take diagonals, a repeated output label builds a diagonal matrix), accumulated in
    f32 for f16/bf16 and rounded once (XLA's dot and reduce order differ in the last bits)."""
    config = inst.attr("backend_config")
    if not isinstance(config, str) or "->" not in config or len(inst.operands) not in (1, 2):
        raise UnsupportedError(f"Einsum whose backend_config {config!r} is not an einsum config", inst)
    out_dtype = inst.shape.dtype

    def kernel(*xs):
        return einsum(config, xs, out_dtype)

    return kernel


@builder_call("matrix.GetMatrixDiagonalViaGather", operands=1, returns="array")
def xla_matrix_diagonal(inst, ctx):
    """xla_builder.matrix.GetMatrixDiagonalViaGather(x) without a body: the main diagonal of the last two
    dims, [..., min(m, n)]."""
    src = inst.operands[0].shape
    if src.rank < 2:
        raise UnsupportedError(f"GetMatrixDiagonalViaGather of {src.to_text(False)}: it takes matrices", inst)
    want = (*src.dims[:-2], min(src.dims[-2:]))
    if tuple(inst.shape.dims) != want:
        raise UnsupportedError(
            f"GetMatrixDiagonalViaGather of {src.to_text(False)} returns "
            f"{src.element_type.name}[{','.join(map(str, want))}], the call says "
            f"{inst.shape.to_text(False)}",
            inst,
        )

    def kernel(x):
        return contig(np.diagonal(x, axis1=-2, axis2=-1))

    return kernel


def thomas(lower, main, upper, rhs):
    """XLA's Thomas algorithm (tridiagonal.cc), equations along the last dim: diagonals [..., 1, M] (lower[0]
    and upper[M-1] unused), rhs [..., K, M] -> x [..., K, M], the same operations in the same order in the
    type (f16/bf16 round after each)."""
    m = rhs.shape[-1]
    main_e = np.zeros_like(main)
    rhs_e = np.zeros_like(rhs)
    x = np.zeros_like(rhs)
    main_e[..., 0] = main[..., 0]
    rhs_e[..., 0] = rhs[..., 0]
    with np.errstate(all="ignore"):
        for i in range(1, m):
            w = lower[..., i] / main_e[..., i - 1]
            main_e[..., i] = main[..., i] - w * upper[..., i - 1]
            rhs_e[..., i] = rhs[..., i] - w * rhs_e[..., i - 1]
        x[..., m - 1] = rhs_e[..., m - 1] / main_e[..., m - 1]
        for i in range(m - 2, -1, -1):
            x[..., i] = (rhs_e[..., i] - upper[..., i] * x[..., i + 1]) / main_e[..., i]
    return x


@builder_call("tridiagonal.TridiagonalSolver", operands=range(2, 5), returns="array")
def xla_tridiagonal_solver(inst, ctx):
    """xla_builder.tridiagonal.TridiagonalSolver without a body, XLA's Thomas algorithm (no pivoting): operands
    (diagonals [..., 3, M] = super, main, sub diagonal; rhs [..., M, K]) -> x [..., M, K], or (lower, main,
    upper [..., 1, M], rhs [..., K, M]) -> x [..., K, M]; computed in the type, op by op as XLA does."""
    n = len(inst.operands)
    if n not in (2, 4):
        raise UnsupportedError("TridiagonalSolver takes (diagonals, rhs) or (lower, main, upper, rhs)", inst)
    out_dtype = inst.shape.dtype

    def kernel(*xs):
        xs = [np.asarray(v, out_dtype) for v in xs]
        if n == 2:
            d, rhs = xs
            x = thomas(d[..., 2:3, :], d[..., 1:2, :], d[..., 0:1, :], np.swapaxes(rhs, -1, -2))
            return contig(np.swapaxes(x, -1, -2))
        return contig(thomas(*xs))

    return kernel


@builder_call("prng.ScramblePhiloxKey", operands=1, returns="array")
def xla_scramble_philox_key(inst, ctx):
    """xla_builder.prng.ScramblePhiloxKey(u64 key) without a body: XLA's ScramblePhiloxKey (prng.cc) on the key
    (low 32 bits, high 32 bits): Philox-4x32 (10 rounds) of the state (low, 0, high, 0) under the key
    (0x3ec8f720, 0x02461e29); the new key (words 0 and 1) as a u64, word 0 low. Exact."""
    out_dtype = inst.shape.dtype

    def kernel(key):
        key = np.asarray(key, np.uint64)
        lo, hi = (key & np.uint64(0xFFFFFFFF)).astype(np.uint32), (key >> np.uint64(32)).astype(np.uint32)
        zero = np.zeros_like(lo)
        s0, s1, _, _ = philox4x32(lo, zero, hi, zero, 0x3EC8F720, 0x02461E29)
        return contig((s0.astype(np.uint64) | (s1.astype(np.uint64) << np.uint64(32))).astype(out_dtype))

    return kernel


def _register_math():
    for name in _UNARY:
        builder_call(f"math.{name}")(_math_unary(name))
    for name in _MATH2:
        builder_call(f"math.{name}")(_math_special(name))


_register_math()


# -- Transformer Engine -----------------------------------------------------------------------------------
def _scale(inst):
    return float(field(backend_config(inst), "scale_factor", 1.0))


def _softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


@custom_call("te_scaled_softmax_forward_ffi", operands=1, returns="array")
def te_scaled_softmax_forward(inst, ctx):
    """Transformer Engine's scaled softmax: softmax(scale_factor * x) over the last dim, in f32, rounded once
    to the input type."""
    scale, out_dtype = _scale(inst), inst.shape.dtype

    def kernel(x):
        return finish(_softmax(to_compute(x, _F32) * np.float32(scale)), out_dtype)

    return kernel


@custom_call("te_scaled_softmax_backward_ffi", operands=2, returns="array")
def te_scaled_softmax_backward(inst, ctx):
    """Its gradient: operands (dy, y = the forward's output) -> scale_factor * y * (dy - sum(dy * y)) over the
    last dim, in f32, rounded once."""
    scale, out_dtype = _scale(inst), inst.shape.dtype

    def kernel(dy, y):
        dy32, y32 = to_compute(dy, _F32), to_compute(y, _F32)
        return finish(np.float32(scale) * y32 * (dy32 - np.sum(dy32 * y32, axis=-1, keepdims=True)), out_dtype)

    return kernel


@custom_call("te_scaled_masked_softmax_forward_ffi", operands=2, returns="array")
def te_scaled_masked_softmax_forward(inst, ctx):
    """Transformer Engine's masked scaled softmax: operands (x [b, h, q, k], mask [b or 1, 1, q, k]);
    softmax over the last dim of scale_factor * x with masked positions (mask != 0) at -10000, in f32."""
    scale, out_dtype = _scale(inst), inst.shape.dtype

    def kernel(x, mask):
        z = to_compute(x, _F32) * np.float32(scale)
        z = np.where(np.asarray(mask) != 0, np.float32(-10000.0), z)
        return finish(_softmax(z), out_dtype)

    return kernel


@custom_call("te_scaled_upper_triang_masked_softmax_forward_ffi", operands=1, returns="array")
def te_scaled_causal_softmax_forward(inst, ctx):
    """Transformer Engine's causal scaled softmax: softmax over the last dim of scale_factor * x with the
    positions above the diagonal (key > query) excluded, in f32, rounded once."""
    scale, out_dtype = _scale(inst), inst.shape.dtype

    def kernel(x):
        z = to_compute(x, _F32) * np.float32(scale)
        q, k = z.shape[-2:]
        z = np.where(np.triu(np.ones((q, k), bool), 1), -np.inf, z)
        return finish(_softmax(z), out_dtype)

    return kernel


custom_call(
    "te_scaled_masked_softmax_backward_ffi",
    "te_scaled_upper_triang_masked_softmax_backward_ffi",
    operands=2,
    returns="array",
)(te_scaled_softmax_backward)


@custom_call("GetRngSeed", operands=0, returns="array")
def _get_rng_seed(inst, ctx):
    """`GetRngSeed`: the seed XLA:CPU hands a module for its rng expansions (implementation-defined there);
    hloexec gives a fixed 0, so runs are reproducible."""
    dims, dtype = inst.shape.dims, inst.shape.dtype
    return lambda: np.zeros(dims, dtype)  # made when it runs: after the run's memory check
