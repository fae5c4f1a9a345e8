"""f16 / bf16 <-> f32 conversions usable inside Numba-jitted code.

Kernels see f16 and bf16 arrays as uint16 views and compute in f32. f32 -> f16 is a Numba intrinsic
emitting LLVM `fptrunc` to `half` (on x86-64 with F16C vcvtps2ph): round-to-nearest-even, NaN / inf /
denormals handled by the hardware; f16 -> f32 is integer arithmetic (`f16_to_f32` says why), exact.
bf16 is the top half of an f32: widening is a shift; narrowing rounds to nearest-even on the bits and
turns NaN into the canonical quiet NaN with its sign -- bit-identical to `ml_dtypes.bfloat16` conversion.

Also here: `f64_to_f16` (one rounding, via round-to-odd f32), `f64_to_bf16` (through f32, as ml_dtypes) and the
bit-reinterpretation intrinsics `bitcast_*` used by bitcast-convert and total-order compare.

`to_f32` / `from_f32` convert whole arrays (any shape) for the op-by-op kernels, bit-identical to XLA:CPU's
convert. hloexec.ops calls them for arrays large enough to beat numpy's astype, and loads this module (and
Numba, ~0.5 s) for very large ones only (see ops/elementwise.py).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

_HALF = ir.HalfType()
_F32 = ir.FloatType()
_F64 = ir.DoubleType()
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


@intrinsic
def _f16_bits_to_f32(typingctx, bits):
    if not isinstance(bits, types.Integer) or bits.bitwidth != 16:
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], _HALF), _F32)

    return types.float32(bits), codegen


@intrinsic
def _f32_to_f16_bits(typingctx, value):
    if value != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], _HALF), _I16)

    return types.uint16(value), codegen


def _bitcast_intrinsic(src_ty, src_ir, dst_ty, dst_ir):
    @intrinsic
    def _cast(typingctx, value):
        if value != src_ty:
            return None

        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], dst_ir)

        return dst_ty(value), codegen

    return _cast


bitcast_f32_to_u32 = _bitcast_intrinsic(types.float32, _F32, types.uint32, _I32)
bitcast_u32_to_f32 = _bitcast_intrinsic(types.uint32, _I32, types.float32, _F32)
bitcast_f32_to_i32 = _bitcast_intrinsic(types.float32, _F32, types.int32, _I32)
bitcast_i32_to_f32 = _bitcast_intrinsic(types.int32, _I32, types.float32, _F32)
bitcast_f64_to_u64 = _bitcast_intrinsic(types.float64, _F64, types.uint64, _I64)
bitcast_u64_to_f64 = _bitcast_intrinsic(types.uint64, _I64, types.float64, _F64)
bitcast_f64_to_i64 = _bitcast_intrinsic(types.float64, _F64, types.int64, _I64)
bitcast_i64_to_f64 = _bitcast_intrinsic(types.int64, _I64, types.float64, _F64)


_HALF_TO_F32_SCALE = np.float32(2.0**112)  # f32 exponent bias 127 - f16 bias 15


@njit(inline="always")
def f16_to_f32(bits):
    """uint16 bit pattern of an IEEE half -> float32 (exact; a NaN keeps its payload and comes out quiet, as
    XLA:CPU's vcvtph2ps).

    In integer arithmetic: the half's exponent and mantissa shifted into an f32's place and scaled by
    2**112 (exact for normals and subnormals), inf / NaN given the f32 exponent (and a NaN the quiet bit),
    then the sign. An `fpext` from `half` (vcvtph2ps) loads its 16 bits with vpinsrw, which merges into
    whatever register it is given: in a loop LLVM does not vectorize (a row sum's lanes) that register is
    often the previous element's result, and every element then waits for the one before (LayerNorm
    backward's f16 row sums: 10x slower). This form has no such dependency and vectorizes there; in an
    elementwise loop it costs ~8% more than vcvtph2ps on 64 M elements (memory-bound either way) and a
    little more compile time."""
    b = np.uint32(np.uint16(bits))
    magnitude = np.uint32(b & np.uint32(0x7FFF))
    shifted = np.uint32(magnitude << np.uint32(13))
    finite = bitcast_u32_to_f32(shifted) * _HALF_TO_F32_SCALE
    quiet = np.uint32(np.uint32(magnitude > np.uint32(0x7C00)) << np.uint32(22))
    special = bitcast_u32_to_f32(np.uint32(shifted | np.uint32(0x7F800000) | quiet))
    value = special if magnitude >= np.uint32(0x7C00) else finite
    return bitcast_u32_to_f32(np.uint32(bitcast_f32_to_u32(value) | ((b & np.uint32(0x8000)) << np.uint32(16))))


@njit(inline="always")
def f16_to_f32_simd(bits):
    """f16_to_f32's value (the same bits) as an `fpext` from `half`, for loops LLVM vectorizes: there it is one
    vcvtph2ps per 8 elements where f16_to_f32's integer form is ~12 instructions, and the f16 row sums
    (kernels/fusion.py `row_sum_in_lanes`) are bound by that. Not for loops that stay scalar (f16_to_f32)."""
    return _f16_bits_to_f32(np.uint16(bits))


@njit(inline="always")
def f32_to_f16(x):
    """float32 -> uint16 bit pattern of the nearest half (ties to even)."""
    return _f32_to_f16_bits(np.float32(x))


@njit(inline="always")
def _f64_to_f32_odd(x):
    """float64 -> float32 rounded to odd (truncate, then set the last bit if inexact): a later
    round-to-nearest to a type with at least 2 fewer significant bits is then a single correct rounding."""
    t = np.float32(x)
    if np.float64(t) == x or x != x:
        return t
    b = bitcast_f32_to_u32(t)
    if abs(np.float64(t)) > abs(x):
        b = np.uint32(b - np.uint32(1))  # step toward zero (magnitude down; inf -> FLT_MAX)
    return bitcast_u32_to_f32(np.uint32(b | np.uint32(1)))


F32_TINY = 2.0**-126  # float32's smallest normal
_F32_SUBNORMAL_STEPS = 2.0**149  # float32's subnormals are multiples of 2^-149


@njit(inline="always")
def f64_to_f32(x):
    """float64 -> float32 as np.float32(x), bit for bit, without the x86 microcode assist a subnormal result takes
    (~25x a normal conversion): where |x| is below float32's normals its bits are made from the integer nearest
    |x| / 2^-149 (ties to even: the IEEE rounding; 2^23 is the smallest normal's bits) and its sign. No branch."""
    m = abs(x)
    low = m < F32_TINY  # (False for NaN)
    steps = np.int64(np.rint((m if low else 0.0) * _F32_SUBNORMAL_STEPS))  # (exact: a power of two)
    sign = np.uint32((bitcast_f64_to_u64(x) >> np.uint64(63)) << np.uint64(31))
    tiny = bitcast_u32_to_f32(np.uint32(np.uint32(steps) | sign))
    normal = np.float32(F32_TINY if low else x)  # (never a subnormal result: no assist in either arm)
    return tiny if low else normal


@njit(inline="always")
def f64_to_f16(x):
    """float64 -> uint16 half bits with a single rounding (as numpy's float64 -> float16)."""
    return _f32_to_f16_bits(_f64_to_f32_odd(np.float64(x)))


@njit(inline="always")
def bf16_to_f32(bits):
    """uint16 bit pattern of a bfloat16 -> float32 (exact)."""
    return bitcast_u32_to_f32(np.uint32(np.uint32(bits) << np.uint32(16)))


def sample_value(x):
    """An element of samples read where they are kept either way: bfloat16 bits (uint16) decoded to float32
    (exact), a float as it is. For compiled code: one kernel reads both, no float32 copy of the bits first."""
    return bf16_to_f32(x) if isinstance(x, np.uint16) else x


@overload(sample_value, inline="always")
def _sample_value(x):
    if isinstance(x, types.Integer):
        return lambda x: bf16_to_f32(x)
    return lambda x: x


@njit(inline="always")
def f32_to_bf16(x):
    """float32 -> uint16 bfloat16 bits: round to nearest even; NaN stays NaN (quieted), as ml_dtypes."""
    u = bitcast_f32_to_u32(np.float32(x))
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):  # NaN -> sign | canonical quiet NaN
        return np.uint16(((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0))
    lsb = (u >> np.uint32(16)) & np.uint32(1)
    return np.uint16((u + np.uint32(0x7FFF) + lsb) >> np.uint32(16))


@njit(inline="always")
def f64_to_bf16(x):
    """float64 -> bfloat16 bits through float32 (two roundings), as ml_dtypes and XLA's emitter do."""
    return f32_to_bf16(np.float32(x))


@njit(inline="always")
def round_f16(x):
    """float32 -> nearest half value, as float32 (the per-op rounding of f16 math done in f32)."""
    return _f16_bits_to_f32(_f32_to_f16_bits(np.float32(x)))


@njit(inline="always")
def round_bf16(x):
    """float32 -> nearest bfloat16 value, as float32."""
    return bf16_to_f32(f32_to_bf16(x))


# -- array helpers (used by tests and callers that want whole-array conversions) -------------------------
@njit(cache=True)
def f16_array_to_f32(bits, out):
    for i in range(bits.size):
        out[i] = f16_to_f32(bits[i])


@njit(cache=True)
def f32_array_to_f16(x, out):
    for i in range(x.size):
        out[i] = f32_to_f16(x[i])


@njit(cache=True, nogil=True)
def bf16_array_to_f32(bits, out):
    for i in range(bits.size):
        out[i] = bf16_to_f32(bits[i])


@njit(cache=True)
def f32_array_to_bf16(x, out):
    for i in range(x.size):
        out[i] = f32_to_bf16(x[i])


@njit(cache=True)
def f64_array_to_f16(x, out):
    for i in range(x.size):
        out[i] = f64_to_f16(x[i])


@njit(cache=True)
def f64_array_to_bf16(x, out):
    for i in range(x.size):
        out[i] = f64_to_bf16(x[i])


@njit(cache=True)
def f64_array_to_f16_through_f32(x, out):
    """XLA:CPU's f64 -> f16 convert: rounded to f32, then to f16 (two roundings, unlike `f64_to_f16`), and a
    NaN becomes its sign | the canonical quiet NaN (measured against XLA:CPU)."""
    for i in range(x.size):
        v = x[i]
        if v != v:
            out[i] = np.uint16(((bitcast_f64_to_u64(v) >> np.uint64(48)) & np.uint64(0x8000)) | np.uint64(0x7E00))
        else:
            out[i] = f32_to_f16(np.float32(v))


# -- whole-array conversions of the op-by-op kernels --------------------------------------------------------
_F16_DT = np.dtype(np.float16)
_F32_DT = np.dtype(np.float32)
_F64_DT = np.dtype(np.float64)
_BF16_DT = np.dtype(ml_dtypes.bfloat16)
_TO_F32 = {_F16_DT: f16_array_to_f32, _BF16_DT: bf16_array_to_f32}
_FROM_WIDE = {
    (_F32_DT, _F16_DT): f32_array_to_f16,
    (_F32_DT, _BF16_DT): f32_array_to_bf16,
    (_F64_DT, _F16_DT): f64_array_to_f16_through_f32,
    (_F64_DT, _BF16_DT): f64_array_to_bf16,
}


def _dense(x: np.ndarray):
    """(x as a C-contiguous array, the axes permutation giving x back or None): a transposed or F-ordered x is
    used in place, as astype's order="K" does; other strided arrays are copied in C order."""
    if x.flags.c_contiguous:
        return x, None
    axes = sorted(range(x.ndim), key=lambda d: -x.strides[d])
    in_memory_order = x.transpose(axes)
    if in_memory_order.flags.c_contiguous:
        return in_memory_order, np.argsort(axes)
    return np.ascontiguousarray(x), None


def to_f32(x: np.ndarray) -> np.ndarray:
    """An f16 / bf16 array of any shape and strides as a new f32 array (x's memory order if x is dense, else C
    order), as XLA:CPU converts: exact; f16 signaling NaNs come out quiet with their payload (vcvtph2ps;
    numpy's astype keeps them signaling), bf16 ones unchanged (a shift, as ml_dtypes)."""
    dense, back = _dense(x)
    out = np.empty(dense.shape, _F32_DT)
    _TO_F32[x.dtype](dense.reshape(-1).view(np.uint16), out.reshape(-1))
    return out if back is None else out.transpose(back)


def from_f32(x: np.ndarray, dtype) -> np.ndarray:
    """An f32 or f64 array of any shape and strides rounded to f16 / bf16 (nearest even) as a new array (x's
    memory order if x is dense, else C order), as XLA:CPU converts. f32 -> f16: signaling NaNs come out
    quiet, payload truncated (vcvtps2ph; numpy keeps them signaling); f32 -> bf16: NaN -> sign | canonical
    quiet NaN (as ml_dtypes). f64 goes through f32 (two roundings), and f64 NaN -> f16 is sign | canonical
    quiet NaN."""
    dtype = np.dtype(dtype)
    dense, back = _dense(x)
    out = np.empty(dense.shape, np.uint16)
    _FROM_WIDE[x.dtype, dtype](dense.reshape(-1), out.reshape(-1))
    out = out.view(dtype)
    return out if back is None else out.transpose(back)
