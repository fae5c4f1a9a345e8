"""The Numba helpers generated kernels call (`hloexec.kernels.fusion` imports `HELPERS` from here).

Kept apart from the scalar-semantics table (`semantics.py`) and the snippets (`elementwise.py`), which are plain
Python: deciding what to fuse and generating a kernel's source must not import Numba; only compiling one does.
"""

from __future__ import annotations

import math  # used by generated code through HELPERS

import functools

import numpy as np
from llvmlite import ir
from numba import njit, types, vectorize
from numba.extending import intrinsic

from . import approximations, numpy_form, semantics

from .half import (
    _f64_to_f32_odd,
    bf16_to_f32,
    bitcast_f32_to_i32,
    bitcast_f32_to_u32,
    bitcast_f64_to_i64,
    bitcast_f64_to_u64,
    bitcast_i32_to_f32,
    bitcast_i64_to_f64,
    bitcast_u32_to_f32,
    bitcast_u64_to_f64,
    f16_to_f32,
    f16_to_f32_simd,
    f32_to_bf16,
    f32_to_f16,
    f64_to_f16,
    round_bf16,
    round_f16,
)


# The machine of the scalar-semantics table (kernels/semantics.py) for its primitives that are not one Numba
# expression: the table's definitions call them only where their preconditions hold.
# Written as selects (no early return), which LLVM vectorizes.
@njit(inline="always")
def fmax_nan(a, b):
    """IEEE 754-2019 maximum: a NaN operand (the first) if either is one, and +0 > -0."""
    r = a if a > b else b
    r = a + b if (a == 0) & (b == 0) else r  # +0 + -0 = +0
    r = b if b != b else r
    return a if a != a else r


@njit(inline="always")
def fmin_nan(a, b):
    """IEEE 754-2019 minimum: a NaN operand (the first) if either is one, and -0 < +0."""
    r = a if a < b else b
    r = -((-a) + (-b)) if (a == 0) & (b == 0) else r  # -(-0 + -(+0)) = -0
    r = b if b != b else r
    return a if a != a else r


@njit(inline="always")
def trunc_div(a, b):
    """Integer a / b rounded toward zero (b != 0, not INT_MIN / -1)."""
    q = a // b
    if q < 0 and q * b != a:
        q += 1  # floor -> trunc
    return q


@njit(inline="always")
def trunc_rem(a, b):
    """a - b * trunc_div(a, b): the sign of the dividend, as C's % (b != 0, not INT_MIN % -1)."""
    r = a % b
    if r != 0 and (r < 0) != (a < 0):
        r -= b  # Python's % takes the sign of the divisor
    return r


@njit(inline="always")
def int_pow(a, e, one):
    """a ** e (e >= 0) by squaring, wrapping in a's type (`one`: 1 of that type)."""
    acc = one
    base = a
    zero = one - one  # literals of the type: an int64 literal would turn uint64 values into float64
    while e > zero:
        if e & one:
            acc = acc * base
        base = base * base
        e >>= one
    return acc


def _total_order_key(bitcast, signed):
    """float -> same-width signed int key whose integer order is IEEE totalOrder
    (-NaN < -inf < ... < -0 < +0 < ... < NaN): negative floats get their magnitude bits flipped."""
    magnitude = signed(np.iinfo(signed).max)

    @njit(inline="always")
    def key(x):
        i = bitcast(x)
        return signed(i ^ magnitude) if i < 0 else i

    return key


total_order_key32 = _total_order_key(bitcast_f32_to_i32, np.int32)
total_order_key64 = _total_order_key(bitcast_f64_to_i64, np.int64)


def _int_intrinsic(name):
    @intrinsic
    def _op(typingctx, x):
        if not isinstance(x, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            if name == "ctpop":
                return builder.ctpop(args[0])
            return builder.ctlz(args[0], ir.Constant(ir.IntType(1), 0))

        return x(x), codegen

    return _op


popcount = _int_intrinsic("ctpop")
count_leading_zeros = _int_intrinsic("ctlz")


@intrinsic
def stack_array(typingctx, count, dtype):
    """A new 1-d array of `count` (a literal int) elements of `dtype` (np.float32, ...) on the stack: a row
    sum's partial sums and the chunk of values it adds (kernels/fusion.py `row_sum_in_lanes`). np.empty's
    memory comes from a call LLVM knows nothing of, so it might alias the operands: every add then loads and
    stores its lane in memory. A non-escaping alloca in the entry block aliases nothing, and the lanes,
    accessed as whole vectors (add_lanes) and at constant indices, are promoted to vector registers. Its life
    is the kernel's: call it only from the kernel's own body, never from a helper."""
    if not isinstance(count, types.IntegerLiteral) or not isinstance(dtype, types.NumberClass):
        return None
    n, element = count.literal_value, dtype.instance_type
    array_type = types.Array(element, 1, "C")

    def codegen(context, builder, sig, args):
        from numba.core import cgutils
        from numba.np.arrayobj import make_array, populate_array

        data = cgutils.alloca_once(builder, context.get_data_type(element), size=n)
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(element)))
        array = make_array(array_type)(context, builder)
        populate_array(
            array,
            data=data,
            shape=[context.get_constant(types.intp, n)],
            strides=[itemsize],
            itemsize=itemsize,
            meminfo=None,
        )
        return array._getvalue()

    return array_type(count, dtype), codegen


@intrinsic
def add_lanes(typingctx, lanes, values, start, count):
    """lanes[k] += values[start + k] for k < `count` (a literal int, a multiple of 32 bytes' elements): one
    vector add per 32 bytes, each lane's own add, so the same bits as the scalar loop. A row sum's lanes
    (stack_array) then stay vector registers whatever LLVM makes of the loop computing `values`: a loop over
    16 lanes it unrolls is left to the SLP vectorizer, which often keeps it scalar (bf16, f32 row sums)."""
    if not (
        isinstance(count, types.IntegerLiteral)
        and isinstance(lanes, types.Array)
        and isinstance(lanes.dtype, types.Float)
        and values == lanes
        and isinstance(start, types.Integer)
        and count.literal_value * lanes.dtype.bitwidth % 256 == 0
    ):
        return None
    n = count.literal_value

    def codegen(context, builder, sig, args):
        from numba.np.arrayobj import make_array

        element = context.get_data_type(lanes.dtype)
        width = 32 // context.get_abi_sizeof(element)
        vector = ir.VectorType(element, width).as_pointer()
        acc = make_array(lanes)(context, builder, args[0]).data
        src = make_array(values)(context, builder, args[1]).data
        first = context.cast(builder, args[2], start, types.intp)
        for k in range(0, n, width):
            at = ir.Constant(first.type, k)
            a = builder.bitcast(builder.gep(acc, [at]), vector)
            b = builder.bitcast(builder.gep(src, [builder.add(first, at)]), vector)
            builder.store(builder.fadd(builder.load(a, align=1), builder.load(b, align=1)), a, align=1)
        return context.get_dummy_value()

    return types.none(lanes, values, start, count), codegen


# -- transcendentals of float32 values, vectorizable ---------------------------------------------------------
# libm calls (expf, tanhf, ...) cost several ns an element and keep LLVM from vectorizing the whole loop.
# The `*_wide` functions take a float32 value (an f32, or an f16 / bf16 value held as float32) and return the
# result as a float64 within 2**-51 relative (measured), so that one rounding to the type is correct unless
# the exact value lies that close to a rounding boundary. They are straight-line code -- arithmetic, bit
# operations, and conditionals choosing between two computed values, which LLVM turns into selects -- so the
# loops calling them vectorize. Arguments are clamped where the float32 result no longer changes, which keeps
# every intermediate a normal float64; NaN passes the clamps and comes out as a quiet NaN.
def _ternary_intrinsic(name: str, numba_type, llvm_type):
    """A Numba function calling LLVM intrinsic `name` on three values of one float type."""

    @intrinsic
    def call(typingctx, a, b, c):
        if not (a == b == c == numba_type):
            return None

        def codegen(context, builder, sig, args):
            fn = builder.module.declare_intrinsic(name, [llvm_type], ir.FunctionType(llvm_type, [llvm_type] * 3))
            return builder.call(fn, args)

        return numba_type(a, b, c), codegen

    return call


# a * b + c, fused where the target has FMA (llvm.fmuladd: vectorizable, never a libm call)
_muladd = _ternary_intrinsic("llvm.fmuladd", types.float64, ir.DoubleType())
# a * b + c rounded once (llvm.fma: vfmadd on x86 with FMA, libm's fmaf elsewhere -- exact either way)
fma_f32 = _ternary_intrinsic("llvm.fma", types.float32, ir.FloatType())


@intrinsic
def rsqrt_estimate(typingctx, x):
    """x86's rsqrtss (llvm.x86.sse.rsqrt.ss): 1 / sqrt(x) to 12 bits, from the processor's own table."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        v4 = ir.VectorType(ir.FloatType(), 4)
        fn = builder.module.declare_intrinsic("llvm.x86.sse.rsqrt.ss", fnty=ir.FunctionType(v4, [v4]))
        first = ir.Constant(ir.IntType(32), 0)
        return builder.extract_element(
            builder.call(fn, [builder.insert_element(ir.Constant(v4, None), args[0], first)]), first
        )

    return types.float32(x), codegen


# The C library's f32 functions XLA:CPU calls (semantics.LIBM_F32): sinf, cosf, tanf, cbrtf, atan2f, powf
globals().update(
    {
        name: types.ExternalFunction(name, types.float32(*[types.float32] * semantics.arity(op)))
        for op, name in semantics.LIBM_F32.items()
    }
)


@functools.cache
def numpy_ufunc(name: str, arity: int = 1):
    """Helper `name` of `arity` float32 arguments (a primitive above, an xla_cpu_... approximation) as a numpy
    ufunc on float32 arrays."""
    helper = globals()[name] if name in globals() else __getattr__(name)
    if arity == 2:
        return vectorize(["float32(float32, float32)"])(lambda x, y: helper(x, y))
    return vectorize(["float32(float32)"])(lambda x: helper(x))


def _xla_cpu_approximation(opcode: str):
    """The Numba function of XLA:CPU's f32 approximation of `opcode` (approximations.XLA_CPU_APPROXIMATIONS)."""
    from .elementwise import COMPUTE, literal_src

    namespace = {
        name: globals()[name]
        for name in (
            "np",
            "fma_f32",
            "bitcast_f32_to_i32",
            "bitcast_i32_to_f32",
            "rsqrt_estimate",
            *semantics.LIBM_F32.values(),
        )
    }
    exec(approximations.approximation_src(opcode, "approximation", compute=COMPUTE, literal=literal_src), namespace)
    return njit(inline="always")(namespace["approximation"])


def __getattr__(name: str):
    """xla_cpu_exponential, xla_cpu_log, ... (elementwise.XLA_CPU_HELPERS), made at their first import: only the
    xla-cpu profile's kernels call them."""
    from .elementwise import XLA_CPU_HELPERS

    opcode = next((op for op, helper in XLA_CPU_HELPERS.items() if helper == name), None)
    if opcode is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    helper = globals()[name] = _xla_cpu_approximation(opcode)
    return helper


_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 rounded to 32 bits: k * _LN2_HI is exact for |k| < 2**20
_LN2_LO = 1.90821492927058770002e-10  # ln 2 - _LN2_HI
_ROUNDER = 6755399441055744.0  # 1.5 * 2**52: t + _ROUNDER rounds t (|t| < 2**51) to an integer
_SQRT_HALF_BITS = 0x3FE6A09E667F3BCD
_LOG1P_TINY = 2.0**-29
# expm1(r) = r + r**2 / 2 + r**3 * q(r) on |r| <= ln(2) / 2 (relative error 3e-17): q's coefficients,
# least squares on Chebyshev nodes.
_Q0, _Q1, _Q2 = 0.16666666666666544, 0.04166666666661841, 0.008333333333427463
_Q3, _Q4, _Q5 = 0.0013888888921118627, 0.0001984126962129609, 2.4801515611249967e-05
_Q6, _Q7, _Q8 = 2.75575058254051e-06, 2.7622509524322617e-07, 2.5019864946701324e-08
# log(m) = 2 s + s z P(z), s = (m - 1) / (m + 1), z = s**2 <= 0.0295 for m in [sqrt(1/2), sqrt(2))
# (relative error 2e-16): P's coefficients.
_P0, _P1, _P2 = 0.6666666666658528, 0.40000000052980766, 0.28571417037548613
_P3, _P4, _P5 = 0.22223377213896353, 0.18123486886451717, 0.16821490825018354


@njit(inline="always")
def _clamp(y, lo, hi):
    """y limited to [lo, hi]; NaN stays NaN."""
    y = hi if y > hi else y
    return lo if y < lo else y


@njit(inline="always")
def _exp_parts(y):
    """(2**k, expm1(r)) with y = k ln2 + r, |r| <= ln(2) / 2, for a float64 |y| <= 700 (2**k normal) or NaN."""
    t = _muladd(y, _LOG2E, _ROUNDER)
    k = t - _ROUNDER
    r = _muladd(-k, _LN2_LO, _muladd(-k, _LN2_HI, y))
    # t's low bits hold k: the exponent field of 2**k is k + 1023
    scale = bitcast_i64_to_f64((bitcast_f64_to_i64(t) + np.int64(1023)) << np.int64(52))
    q = _muladd(
        _muladd(
            _muladd(_muladd(_muladd(_muladd(_muladd(_muladd(_Q8, r, _Q7), r, _Q6), r, _Q5), r, _Q4), r, _Q3), r, _Q2),
            r,
            _Q1,
        ),
        r,
        _Q0,
    )
    return scale, _muladd(r * r, _muladd(r, q, 0.5), r)


@njit(inline="always")
def _expm1_f64(y):
    """expm1(y) for a float64 |y| <= 700 as 2**k expm1(r) + (2**k - 1): no cancellation."""
    scale, em1 = _exp_parts(y)
    return _muladd(scale, em1, scale - 1.0)


@njit(inline="always")
def exp_wide(x):
    """exp(x) for a float32 x (clamped to [-110, 110]: exp(-104) rounds to 0 in float32, exp(89) to inf)."""
    scale, em1 = _exp_parts(_clamp(np.float64(x), -110.0, 110.0))
    return _muladd(scale, em1, scale)


@njit(inline="always")
def expm1_wide(x):
    xd = np.float64(x)
    r = _expm1_f64(_clamp(xd, -110.0, 110.0))
    return xd if xd == 0.0 else r  # keeps -0


@njit(inline="always")
def tanh_wide(x):
    """tanh(x) = e / (e + 2), e = expm1(2x): no cancellation for either sign; +-1 in float64 from |x| = 20 on."""
    xd = np.float64(x)
    e = _expm1_f64(_clamp(xd + xd, -40.0, 40.0))
    r = e / (e + 2.0)
    return xd if xd == 0.0 else r  # keeps -0


@njit(inline="always")
def logistic_wide(x):
    """1 / (1 + exp(-x)) (-x clamped to [-110, 110]: 1 in float64 from x = 37 on, 0 in float32 below -104)."""
    scale, em1 = _exp_parts(_clamp(-np.float64(x), -110.0, 110.0))
    return 1.0 / (1.0 + _muladd(scale, em1, scale))


@njit(inline="always")
def _log_f64(u):
    """log(u) for a float64 u > 0 (normal), as e ln2 + log(m), u = 2**e m, m in [sqrt(1/2), sqrt(2))."""
    bits = bitcast_f64_to_i64(u)
    e = (bits - np.int64(_SQRT_HALF_BITS)) >> np.int64(52)
    f = bitcast_i64_to_f64(bits - (e << np.int64(52))) - 1.0  # exact
    s = f / (f + 2.0)
    z = s * s
    p = _muladd(_muladd(_muladd(_muladd(_muladd(_P5, z, _P4), z, _P3), z, _P2), z, _P1), z, _P0)
    ef = np.float64(e)
    return _muladd(ef, _LN2_HI, _muladd(s * z, p, s + s) + ef * _LN2_LO)


@njit(inline="always")
def _log_special(u, r):
    """r (log(u) for u in (0, inf)), or log's value at 0, inf, a negative u or NaN."""
    special = -np.inf if u == 0.0 else (u if u == np.inf else np.nan)
    return r if (u > 0.0 and u < np.inf) else special


@njit(inline="always")
def log_wide(x):
    xd = np.float64(x)
    return _log_special(xd, _log_f64(xd))


@njit(inline="always")
def log1p_wide(x):
    """log(1 + x): 1 + x is exact in float64 for a float32 x with |x| >= 2**-29 (up to 2**53, and beyond the
    rounding is negligible); below, log1p(x) = x - x**2 / 2 to float64 precision (and keeps -0)."""
    xd = np.float64(x)
    u = 1.0 + xd
    r = _log_special(u, _log_f64(u))
    return _muladd(-0.5 * xd, xd, xd) if abs(xd) < _LOG1P_TINY else r


@njit(inline="always")
def narrow_to_f16(x):
    """float64 -> the nearest f16 value (one rounding), as float32."""
    return f16_to_f32(f64_to_f16(x))


@njit(inline="always")
def narrow_to_bf16(x):
    """float64 -> the nearest bf16 value (one rounding: through float32 rounded to odd), as float32."""
    return round_bf16(_f64_to_f32_odd(x))


def _register_machine_ufuncs() -> None:
    """The numpy forms of the machine's primitives for the semantics table (numpy_form.MACHINE_UFUNCS), each made
    at its first call."""
    arities = {"rsqrt_estimate": 1, **{name: semantics.arity(op) for op, name in semantics.LIBM_F32.items()}}
    for name, n in arities.items():
        numpy_form.MACHINE_UFUNCS[name] = lambda *xs, name=name, n=n: numpy_ufunc(name, n)(*xs)


_register_machine_ufuncs()
