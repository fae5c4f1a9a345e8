"""The Numba helpers generated kernels call (`hloexec.kernels.fusion` imports `HELPERS` from here).

Kept apart from the snippets in `elementwise.py`, which are plain Python: deciding what to fuse and
generating a kernel's source must not import Numba; only compiling one does.
"""
from __future__ import annotations

import math  # noqa: F401  (used by generated code through HELPERS)

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .half import (bf16_to_f32, bitcast_f32_to_i32, bitcast_f32_to_u32, bitcast_f64_to_i64,  # noqa: F401
                   bitcast_f64_to_u64, bitcast_i32_to_f32, bitcast_i64_to_f64, bitcast_u32_to_f32,
                   bitcast_u64_to_f64, f16_to_f32, f32_to_bf16, f32_to_f16, f64_to_f16,
                   round_bf16, round_f16)

@njit(inline="always")
def fmax_nan(a, b):
    if a != a:
        return a
    if b != b:
        return b
    return a if a > b else b


@njit(inline="always")
def fmin_nan(a, b):
    if a != a:
        return a
    if b != b:
        return b
    return a if a < b else b


@njit(inline="always")
def fclamp_nan(lo, x, hi):
    if lo != lo:
        return lo
    if x != x:
        return x
    if hi != hi:
        return hi
    m = x if x > lo else lo
    return hi if hi < m else m


@njit(inline="always")
def fsign(x):
    if x != x:
        return x
    if x > 0:
        return 1.0
    if x < 0:
        return -1.0
    return x                       # +-0 keeps its sign (callers cast back to the compute type)


@njit(inline="always")
def round_afz(x):
    """Round half away from zero (C round)."""
    t = np.trunc(x)
    if abs(x - t) >= 0.5:
        t = t + (1.0 if x > 0 else -1.0)   # exact; callers cast back to the compute type
    return t


@njit(inline="always")
def sdiv(a, b, int_min):
    """Signed integer division truncating toward zero, with XLA's x/0 = -1 and MIN/-1 = MIN."""
    if b == 0:
        return -1
    if b == -1 and a == int_min:
        return a
    q = a // b
    if q < 0 and q * b != a:
        q += 1                     # floor -> trunc
    return q


@njit(inline="always")
def srem(a, b, int_min):
    """Signed remainder with the sign of the dividend (C %); x % 0 = x, MIN % -1 = 0."""
    if b == 0:
        return a
    if b == -1 and a == int_min:
        return a - a
    r = a % b
    if r != 0 and (r < 0) != (a < 0):
        r -= b                     # Python's % takes the sign of the divisor
    return r


@njit(inline="always")
def udiv(a, b, all_ones):
    if b == 0:
        return all_ones
    return a // b


@njit(inline="always")
def urem(a, b):
    if b == 0:
        return a
    return a % b


@njit(inline="always")
def ipow(a, b, one):
    """Integer power by squaring with wrap-around; a negative exponent gives 1 for a == 1, else 0."""
    if b < 0:
        return one if a == one else one - one
    acc = one
    base = a
    e = b
    while e > 0:
        if e & 1:
            acc = acc * base
        base = base * base
        e >>= 1
    return acc


@njit(inline="always")
def total_order_key32(x):
    """float32 -> int32 key whose integer order is IEEE totalOrder (-NaN < -inf < ... < -0 < +0 < ... < NaN)."""
    i = bitcast_f32_to_i32(x)
    if i < 0:
        i = np.int32(i ^ np.int32(0x7FFFFFFF))
    return i


@njit(inline="always")
def total_order_key64(x):
    i = bitcast_f64_to_i64(x)
    if i < 0:
        i = np.int64(i ^ np.int64(0x7FFFFFFFFFFFFFFF))
    return i


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
